"""DuckDB destination: its entry in the registry (`destinations.registry`)."""

from eventspark.destinations.base import DestinationType
from eventspark.destinations.duckdb.capabilities import CAPABILITIES
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.destinations.duckdb.dialect import DIALECT

DESTINATION = DestinationType(
    name="duckdb",
    config=DuckDBDestination,
    capabilities=CAPABILITIES,
    dialect=DIALECT,
    factory="eventspark.destinations.duckdb.load:build",
    probe="eventspark.destinations.duckdb.probe:probe",
)
