"""Building HTTP destinations from config dicts, and EventNative's test vectors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
from pydantic import TypeAdapter

from eventspark.config.models import Destination
from eventspark.destinations import build_destination
from eventspark.destinations.http.sink import HttpSink
from tests.shared_data import eventnative_data

VECTORS = eventnative_data()
FAST = {"timeout_sec": 2, "retries": 2, "retry_min_sec": 0.05, "retry_max_sec": 0.2}
"""Block keys that keep the tests quick."""


def vector(name: str) -> dict[str, Any]:
    event: dict[str, Any] = orjson.loads((VECTORS / name).read_bytes())
    return event


def destination(raw: dict[str, Any]) -> Any:
    return TypeAdapter(Destination).validate_python({"mode": "stream", **raw})


def sink(type_: str, block: dict[str, Any], **extra: Any) -> HttpSink:
    dest = destination({"type": type_, type_: {**FAST, **block}, **extra})
    adapter = build_destination("dst", dest, Path("/nonexistent"))
    assert isinstance(adapter, HttpSink)
    return adapter


def send(adapter: HttpSink, *events: dict[str, Any]) -> list[str | None]:
    try:
        return adapter.send([copy.deepcopy(event) for event in events])
    finally:
        adapter.close()
