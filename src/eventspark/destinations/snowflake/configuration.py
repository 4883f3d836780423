"""The `snowflake` destination's config: EventNative's `snowflake` block, plus the connector's own
endpoint settings (`host`, `protocol`) for private endpoints and local emulators.

Secrets (`password`, S3 keys) are `SecretStr`: they never show in a repr, a log line or an error.
When `username` or `password` is empty, `SNOWFLAKE_USER` / `SNOWFLAKE_PASSWORD` are read at
connect time; S3 keys left out come from boto3's usual chain (`AWS_ACCESS_KEY_ID`...), Google
credentials from `GOOGLE_APPLICATION_CREDENTIALS` when `key_file` is not given.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator

from eventspark.config.base import DestinationBase, Section


class SnowflakeS3(Section):
    """Batch files go to this bucket; COPY reads them from `s3://bucket/folder/...` with the keys."""

    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    bucket: str
    region: str = ""
    endpoint: str = ""
    """An S3-compatible endpoint URL for the uploads (moto, MinIO, a private endpoint)."""
    folder: str = ""


class SnowflakeGoogle(Section):
    """Batch files go to this GCS bucket; COPY reads them through the external stage `stage`,
    whose URL is the bucket's root (as EventNative)."""

    gcs_bucket: str
    key_file: str | dict[str, Any] | None = None
    """A path to a service-account key, or the key's JSON object."""
    gcs_endpoint: str = ""
    """Base URL of a GCS-compatible endpoint (anonymous credentials without `key_file`)."""
    folder: str = ""


class SnowflakeConfig(Section):
    account: str
    port: int | None = Field(default=None, ge=1, le=65535)
    db: str
    schema_: str = Field(default="", validation_alias=AliasChoices("schema", "schema_"))
    """Default PUBLIC (written `public`: plain names are upper-cased, as EventNative did)."""
    username: str = ""
    password: SecretStr = Field(default=SecretStr(""))
    warehouse: str = ""
    stage: str = ""
    """A named stage for batch files (an SQL name such as `my_stage` or `db.schema.stage`); without
    it, each pass puts its files on the table stage of its own staging table."""
    parameters: dict[str, str] = Field(default_factory=dict)
    """Session parameters (QUERY_TAG, ...); the connector's `login_timeout`, `network_timeout` and
    `socket_timeout`, and eventspark's `load_timeout` (seconds) are taken from here too. TIMEZONE,
    TIMESTAMP_TYPE_MAPPING, TIMESTAMP_INPUT_FORMAT and QUOTED_IDENTIFIERS_IGNORE_CASE are pinned
    (`client.PINNED_SESSION`): the same keys here are ignored."""
    host: str = ""
    """The connector's `host` (default `<account>.snowflakecomputing.com`)."""
    protocol: Literal["https", "http"] = "https"
    s3: SnowflakeS3 | None = None
    google: SnowflakeGoogle | None = None

    @model_validator(mode="after")
    def _one_bucket(self) -> SnowflakeConfig:
        if self.s3 is not None and self.google is not None:
            raise ValueError("give either s3 or google for batch files, not both")
        return self


class SnowflakeDestination(DestinationBase):
    type: Literal["snowflake"]
    snowflake: SnowflakeConfig
    """account, port, db, schema, username, password, warehouse, stage, parameters, s3 | google,
    host, protocol."""
