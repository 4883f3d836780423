"""What ClickHouse (18.16 to current releases) can do, as data for the registry and the shared load code."""

from eventspark.destinations.base import Capabilities

CAPABILITIES = Capabilities(
    modes=frozenset({"batch", "stream"}),
    upsert="replacing_engine",
    stage="table",  # Memory or Log tables filled with JSONEachRow
    transactions=False,
    ddl_in_transactions=False,
    add_column_if_not_exists=False,  # 18.x lacks it
    insert_absent_as_null=False,  # columns are not Nullable unless configured
    # ClickHouse makes a part per insert and merges them in the background: at most one insert
    # a second per table, or sooner once 10,000 rows are waiting (its documented advice).
    min_insert_interval_sec=1.0,
    min_insert_rows=10_000,
    users_recognition="mutation",
)
