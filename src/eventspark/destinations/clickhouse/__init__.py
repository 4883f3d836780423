"""ClickHouse destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.clickhouse.capabilities import CAPABILITIES
from eventspark.destinations.clickhouse.configuration import ClickHouseDestination
from eventspark.destinations.clickhouse.dialect import DIALECT

DESTINATION = DestinationType(
    name="clickhouse",
    config=ClickHouseDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.clickhouse.load:build",
)
