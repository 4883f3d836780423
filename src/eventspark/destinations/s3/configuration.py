"""The `s3` destination's config: EventNative's `s3` block."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eventspark.config.base import DestinationBase, Section


class S3Config(Section):
    access_key_id: str = Field(default="", repr=False)
    """With `secret_access_key`; both empty: boto3's default credentials (environment, profile,
    instance role)."""
    secret_access_key: str = Field(default="", repr=False)
    bucket: str
    region: str = ""
    """Empty: boto3's default region (`AWS_REGION`, the profile), else us-east-1."""
    endpoint: str = ""
    """Base URL of an S3-compatible service (MinIO, DigitalOcean Spaces, a test server); empty: AWS."""
    folder: str = ""
    """Prefix of every object (slashes around it are ignored)."""
    format: Literal["json", "flat_json", "csv", "parquet"] = "json"
    compression: Literal["", "gzip"] = ""
    """`gzip`: json, flat_json and csv objects gzipped (`.gz`); Parquet uses its GZIP codec."""


class S3Destination(DestinationBase):
    type: Literal["s3"]
    s3: S3Config
