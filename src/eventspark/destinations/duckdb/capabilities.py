"""What DuckDB can do, as data for the registry and the shared load code."""

from eventspark.destinations.base import Capabilities

CAPABILITIES = Capabilities(
    modes=frozenset({"batch", "stream"}),
    upsert="on_conflict",
    # One process may open the file: executors write Parquet files that the driver reads in.
    stage="files",
    transactions=True,
    ddl_in_transactions=True,
    add_column_if_not_exists=True,
    users_recognition="update",
)
