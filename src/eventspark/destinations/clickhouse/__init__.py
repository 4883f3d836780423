"""ClickHouse destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.clickhouse.capabilities import CAPABILITIES
from eventspark.destinations.clickhouse.configuration import ClickHouseDestination

DESTINATION = DestinationType(
    name="clickhouse",
    config=ClickHouseDestination,
    capabilities=CAPABILITIES,
    factory="eventspark.destinations.clickhouse.load:build",
)
