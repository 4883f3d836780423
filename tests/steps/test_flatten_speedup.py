"""The compiled flatten walk (speedups/_flatten.pyx) against the pure-Python reference.

Both run on the same events from the same fresh caches, and must give the same rows (keys, order,
value types), the same counts from the walk, the same cache contents afterwards and the same
exceptions. These tests fail, rather than skip, when the compiled module is not built.
"""

from __future__ import annotations

import datetime
import decimal
import enum
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from types import ModuleType, SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspark import speedups
from eventspark.steps import flatten as flatten_module
from eventspark.steps.flatten import MAX_DEPTH
from tests.compiled import compiled


def compiled_module() -> ModuleType:
    return compiled("flatten")


def compiled_walk() -> Callable[..., int]:
    return compiled_module().flatten_into


@contextmanager
def fresh_caches(limit: int | None = None, filled: int = 0) -> Iterator[None]:
    """Empty name caches (the walks must fill them alike), restored afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flatten_module, "_name_root", flatten_module._NameNode(""))
        patch.setattr(flatten_module, "_cached_names", filled)
        patch.setattr(flatten_module, "_sanitized_keys", {})
        if limit is not None:
            patch.setattr(flatten_module, "_CACHE_LIMIT", limit)
        yield


def outcome(run: Callable[[], object]) -> tuple:
    """A result comparable across walks: items in order with their value types, or the exception."""
    try:
        result = run()
    except Exception as exc:  # the walks must raise alike, so the exception is the outcome
        return ("raised", type(exc), str(exc))
    if isinstance(result, dict):
        return ("row", [(key, type(value), value) for key, value in result.items()])
    return ("value", type(result), result)


def cache_snapshot(node: flatten_module._NameNode) -> tuple:
    children = [(key, cache_snapshot(child)) for key, child in node.children.items()]
    return (node.prefix, list(node.columns.items()), children)


def run_with(walk: Callable[..., int], event: object, limit: int | None = None, filled: int = 0) -> tuple:
    """flatten twice (cache misses, then hits), the bare walk, and the caches it all left."""
    with fresh_caches(limit, filled), pytest.MonkeyPatch.context() as patch:
        patch.setattr(flatten_module, "_walk", walk)
        first = outcome(lambda: flatten_module.flatten(event))  # type: ignore[arg-type]
        second = outcome(lambda: flatten_module.flatten(event))  # type: ignore[arg-type]
        out: dict[str, object] = {}
        count = outcome(lambda: walk(event, flatten_module._name_root, out, 1))
        caches = (
            cache_snapshot(flatten_module._name_root),
            flatten_module._cached_names,
            list(flatten_module._sanitized_keys.items()),
        )
        return first, second, count, outcome(lambda: out), caches


def assert_same(event: object, limit: int | None = None, filled: int = 0) -> tuple:
    pure = run_with(flatten_module._flatten_into, event, limit, filled)
    compiled = run_with(compiled_walk(), event, limit, filled)
    assert compiled == pure
    return pure


keys = st.one_of(
    st.text(max_size=10),  # any unicode, upper case included
    st.text(alphabet="aAbB _-.$()[]{}@!#%&,;:^\"'`\\\t\n\x00é", max_size=6),
    st.sampled_from(["", "a", "A", "b", "a_b", "a b", "A B", "a-b", "имя", "дом", "café", "cafe"]),  # collisions
    st.text(alphabet="aAb", min_size=60, max_size=70),  # beyond 63 characters
)
any_keys = st.one_of(keys, keys, st.integers(-2, 2), st.booleans(), st.none())  # YAML constants' keys
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**80),
    st.floats(),
    st.text(max_size=5),
)
values = st.recursive(
    st.one_of(scalars, st.just([]), st.just({}), st.just(())),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(any_keys, children, max_size=5),
    ),
    max_leaves=40,
)
events = st.dictionaries(any_keys, values, max_size=8)


@st.composite
def deep_events(draw: st.DrawFn) -> dict:
    """An event nested to around MAX_DEPTH, with siblings along the way."""
    event = draw(events)
    for key in draw(st.lists(keys, min_size=MAX_DEPTH - 3, max_size=MAX_DEPTH + 3)):
        event = {key: event}
        if draw(st.booleans()):
            event[draw(keys)] = draw(scalars)
    return event


@settings(max_examples=300, deadline=None)
@given(events)
def test_compiled_walk_matches_the_reference(event: dict) -> None:
    assert_same(event)


@settings(max_examples=50, deadline=None)
@given(deep_events())
def test_compiled_walk_matches_the_reference_near_the_depth_limit(event: dict) -> None:
    assert_same(event)


@settings(max_examples=100, deadline=None)
@given(events, st.integers(1, 12), st.integers(0, 12))
def test_compiled_walk_matches_the_reference_while_caches_clear(event: dict, limit: int, filled: int) -> None:
    assert_same(event, limit=limit, filled=min(filled, limit))


def test_the_compiled_walk_is_built_and_used() -> None:
    module = compiled_module()
    assert module.MAX_DEPTH == MAX_DEPTH
    # flatten() takes the compiled walk unless the speed-ups are turned off.
    assert (flatten_module._walk is module.flatten_into) is not speedups.pure()


def test_collisions_give_the_same_count_and_row() -> None:
    pure = assert_same({"a b": 1, "a_b": 2, "A": {"B": 3}, "a": {"b": 4}})
    assert pure[2] == ("value", int, 4)  # four leaves written, two names: flatten takes the slow path


class ReversedItems(dict):
    def items(self):  # type: ignore[override]
        return list(reversed(list(super().items())))


class Truthy(dict):
    def __bool__(self) -> bool:
        return True


class Empty(dict):
    def __len__(self) -> int:
        return 0


class Text(str):
    pass


class Level(enum.IntEnum):
    HIGH = 2


class Flag(int):
    pass


def test_dict_subclasses_are_walked_through_their_own_methods() -> None:
    moved = OrderedDict([("x", 1), ("y", 2), ("z", {"k": 3})])
    moved.move_to_end("x")  # iteration order now differs from the dict's storage order
    event = {
        "moved": moved,
        "reversed": ReversedItems(a=1, b={"c": 2}),
        "truthy": Truthy(),
        "empty": Empty(hidden=1),
        "plain": {"q": 1},
    }
    kind, items = assert_same(event)[0]
    assert kind == "row"
    assert [name for name, _, _ in items][:4] == ["moved_y", "moved_z_k", "moved_x", "reversed_b_c"]
    assert assert_same(ReversedItems(a=1, b=2))[0] == ("row", [("b", int, 2), ("a", int, 1)])


def test_other_values_are_kept_or_encoded_alike() -> None:
    when = datetime.datetime(2026, 11, 25, 3, 0)
    event = {
        "tuple": (1, "x", {"k": None}),
        "list_subclass": type("Items", (list,), {})([1, 2]),
        "text": Text("subclassed"),
        "level": Level.HIGH,
        "flag": Flag(1),
        "bool": True,
        "big": 2**70,
        "big_list": [2**70, True],
        "decimal": decimal.Decimal("1.5"),
        "when": when,
        "nan": float("nan"),
    }
    row = assert_same(event)[0]
    assert dict((name, kind) for name, kind, _ in row[1])["level"] is Level  # kept, not a scalar copy


def test_non_string_keys_from_yaml_constants() -> None:
    assert_same({"c": {1: "one"}, "d": {True: "yes"}, "e": {False: 0, 2.5: 1}})
    assert_same({1: {2: {None: 3}}, 1.5: [1], (1, 2): "tuple key", "1": "text"})
    assert_same({True: 1, "true": 2})


def test_a_cache_clear_during_a_walk() -> None:
    event = {f"key {i}": i for i in range(10)} | {"parent": {f"child {i}": {"leaf": i} for i in range(10)}}
    for filled in range(0, 30, 3):
        assert_same(event, limit=30, filled=filled)
    # and the clear really happens mid-walk: the walk goes on filling the nodes it holds
    with fresh_caches(limit=30, filled=25), pytest.MonkeyPatch.context() as patch:
        patch.setattr(flatten_module, "_walk", compiled_walk())
        root = flatten_module._name_root
        assert flatten_module.flatten(event) == flatten_module.flatten_with_losses(event)[0]
        assert flatten_module._name_root is not root
        assert "key 0" in root.columns and "key 0" not in flatten_module._name_root.columns


def test_nesting_beyond_the_depth_limit() -> None:
    event: dict = {"leaf": 1, "list": [1]}
    for level in range(200):
        event = {"k": event, f"s{level}": level}
    assert_same(event)
    exact: dict = {"leaf": 1}
    for _ in range(MAX_DEPTH - 1):
        exact = {"k": exact}
    assert assert_same(exact)[0][1][0][1] is int  # at the limit the leaf is still a column
    assert assert_same({"k": exact})[0][1][0][1] is str  # one deeper it is JSON


def test_a_subtree_too_deep_for_json_fails_alike_whatever_the_stack() -> None:
    # Beyond orjson's 255 levels the subtree cannot be stored: both walks raise, and so does the
    # reference from a deep Python stack or a shallow one (the stdlib encoder, which would take it
    # or not depending on the caller's stack, is not asked).
    deep: object = 1
    for _ in range(600):
        deep = {"x": deep}
    event = {"a": 1, "deep": deep}
    assert assert_same(event)[0][0] == "raised"

    def nested(levels: int) -> tuple:
        return (
            nested(levels - 1)
            if levels
            else outcome(lambda: flatten_module._flatten_into(event, flatten_module._NameNode(""), {}, 1))
        )

    assert nested(0)[0] == nested(500)[0] == "raised"


def test_the_same_exceptions() -> None:
    deep_list: list = []
    for _ in range(5000):
        deep_list = [deep_list]
    assert assert_same({"a": deep_list})[0][:2] == ("raised", ValueError)
    for not_an_event in (None, [("a", 1)], 5, "text"):
        assert assert_same(not_an_event)[0][0] == "raised"


class ClashingKey:
    """A key that hashes like a cached name and fails when compared with it."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def __hash__(self) -> int:
        return hash("a")

    def __str__(self) -> str:  # its column name, the same in both runs
        return "clash"

    def __eq__(self, other: object) -> bool:
        raise self.error("compared")


