"""Batch staging on S3: executors upload gzip JSON objects under `<folder>/<job id>/<dest id>/`,
the commit lists a pair's objects in a manifest and loads them with one `COPY ... MANIFEST`
(`copy_statement`). boto3 is imported on use: a destination without `s3` does not need it.

The COPY authorizes itself with `s3.iam_role` when set (an eventspark extension of EventNative's
block: no key in the statement), else with keys from the `s3` block, else from boto3's chain
(environment, profile, instance role); keys appear in the COPY statement only, which is never
logged, are kept out of reprs, and are masked in the error of a failed COPY (`mask`).
"""

from __future__ import annotations

import gzip
import hashlib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from eventspark.destinations.base import StagedChunk, TerminalError, TransientError
from eventspark.destinations.redshift.client import stage_column, staged_row
from eventspark.destinations.redshift.configuration import RedshiftS3
from eventspark.steps.typing import DataType

MANIFEST_PREFIX = "manifest-"


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class IamRole:
    """COPY ... IAM_ROLE '<arn>': the cluster assumes the role, no key is in the statement."""

    arn: str


Authorization = Credentials | IamRole


def mask(text: str, authorization: Authorization) -> str:
    """`text` with the secret key and session token of `authorization` replaced by `***`."""
    if isinstance(authorization, Credentials):
        for secret in (authorization.secret_access_key, authorization.session_token):
            if secret:
                text = text.replace(secret, "***")
    return text


@dataclass(frozen=True, slots=True)
class S3Settings:
    """Picklable: the bucket, the key prefix and how to reach them (secrets kept out of repr)."""

    bucket: str
    folder: str = ""
    region: str = ""
    endpoint: str = ""
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)
    iam_role: str = ""

    @classmethod
    def of(cls, block: RedshiftS3) -> S3Settings:
        return cls(
            block.bucket,
            block.folder.strip("/"),
            block.region,
            block.endpoint,
            block.access_key_id,
            block.secret_access_key,
            block.iam_role,
        )

    def client(self) -> Any:
        """A boto3 S3 client (keys from the block, else boto3's chain)."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise TerminalError("redshift: an `s3` block needs boto3: pip install 'eventspark[redshift]'") from exc
        keys = {}
        if self.access_key_id:
            keys = {"aws_access_key_id": self.access_key_id, "aws_secret_access_key": self.secret_access_key}
        config = Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 3})
        return boto3.client(
            "s3", endpoint_url=self.endpoint or None, region_name=self.region or None, config=config, **keys
        )

    def copy_authorization(self) -> Authorization:
        """How the COPY authorizes itself: the block's `iam_role`, else keys (`credentials`)."""
        return IamRole(self.iam_role) if self.iam_role else self.credentials()

    def credentials(self) -> Credentials:
        """The keys the COPY hands to Redshift: the block's, else boto3's chain's."""
        if self.access_key_id:
            return Credentials(self.access_key_id, self.secret_access_key)
        import boto3

        found = boto3.Session(region_name=self.region or None).get_credentials()
        if found is None:
            raise TerminalError("redshift: no AWS credentials for the COPY: set s3.access_key_id or AWS_* variables")
        frozen = found.get_frozen_credentials()
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    def root(self) -> str:
        """The prefix holding one folder per job."""
        return f"{self.folder}/" if self.folder else ""

    def prefix(self, job_id: str, dest_id: str) -> str:
        return f"{self.root()}{job_id}/{dest_id}/"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """boto3 errors: unreachable endpoint, timeouts, 5xx and throttling are TransientErrors; the
    rest (missing bucket, denied, no credentials) TerminalErrors."""
    from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

    try:
        yield
    except (ConnectionError, HTTPClientError) as exc:
        raise TransientError(f"redshift: {doing}: {exc}") from exc
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code", "")
        kind = (
            TransientError if status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout") else TerminalError
        )
        raise kind(f"redshift: {doing}: {exc}") from exc
    except BotoCoreError as exc:
        raise TerminalError(f"redshift: {doing}: {exc}") from exc


# --- executors ------------------------------------------------------------------------------------


def json_object(columns: Mapping[str, DataType], row: Sequence[Any]) -> bytes:
    """One staged row as a JSON object keyed by staging column (NULLs left out: `JSON 'auto'`
    loads a missing key as NULL); values as text, the order column as a number."""
    values = staged_row(columns, row)
    return orjson.dumps({stage_column(c): v for c, v in zip(columns, values, strict=True) if v is not None})


