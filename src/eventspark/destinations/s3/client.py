"""S3 through boto3: the files family's `ObjectStore`, with errors translated where they happen."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError, NoCredentialsError

from eventspark.destinations.base import TerminalError, TransientError

CONFIG = Config(
    connect_timeout=10,
    read_timeout=120,
    # boto3's standard retries: throttling, 5xx and connection errors, exponential back-off; its
    # max_attempts counts retries: six attempts in all (tests/files/test_batch.py sees them).
    retries={"mode": "standard", "max_attempts": 5},
)
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed", "InternalError"}
)


@dataclass(frozen=True, slots=True)
class S3Settings:
    """Picklable: what a client of the bucket needs (sent to every executor)."""

    bucket: str
    region: str = ""
    endpoint: str = ""
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)
    service: str = "s3"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def open(self) -> S3Store:
        return S3Store(self)


class S3Store:
    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        with translated_errors(f"connecting to {settings.url('')}"):
            self._client: Any = boto3.session.Session().client(
                "s3",
                endpoint_url=settings.endpoint or None,
                region_name=settings.region or None,
                aws_access_key_id=settings.access_key_id or None,
                aws_secret_access_key=settings.secret_access_key or None,
                config=CONFIG,
            )

    def put(self, key: str, data: IO[bytes], size: int, content_type: str) -> None:
        # One PUT (S3 takes up to 5 GB in one); botocore reads the file, and again on a retry.
        with translated_errors(f"writing {self.settings.url(key)} ({size} bytes)"):
            self._client.put_object(
                Bucket=self.settings.bucket, Key=key, Body=data, ContentLength=size, ContentType=content_type
            )

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        with translated_errors(f"listing {self.settings.url(prefix)}"):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.settings.bucket, Prefix=prefix)
            for page in pages:
                keys.extend(item["Key"] for item in page.get("Contents", ()))
        return keys

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            with translated_errors(f"removing {self.settings.url(key)}"):
                self._client.delete_object(Bucket=self.settings.bucket, Key=key)

    def close(self) -> None:
        self._client.close()


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """Throttling, 5xx, timeouts and connection errors as TransientError (after boto3's own
    retries); every other refusal (no such bucket, access denied, bad credentials) as TerminalError.
    botocore's messages name the operation and the error code, never the keys."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = f"s3: {doing}: {code or status}: {error.get('Message', '')}".rstrip(": ")
        kind = TransientError if status >= 500 or status == 429 or code in _TRANSIENT_CODES else TerminalError
        raise kind(message) from exc
    except (ConnectionError, HTTPClientError, TimeoutError, OSError) as exc:
        raise TransientError(f"s3: {doing}: {type(exc).__name__}: {exc}") from exc
    except NoCredentialsError as exc:
        raise TerminalError(f"s3: {doing}: no credentials: set s3.access_key_id and s3.secret_access_key") from exc
    except BotoCoreError as exc:
        raise TerminalError(f"s3: {doing}: {type(exc).__name__}: {exc}") from exc
    except ValueError as exc:  # botocore's "Invalid endpoint", a bad region name...
        raise TerminalError(f"s3: {doing}: {type(exc).__name__}: {str(exc)[:300]}") from exc
