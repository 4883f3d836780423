"""What Snowflake can do, as data for the registry and the shared load code."""

from eventspark.destinations.base import Capabilities

CAPABILITIES = Capabilities(
    modes=frozenset({"batch", "stream"}),
    # A MERGE's result (stored values of columns a load lacks are kept), run as UPDATE ... FROM +
    # INSERT ... WHERE NOT EXISTS in the commit's transaction: load.py `_upsert_statements`.
    upsert="merge",
    # Each pass stages into one table of its own per destination (`_es_stage_<job>_<dest hash>`):
    # executors PUT files on its table stage (or on the named / S3 / GCS stage), the commit COPYs
    # them into it. Dropping the table drops the stage: the shared clean-up finds them by name.
    stage="table",
    transactions=True,
    ddl_in_transactions=False,  # DDL commits the open transaction
    add_column_if_not_exists=True,
    users_recognition="update",
)
