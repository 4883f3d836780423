"""Body shapes and the limits on untrusted JSON, including the fast path that skips the walk."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from eventspark.collector.body import (
    MAX_DEPTH,
    MAX_LEAVES,
    MAX_TEMPLATE_EXPANSION,
    events_of,
    measure,
    parse_events,
)
from eventspark.collector.http import HTTPError


def nest(depth: int, rng: random.Random) -> Any:
    """A value `depth` containers deep, mixing objects and arrays, with bracket-laden strings."""
    value: Any = rng.choice(["{[", 1, None, "]}"])
    for _ in range(depth):
        value = {"k{": value, "s": "[[{"} if rng.random() < 0.5 else [value, "}]"]
    return value


@pytest.mark.parametrize("depth", [0, 1, 2, 63, 64, 65, 66, 100])
def test_measure_depth(depth: int) -> None:
    value = nest(depth, random.Random(depth))
    assert measure(value, 1000, 10**9)[0] == depth


def test_measure_counts_leaves_and_empty_containers() -> None:
    assert measure({"a": [1, 2, {}], "b": {"c": None}, "d": []}, 100, 100) == (3, 5)
    assert measure(5, 100, 100) == (0, 1)
    assert measure({}, 100, 100) == (1, 1)


@pytest.mark.parametrize("seed", range(40))
def test_depth_limit_is_exact_whatever_the_body_looks_like(seed: int) -> None:
    rng = random.Random(seed)
    depth = rng.randint(MAX_DEPTH - 3, MAX_DEPTH + 3)
    value = {"wrapped": nest(depth - 1, rng)}
    body = orjson.dumps(value)
    if depth <= MAX_DEPTH:
        assert parse_events(body) == [value]
    else:
        with pytest.raises(HTTPError, match="Failed to parse body") as raised:
            parse_events(body)
        assert "deeper than 64" in raised.value.error


@pytest.mark.parametrize("leaves", [MAX_LEAVES - 1, MAX_LEAVES, MAX_LEAVES + 1])
def test_leaf_limit_is_exact(leaves: int) -> None:
    body = orjson.dumps({"a": list(range(leaves))})
    if leaves <= MAX_LEAVES:
        assert len(parse_events(body)[0]["a"]) == leaves
    else:
        with pytest.raises(HTTPError, match="Failed to parse body"):
            parse_events(body)


def test_shapes() -> None:
    assert events_of({"a": 1}) == [{"a": 1}]
    assert events_of([{"a": 1}, {"b": 2}]) == [{"a": 1}, {"b": 2}]
    assert events_of([]) == []
    merged = events_of({"template": {"t": 1, "a": 0}, "events": [{"a": 1}, {"a": 2}]})
    assert merged == [{"a": 1, "t": 1}, {"a": 2, "t": 1}]
    # `events` that is not a list: an ordinary event that happens to use these names
    assert events_of({"template": {"t": 1}, "events": "x"}) == [{"template": {"t": 1}, "events": "x"}]
    assert parse_events(b'{"events": [1, 2]}') == [{"events": [1, 2]}]


@pytest.mark.parametrize("body", [b"1", b'"s"', b"null", b"[1]", b"[{}, []]", b'{"template": {}, "events": [2]}'])
def test_non_object_events_are_rejected(body: bytes) -> None:
    with pytest.raises(HTTPError, match="Failed to parse body"):
        parse_events(body)


def test_template_expansion_is_capped() -> None:
    template = {f"k{i}": i for i in range(100)}
    fits = MAX_TEMPLATE_EXPANSION // 100
    assert len(events_of({"template": template, "events": [{} for _ in range(fits)]})) == fits
    with pytest.raises(HTTPError, match="Failed to parse body") as raised:
        events_of({"template": template, "events": [{} for _ in range(fits + 1)]})
    assert "expand" in raised.value.error
