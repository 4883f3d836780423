"""The `bigquery` destination's config: EventNative's `google` block, plus endpoint overrides."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from eventspark.config.base import DestinationBase, Section


class GoogleConfig(Section):
    gcs_bucket: str = ""
    """Bucket where executors stage files that one load job per table loads; empty: the driver
    uploads the files itself (`load_table_from_file`)."""
    bq_project: str = ""
    """Project of the dataset and of the jobs; empty: the key's `project_id`, else the
    environment's default project."""
    bq_dataset: str = "default"
    """The dataset (EventNative's default: `default`), created when missing (only then: an
    existing dataset is only read, so a Data Editor of it is enough)."""
    key_file: str | dict[str, Any] = Field(default="", repr=False)
    """A service account key: a file path, its JSON text, or the JSON object itself. Empty: the
    library's default credentials (GOOGLE_APPLICATION_CREDENTIALS, the metadata server...),
    except anonymous ones for an endpoint override when GOOGLE_APPLICATION_CREDENTIALS is unset."""
    bq_endpoint: str = ""
    """Base URL of the BigQuery API (a private endpoint or an emulator); empty: Google's."""
    gcs_endpoint: str = ""
    """Base URL of the Cloud Storage API; empty: Google's."""
    bq_location: str = ""
    """eventspark's addition: the location (`EU`, `europe-west1`...) of the dataset when eventspark
    creates it; empty: BigQuery's default (US). An existing dataset keeps its own; jobs run in the
    dataset's location, and a `gcs_bucket` must be readable from there."""


class BigQueryDestination(DestinationBase):
    type: Literal["bigquery"]
    google: GoogleConfig
