"""Snowflake destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.snowflake.capabilities import CAPABILITIES
from eventspark.destinations.snowflake.configuration import SnowflakeDestination
from eventspark.destinations.snowflake.dialect import DIALECT

DESTINATION = DestinationType(
    name="snowflake",
    config=SnowflakeDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.snowflake.load:build",
    extra="snowflake",
    driver="snowflake.connector",
)
