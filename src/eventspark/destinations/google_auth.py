"""Google credentials as every Google destination reads them (BigQuery, GCS, Snowflake's GCS
stage): EventNative's `key_file` (a path, the key's JSON text, or the JSON object itself), the
library's default credentials, or anonymous ones for an emulator. The Google libraries are
imported only when credentials are made."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from eventspark.destinations.base import TerminalError


def key_of(key_file: str | Mapping[str, Any], service: str) -> tuple[str, Mapping[str, Any] | None]:
    """EventNative's `key_file`: (a path, None) or ('', the key's JSON object)."""
    if isinstance(key_file, Mapping):
        return "", dict(key_file)
    text = key_file.strip()
    if text.startswith("{"):
        try:
            return "", dict(json.loads(text))
        except ValueError as exc:
            raise TerminalError(f"{service}: google.key_file holds text that is not a JSON object") from exc
    return text, None


def credentials(
    key_path: str, key_info: Mapping[str, Any] | None, endpoint: str, scopes: Sequence[str], service: str
) -> Any:
    """Service-account credentials from the key; without one, anonymous credentials for an
    endpoint override (an emulator) unless GOOGLE_APPLICATION_CREDENTIALS names a key file; None
    (the library's default credentials) otherwise."""
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2 import service_account

    try:
        if key_info is not None:
            return service_account.Credentials.from_service_account_info(dict(key_info), scopes=scopes)
        if key_path:
            return service_account.Credentials.from_service_account_file(key_path, scopes=scopes)
    except (ValueError, KeyError, OSError) as exc:
        # Messages name missing fields or the path, never the key's content.
        raise TerminalError(f"{service}: reading the service account key: {type(exc).__name__}: {exc}") from exc
    if endpoint and not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    return None
