"""The `s3` destination's config: EventNative's `s3` block."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eventspark.config.base import DestinationBase
from eventspark.destinations.files.configuration import FilesOptions
from eventspark.destinations.files.naming import check_endpoint, clean_folder


class S3Config(FilesOptions):
    access_key_id: str = Field(default="", repr=False)
    """With `secret_access_key`; both empty: boto3's default credentials (environment, profile,
    instance role)."""
    secret_access_key: str = Field(default="", repr=False)
    bucket: str
    region: str = ""
    """Empty: boto3's default region (`AWS_REGION`, the profile), else us-east-1."""
    endpoint: str = ""
    """Base URL of an S3-compatible service (MinIO, DigitalOcean Spaces, a test server); empty: AWS."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_a_url(cls, value: str) -> str:
        return check_endpoint(value)


class S3Destination(DestinationBase):
    type: Literal["s3"]
    s3: S3Config

    def object_location(self) -> tuple[str, ...]:
        """Where the objects go (`config.loading.check_object_locations`): two destinations with
        the same location would overwrite and remove each other's objects."""
        block = self.s3
        return ("s3", block.endpoint.rstrip("/"), block.bucket, clean_folder(block.folder))
