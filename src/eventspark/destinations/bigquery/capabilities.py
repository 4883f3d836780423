"""What BigQuery can do, as data for the registry and the shared load code."""

from eventspark.destinations.base import Capabilities

CAPABILITIES = Capabilities(
    modes=frozenset({"batch", "stream"}),
    upsert="merge",
    # Executors write newline-delimited JSON files (on GCS with `gcs_bucket`, else under
    # <log.path>/staging/); the driver loads them into staging tables at commit.
    stage="files",
    # A commit is one multi-statement query `BEGIN TRANSACTION; ...; COMMIT TRANSACTION;`.
    transactions=True,
    ddl_in_transactions=False,  # DDL is not allowed inside BigQuery's transactions
    add_column_if_not_exists=True,
    users_recognition="update",
)
