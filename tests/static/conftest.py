"""Fixtures of the tracking script's tests: `eventspark serve` with a chosen SDK directory
(`EVENTSPARK_SDK_DIR`, read by the server process) and static_files_dir."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from eventspark.sdk import SDK_DIR_ENV, web_dir
from tests.collector.conftest import Server, start_server

CLIENT_SECRET = "static-js-secret"
SERVER_SECRET = "static-s2s-secret"


def serve_config(**server: Any) -> dict[str, Any]:
    return {
        "server": {"name": "static-node", "admin_token": "static-admin", **server},
        "api_keys": [{"id": "web", "client_secret": CLIENT_SECRET, "server_secret": SERVER_SECRET}],
        "log": {"rotation_min": 60},
    }


def start_with_sdk(directory: Path, config: dict[str, Any], sdk_root: Path) -> Server:
    """`start_server` whose process looks for the SDK under `sdk_root`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(os.environ, SDK_DIR_ENV, str(sdk_root))
        return start_server(directory, config)


def fake_sdk(root: Path, lib: bytes) -> Path:
    """An SDK directory as `eventspark tracking-script fetch` leaves it, with the given lib.js."""
    target = web_dir(root)
    target.mkdir(parents=True)
    (target / "lib.js").write_bytes(lib)
    return target
