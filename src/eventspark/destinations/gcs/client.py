"""Cloud Storage through google-cloud-storage: the files family's `ObjectStore`, with errors
translated where they happen."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import IO, Any

import requests
from google.api_core import exceptions as api_errors
from google.api_core.retry import Retry
from google.auth import exceptions as auth_errors
from google.auth.credentials import Credentials
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from eventspark.destinations import google_auth
from eventspark.destinations.base import TerminalError, TransientError

SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
HTTP_TIMEOUT = 120.0
RETRY: Retry = DEFAULT_RETRY.with_delay(initial=1.0, maximum=30.0, multiplier=2.0).with_timeout(300.0)
"""Writes are idempotent (same name, same bytes): retried on 408, 429, 5xx and connection errors.
The library's own predicate (`storage.retry._should_retry`): api_core's default one misses the
media layer's `InvalidResponse` that an upload answered 5xx raises, so uploads were not retried."""


@dataclass(frozen=True, slots=True)
class GcsSettings:
    """Picklable: what a client of the bucket needs (sent to every executor)."""

    bucket: str
    endpoint: str = ""
    key_path: str = ""
    key_info: Mapping[str, Any] | None = field(default=None, repr=False)
    service: str = "gcs"

    def url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"

    def open(self) -> GcsStore:
        return GcsStore(self)

    def credentials(self) -> Credentials | None:
        creds: Credentials | None = google_auth.credentials(
            self.key_path, self.key_info, self.endpoint, SCOPES, self.service
        )
        return creds


def key_of(key_file: str | Mapping[str, Any]) -> tuple[str, Mapping[str, Any] | None]:
    """EventNative's `key_file`: (a path, None) or ('', the key's JSON object)."""
    return google_auth.key_of(key_file, "gcs")


class GcsStore:
    def __init__(self, settings: GcsSettings) -> None:
        self.settings = settings
        with translated_errors(f"connecting to {settings.url('')}"):
            credentials = settings.credentials()
            options = {"api_endpoint": settings.endpoint} if settings.endpoint else None
            project = getattr(credentials, "project_id", None) or ("eventspark" if settings.endpoint else None)
            self._client = storage.Client(project=project, credentials=credentials, client_options=options)
            self._bucket = self._client.bucket(settings.bucket)

    def put(self, key: str, data: IO[bytes], size: int, content_type: str) -> None:
        # Up to 8 MB one multipart upload, above a resumable one (the library's choice by size).
        with translated_errors(f"writing {self.settings.url(key)} ({size} bytes)"):
            blob = self._bucket.blob(key)
            blob.upload_from_file(data, size=size, content_type=content_type, timeout=HTTP_TIMEOUT, retry=RETRY)

    def list(self, prefix: str) -> list[str]:
        with translated_errors(f"listing {self.settings.url(prefix)}"):
            blobs = self._client.list_blobs(self._bucket, prefix=prefix, timeout=HTTP_TIMEOUT, retry=RETRY)
            return [blob.name for blob in blobs]

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            # Already gone (NotFound) is what was wanted.
            with translated_errors(f"removing {self.settings.url(key)}"), suppress(api_errors.NotFound):
                self._bucket.blob(key).delete(timeout=HTTP_TIMEOUT, retry=RETRY)

    def close(self) -> None:
        self._client.close()


@contextmanager
def translated_errors(doing: str) -> Iterator[None]:
    """429, 5xx, timeouts and connection errors as TransientError (after the client's retries);
    every other refusal (no such bucket, forbidden, bad credentials) as TerminalError."""
    try:
        yield
    except (TransientError, TerminalError):
        raise
    except api_errors.GoogleAPICallError as exc:
        transient = isinstance(exc, api_errors.ServerError | api_errors.TooManyRequests)
        kind = TransientError if transient else TerminalError
        raise kind(f"gcs: {doing}: {exc.code}: {exc.message}") from exc
    except (
        api_errors.RetryError,
        requests.ConnectionError,
        requests.Timeout,
        auth_errors.TransportError,
        TimeoutError,
        ConnectionError,
    ) as exc:
        raise TransientError(f"gcs: {doing}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc
    except (auth_errors.GoogleAuthError, requests.RequestException, ValueError) as exc:
        # Bad credentials; an invalid URL (requests.InvalidURL), a bad client option...
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise TerminalError(f"gcs: {doing}: {type(exc).__name__}: {text}") from exc