@dataclass(frozen=True, slots=True)
class S3StageTarget:
    """Picklable: where executors of one job upload a destination's chunks."""

    settings: S3Settings
    job_id: str
    dest_id: str

    json_lines: ClassVar[bool] = False

    def open(self) -> S3StageWriter:
        return S3StageWriter(self)


class S3StageWriter:
    """Each chunk becomes one gzip JSON-lines object `<prefix><random>.json.gz`."""

    def __init__(self, target: S3StageTarget) -> None:
        self._target = target
        self._client: Any = None

    def write(self, columns: Mapping[str, DataType], rows: Sequence[Sequence[Any]]) -> StagedChunk:
        settings = self._target.settings
        key = f"{settings.prefix(self._target.job_id, self._target.dest_id)}{uuid.uuid4().hex}.json.gz"
        body = gzip.compress(b"".join(json_object(columns, row) + b"\n" for row in rows), compresslevel=6)
        with translated_errors(f"staging {len(rows)} rows in {settings.url(key)}"):
            if self._client is None:
                self._client = settings.client()
            self._client.put_object(Bucket=settings.bucket, Key=key, Body=body)
        return StagedChunk(key, dict(columns), len(rows))

    def close(self) -> None:
        self._client = None


# --- the commit -----------------------------------------------------------------------------------


def manifest_key(chunks: Sequence[StagedChunk]) -> str:
    """The manifest of a pair's chunks: beside the first one, named after all of them (so that the
    clean-up after the commit finds it again)."""
    digest = hashlib.sha256("\n".join(sorted(c.ref for c in chunks)).encode()).hexdigest()[:24]
    folder = chunks[0].ref.rpartition("/")[0]
    return f"{folder}/{MANIFEST_PREFIX}{digest}.json" if folder else f"{MANIFEST_PREFIX}{digest}.json"


def manifest(settings: S3Settings, chunks: Sequence[StagedChunk]) -> bytes:
    """Every chunk, mandatory: a missing object fails the COPY instead of loading less."""
    return orjson.dumps({"entries": [{"url": settings.url(c.ref), "mandatory": True} for c in chunks]})


def copy_statement(staging: str, manifest_url: str, authorization: Authorization, region: str) -> str:
    """The one COPY of a pair: every object of its manifest into the staging table `staging`
    (quoted), JSON objects matched to columns by key, gzip-compressed; RFC 3339 times are text
    here, cast at commit, so TIMEFORMAT only keeps COPY from guessing."""
    parts = [f"COPY {staging} FROM {_plain(manifest_url)}"]
    if isinstance(authorization, IamRole):
        parts.append(f"IAM_ROLE {_plain(authorization.arn)}")
    else:
        parts.append(f"ACCESS_KEY_ID {_plain(authorization.access_key_id)}")
        parts.append(f"SECRET_ACCESS_KEY {_plain(authorization.secret_access_key)}")
        if authorization.session_token:
            parts.append(f"SESSION_TOKEN {_plain(authorization.session_token)}")
    if region:
        parts.append(f"REGION {_plain(region)}")
    parts.append("FORMAT AS JSON 'auto' GZIP MANIFEST TIMEFORMAT 'auto' COMPUPDATE OFF STATUPDATE OFF")
    return " ".join(parts)


def _plain(text: str) -> str:
    """A string literal COPY takes (no expressions there, so no backslash either)."""
    if "\\" in text or any(ord(ch) < 32 for ch in text):
        # Not echoed: the text may be a key.
        raise TerminalError("redshift: the COPY cannot take a URL, key or role with a backslash or control character")
    return "'" + text.replace("'", "''") + "'"


def delete_keys(client: Any, bucket: str, keys: Sequence[str]) -> None:
    for start in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[start : start + 1000]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})


def list_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def drop_job_stages(settings: S3Settings, dest_id: str, matches: Callable[[str], bool]) -> None:
    """Deletes the objects of `dest_id` under every job folder whose name `matches`."""
    with translated_errors("dropping staged objects"):
        client = settings.client()
        root = settings.root()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=settings.bucket, Prefix=root, Delimiter="/")
        jobs = [p["Prefix"][len(root) :].rstrip("/") for page in pages for p in page.get("CommonPrefixes", [])]
        for job in jobs:
            if matches(job):
                delete_keys(client, settings.bucket, list_keys(client, settings.bucket, f"{root}{job}/{dest_id}/"))
