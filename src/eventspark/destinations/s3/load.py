"""The registry's factory of `s3` destinations."""

from __future__ import annotations

from pathlib import Path

from eventspark.destinations.files.naming import clean_folder
from eventspark.destinations.files.target import FilesDestination
from eventspark.destinations.s3.client import S3Settings
from eventspark.destinations.s3.configuration import S3Destination


def build(dest_id: str, dest: S3Destination, events_dir: Path) -> FilesDestination:
    """Config in, adapter out; no I/O."""
    block = dest.s3
    settings = S3Settings(block.bucket, block.region, block.endpoint, block.access_key_id, block.secret_access_key)
    return FilesDestination(dest_id, settings, clean_folder(block.folder), block.format, block.compression)
