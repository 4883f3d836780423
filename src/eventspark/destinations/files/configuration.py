"""What the block of every files destination has (s3's `s3:`, gcs's `google:`): where under the
bucket the objects go and how they are written."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from eventspark.config.base import Section
from eventspark.destinations.files.naming import check_folder


class FilesOptions(Section):
    folder: str = ""
    """Prefix of every object (slashes around it are ignored)."""
    format: Literal["json", "flat_json", "csv", "parquet"] = "json"
    compression: Literal["", "gzip"] = ""
    """`gzip`: json, flat_json and csv objects gzipped (`.gz`); Parquet uses its GZIP codec."""

    @field_validator("folder")
    @classmethod
    def _folder_fits(cls, value: str) -> str:
        return check_folder(value)
