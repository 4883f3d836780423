"""Event bodies: parsing, shape (object, array, template) and the limits on untrusted JSON.

A body is one JSON object, a JSON array of objects, or `{"template": {...}, "events": [...]}`
(the template is merged into each event). Anything else is a 400 `Failed to parse body`, so
nothing malformed reaches a log.
"""

from __future__ import annotations

from typing import Any

import orjson

from eventspark.collector.http import HTTPError
from eventspark.steps.context import merge_template

PARSE_FAILED = "Failed to parse body"
MAX_DEPTH = 64
MAX_LEAVES = 10_000
MAX_TEMPLATE_EXPANSION = 10 * MAX_LEAVES
"""Template leaves are repeated in every event: cap what a small body may expand to."""


def parse_failed(error: str) -> HTTPError:
    return HTTPError(400, PARSE_FAILED, error)


def parse_json(body: bytes) -> Any:
    """The parsed body; 400 with the parser's message when it is not JSON or exceeds the limits."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise parse_failed(str(exc)) from None
    check_limits(body, value)
    return value


def parse_events(body: bytes) -> list[dict[str, Any]]:
    """The events of a body (see `events_of`); 400 when it is not JSON or exceeds the limits."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise parse_failed(str(exc)) from None
    if not _surely_within_limits(body):
        walk_limits(value)
    if value.__class__ is dict and "events" not in value:  # the usual single event
        return [value]
    return events_of(value)


def check_limits(body: bytes, value: Any) -> None:
    """400 when `value` nests deeper than MAX_DEPTH or has more than MAX_LEAVES leaves."""
    if not _surely_within_limits(body):
        walk_limits(value)


def walk_limits(value: Any, where: str = "") -> None:
    """400 (the message starting with `where`, e.g. "message 3: ") past MAX_DEPTH or MAX_LEAVES."""
    depth, leaves = measure(value, MAX_DEPTH + 1, MAX_LEAVES + 1)
    if depth > MAX_DEPTH:
        raise parse_failed(f"{where}JSON nesting is deeper than {MAX_DEPTH} levels")
    if leaves > MAX_LEAVES:
        raise parse_failed(f"{where}JSON has more than {MAX_LEAVES} leaf values")


def _surely_within_limits(body: bytes) -> bool:
    # Nesting needs an opening bracket per level and every leaf at least two bytes: most bodies
    # are provably within limits without walking them (two byte scans, ~1 µs for a 1 KB event).
    size = len(body)
    return size <= MAX_DEPTH or (size <= 2 * MAX_LEAVES and body.count(b"{") + body.count(b"[") <= MAX_DEPTH)


def measure(value: Any, depth_limit: int, leaf_limit: int) -> tuple[int, int]:
    """(nesting depth, leaf count) of a parsed value, giving up once either limit is reached.

    Scalars and empty containers are leaves; depth counts containers (`{}` is 1, `5` is 0).
    """
    max_depth = leaves = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if not children:
            leaves += 1
            if children is not None:
                max_depth = max(max_depth, depth + 1)
            if leaves >= leaf_limit:
                break
            continue
        depth += 1
        if depth > max_depth:
            max_depth = depth
            if depth >= depth_limit:
                break
        stack.extend((child, depth) for child in children)
    return max_depth, leaves


def events_of(value: Any) -> list[dict[str, Any]]:
    """The events of a parsed body (an object, an array of objects, or a template body)."""
    if isinstance(value, dict):
        template, events = value.get("template"), value.get("events")
        if isinstance(template, dict) and isinstance(events, list):
            return _expand_template(template, events)
        return [value]
    if isinstance(value, list):
        _require_objects(value, "array element")
        return value
    raise parse_failed(f"expected a JSON object or array, got {type(value).__name__}")


def _require_objects(items: list[Any], what: str) -> None:
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise parse_failed(f"{what} {index} is not a JSON object")


def _expand_template(template: dict[str, Any], events: list[Any]) -> list[dict[str, Any]]:
    _require_objects(events, "events element")
    if events and template:
        _, template_leaves = measure(template, MAX_DEPTH + 1, MAX_TEMPLATE_EXPANSION + 1)
        if template_leaves * len(events) > MAX_TEMPLATE_EXPANSION:
            raise parse_failed(f"template × events would expand to more than {MAX_TEMPLATE_EXPANSION} values")
    return [merge_template(template, event) for event in events]
