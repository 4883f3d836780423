"""What MySQL and MariaDB can do, as data for the registry and the shared load code."""

from eventspark.destinations.base import Capabilities

CAPABILITIES = Capabilities(
    modes=frozenset({"batch", "stream"}),
    upsert="on_duplicate_key",
    stage="table",  # InnoDB tables filled by LOAD DATA LOCAL INFILE
    transactions=True,
    ddl_in_transactions=False,  # DDL commits the open transaction
    add_column_if_not_exists=False,  # MariaDB has it, MySQL does not
    users_recognition="update",
    task_commits=True,  # an INSERT ... SELECT per Spark task, in parallel (batch/commits.py)
)
