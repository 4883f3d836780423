"""Amazon Redshift destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.redshift.capabilities import CAPABILITIES
from eventspark.destinations.redshift.configuration import RedshiftDestination
from eventspark.destinations.redshift.dialect import DIALECT

DESTINATION = DestinationType(
    name="redshift",
    config=RedshiftDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.redshift.load:build",
    extra="redshift",
    driver="psycopg",
)
