"""The `redshift` destination's config: EventNative's `datasource` block, plus `s3` for batch staging."""

from __future__ import annotations

from typing import Literal

from eventspark.config.base import DataSource, DestinationBase, Section


class RedshiftS3(Section):
    """Where batch loads stage files (EventNative's keys). Keys left empty come from the AWS
    environment (`AWS_ACCESS_KEY_ID`, profiles, instance roles: boto3's chain)."""

    access_key_id: str = ""
    secret_access_key: str = ""
    bucket: str
    region: str = ""
    endpoint: str = ""
    """An S3-compatible endpoint URL for the uploads (private endpoints, local emulators)."""
    folder: str = ""
    """The key prefix under which eventspark writes `<job id>/<destination id>/...` objects."""
    iam_role: str = ""
    """eventspark's extension of EventNative's block: the ARN of a role the cluster assumes for
    the COPY (`IAM_ROLE '...'`), so that no key is in the statement. The uploads still use the
    keys above or boto3's chain."""


class RedshiftDestination(DestinationBase):
    type: Literal["redshift"]
    datasource: DataSource
    """host, port (5439), db, schema (public), username, password, parameters (libpq keywords)."""
    s3: RedshiftS3 | None = None
    """Batch staging on S3 and `COPY`; without it, rows are staged with INSERTs (slow on Redshift)."""
