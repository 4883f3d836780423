"""PostgreSQL destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.postgres.capabilities import CAPABILITIES
from eventspark.destinations.postgres.configuration import PostgresDestination
from eventspark.destinations.postgres.dialect import DIALECT

DESTINATION = DestinationType(
    name="postgres",
    config=PostgresDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.postgres.load:build",
    extra="postgres",
    driver="psycopg",
)
