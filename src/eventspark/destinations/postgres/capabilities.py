"""What PostgreSQL can do, as data for the registry and the shared load code."""

from eventspark.destinations.base import Capabilities

CAPABILITIES = Capabilities(
    modes=frozenset({"batch", "stream"}),
    upsert="on_conflict",
    stage="table",  # UNLOGGED tables filled by binary COPY
    transactions=True,
    ddl_in_transactions=True,
    add_column_if_not_exists=True,  # since 9.6
    users_recognition="update",
    direct_writes=True,  # text COPY into the target per split, with its markers (postgres/direct.py)
    task_commits=True,  # staged rows: an INSERT ... SELECT per task, in parallel (batch/commits.py)
    keyed_task_commits=True,  # upserts per key bucket, in parallel (ON CONFLICT locks rows only)
)
