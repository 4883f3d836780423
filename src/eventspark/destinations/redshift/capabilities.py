"""What Redshift can do, as data for the registry and the shared load code."""

from dataclasses import replace

from eventspark.destinations.base import Capabilities

CAPABILITIES = Capabilities(
    modes=frozenset({"batch", "stream"}),
    upsert="delete_insert",  # no ON CONFLICT; primary keys are not enforced
    stage="table",  # without `s3`: staging tables filled by multi-row INSERTs
    transactions=True,
    ddl_in_transactions=True,
    add_column_if_not_exists=False,
    users_recognition="update",
)

S3_CAPABILITIES = replace(CAPABILITIES, stage="files")
"""A destination with an `s3` block: executors write gzip JSON objects to S3, the commit COPYs them."""
