"""Google BigQuery destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.bigquery.capabilities import CAPABILITIES
from eventspark.destinations.bigquery.configuration import BigQueryDestination
from eventspark.destinations.bigquery.dialect import DIALECT

DESTINATION = DestinationType(
    name="bigquery",
    config=BigQueryDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.bigquery.load:build",
    extra="bigquery",
    driver="google.cloud.bigquery",
)