@pytest.mark.parametrize("error", [KeyError, ValueError])
@pytest.mark.parametrize("value", [1, [1], Text("x"), {"k": 1}], ids=["scalar", "array", "other", "object"])
def test_failing_key_comparisons_propagate_alike(error: type[Exception], value: object) -> None:
    # The reference takes a KeyError from `columns[key]` for a miss and lets any other error out.
    # "a" is cached as a column and as a child, but not as a sanitised key: the miss path then
    # compares nothing, so an error seen here can only come from the lookups in the walk itself.
    def clash(walk: Callable[..., int]) -> tuple:
        with fresh_caches(), pytest.MonkeyPatch.context() as patch:
            patch.setattr(flatten_module, "_walk", walk)
            flatten_module.flatten({"a": 0})
            flatten_module.flatten({"a": {"k": 0}})
            flatten_module._sanitized_keys.clear()
            return outcome(lambda: flatten_module.flatten({ClashingKey(error): value}))

    assert clash(compiled_walk()) == clash(flatten_module._flatten_into)


def event_to_change() -> dict:
    # Keys built at run time: once dropped from the event, nothing but the walk can hold them.
    # A parent with a dozen items: its freed table would be reused or poisoned (PYTHONMALLOC=debug).
    parent = {"list": [2]} | {f"k{i}": i for i in range(12)}
    return {"".join(["ar", "ray"]): [1], "b": 1, "c": 2, "".join(["par", "ent"]): parent, "e": 3}


