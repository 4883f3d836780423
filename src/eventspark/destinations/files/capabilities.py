"""What every files type (S3, GCS) can do, as data."""

from eventspark.destinations.base import Capabilities

FILES_CAPABILITIES = Capabilities(
    modes=frozenset({"batch"}),
    # Every event is written; there is nothing to replace rows in.
    upsert="none",
    # Executors write the final objects; the batch job reads and patches no tables.
    stage="objects",
    transactions=False,
    ddl_in_transactions=False,
    add_column_if_not_exists=False,
)
"""Batch mode only: a stream micro-batch per object would make many small objects; the batch
pass writes one per rotated log and table."""
