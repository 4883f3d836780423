"""DuckDB destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.duckdb.capabilities import CAPABILITIES
from eventspark.destinations.duckdb.configuration import DuckDBDestination

DESTINATION = DestinationType(
    name="duckdb",
    config=DuckDBDestination,
    capabilities=CAPABILITIES,
    factory="eventspark.destinations.duckdb.load:build",
)