@pytest.mark.parametrize("change", ["shrink", "replace", "drop_current", "drop_parent"])
def test_an_event_changed_during_the_walk(change: str) -> None:
    # The only Python code the walk runs is the module's; a to_json that edits the event stands
    # for any code that would (the reference's dict iterator reports a change in size). Dropping
    # the key or the object being walked frees them unless the walk holds them.
    def walk_with(walk: Callable[..., int]) -> tuple:
        event = event_to_change()

        def edit(value: object) -> str:
            if change == "drop_current" and value == [1]:
                event.pop("array")
            elif change == "drop_parent" and value == [2]:
                event.pop("parent")
            elif change in ("shrink", "replace") and "c" in event:
                event.pop("c")
                if change == "replace":
                    event["d"] = 3
            return "[]"

        with fresh_caches(), pytest.MonkeyPatch.context() as patch:
            flatten_module.flatten(event_to_change())  # cached names: the walk takes its hit paths
            patch.setattr(flatten_module, "to_json", edit)
            out: dict[str, object] = {}
            return outcome(partial(walk, event, flatten_module._name_root, out, 1)), outcome(partial(dict, out))

    pure = walk_with(flatten_module._flatten_into)
    assert walk_with(compiled_walk()) == pure
    assert pure[0][0] == ("value" if change == "replace" else "raised")


def test_nodes_of_other_classes() -> None:
    # The compiled walk reads _NameNode's slots directly; any other node goes through getattr.
    class SubNode(flatten_module._NameNode):
        __slots__ = ()

    event = {"a": 1, "b": {"c": [2], "d": {"e": None}}, "f": "g"}
    for make in (lambda: SubNode(""), lambda: SimpleNamespace(prefix="", columns={}, children={})):
        results = []
        for walk in (flatten_module._flatten_into, compiled_walk()):
            with fresh_caches():
                node, out = make(), {}
                first = outcome(partial(walk, event, node, out, 1))
                again = outcome(partial(walk, event, node, out, 1))
                caches = (list(node.columns.items()), list(node.children))
                results.append((first, again, outcome(partial(dict, out)), caches))
        assert results[0] == results[1]
    for walk in (flatten_module._flatten_into, compiled_walk()):
        unset = flatten_module._NameNode.__new__(flatten_module._NameNode)  # slots never assigned
        assert outcome(partial(walk, event, unset, {}, 1))[:2] == ("raised", AttributeError)
