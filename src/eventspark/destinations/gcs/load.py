"""The registry's factory of `gcs` destinations."""

from __future__ import annotations

from pathlib import Path

from eventspark.destinations.files.naming import clean_folder
from eventspark.destinations.files.target import FilesDestination
from eventspark.destinations.gcs.client import GcsSettings, key_of
from eventspark.destinations.gcs.configuration import GcsDestination


def build(dest_id: str, dest: GcsDestination, events_dir: Path) -> FilesDestination:
    """Config in, adapter out; no I/O (a key given as JSON text is parsed here)."""
    block = dest.google
    key_path, key_info = key_of(block.key_file)
    settings = GcsSettings(block.gcs_bucket, block.gcs_endpoint, key_path, key_info)
    return FilesDestination(dest_id, settings, clean_folder(block.folder), block.format, block.compression)
