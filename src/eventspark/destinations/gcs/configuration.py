"""The `gcs` destination's config: EventNative's `google` block (as for BigQuery), plus
`gcs_endpoint` as the BigQuery package has it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from eventspark.config.base import DestinationBase
from eventspark.destinations.files.configuration import FilesOptions
from eventspark.destinations.files.naming import check_endpoint, clean_folder


class GcsConfig(FilesOptions):
    gcs_bucket: str
    key_file: str | dict[str, Any] = Field(default="", repr=False)
    """A service account key: a file path, its JSON text, or the JSON object itself. Empty: the
    library's default credentials (GOOGLE_APPLICATION_CREDENTIALS, the metadata server...),
    except anonymous ones for a `gcs_endpoint` when GOOGLE_APPLICATION_CREDENTIALS is unset."""
    gcs_endpoint: str = ""
    """Base URL of the Cloud Storage API (a private endpoint or an emulator); empty: Google's."""

    @field_validator("gcs_endpoint")
    @classmethod
    def _endpoint_is_a_url(cls, value: str) -> str:
        return check_endpoint(value)


class GcsDestination(DestinationBase):
    type: Literal["gcs"]
    google: GcsConfig

    def object_location(self) -> tuple[str, ...]:
        """Where the objects go (`config.loading.check_object_locations`): two destinations with
        the same location would overwrite and remove each other's objects."""
        block = self.google
        return ("gcs", block.gcs_endpoint.rstrip("/"), block.gcs_bucket, clean_folder(block.folder))
