"""Flattening step: a nested event becomes one flat row of safe column names.

Nested keys are joined with ``_`` (``{"a": {"b": 1}}`` → ``a_b``), arrays become compact JSON
strings, and nulls and empty objects give no column.

Names. EventNative lower-cased each key and replaced ``( ) $ [ ] { } @ ! # % & , . ; : ^ -`` and
whitespace with ``_``. Keys come from the internet, so eventspark goes further and every name
matches ``^[a-z0-9_]{1,63}$``, which is a valid identifier in every supported warehouse once quoted:

* Any character outside ``[a-z0-9_]`` (after lower-casing) becomes ``_``. That covers the list
  above and also quotes, backslashes, NUL and the like.
* Non-ASCII keys: warehouses disagree on non-ASCII identifiers (and Postgres counts its 63 limit
  in bytes), so their characters become ``_`` too. Whole words in non-Latin scripts would then
  collapse into the same run of underscores ("имя" and "дом" both give ``___``), so a key with
  any non-ASCII character also gets ``_`` plus 8 hex digits of a hash of the original key:
  distinct keys stay distinct columns, and the same key always gives the same column.
* An empty key becomes ``_``.
* Names longer than 63 characters (Postgres' limit; MySQL allows 64) keep their first 54
  characters plus ``_`` and 8 hex digits of a hash of the full name. Postgres would otherwise
  truncate silently, so two long names sharing a prefix would become one column there.

Collisions. Different keys can give one name (``{"a b": 1, "a_b": 2}``, ``{"a": {"b": 1},
"a_b": 2}``). Exactly one value is kept, chosen independently of key order so that every event
maps the same way: a key path that needed no sanitising beats one that did, and among equals the
path that sorts first (comparing original keys level by level) wins. ``flatten_with_losses``
reports the paths of dropped values.

Depth. The collector limits nesting to 64; deeper objects are kept whole as a JSON string.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import orjson

from eventspark import speedups

MAX_NAME_LENGTH = 63
MAX_DEPTH = 64
_HASH_HEX_DIGITS = 8
_CACHE_LIMIT = 65536

_SAFE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
# str.translate table for ASCII keys: every unsafe ASCII character maps to "_".
_ASCII_TO_SAFE = {code: "_" for code in range(128) if chr(code) not in _SAFE_CHARS}

# Sanitising is pure, and the same few hundred keys repeat in every event: cache it, per key and
# per position in the event (see _NameNode) so that the hot path builds no strings. Bounded
# because keys are untrusted; clearing when full is cheap and the common keys are back after one
# event.
_sanitized_keys: dict[str, str] = {}
_SCALAR_TYPES = frozenset({str, int, float, bool})


def _short_hash(text: str) -> str:
    # blake2b rather than hash(): column names must be stable across processes and restarts.
    data = text.encode("utf-8", "surrogatepass")  # lone surrogates can arrive via JSON \u escapes
    return hashlib.blake2b(data, digest_size=_HASH_HEX_DIGITS // 2).hexdigest()


def _sanitize_key_uncached(key: object) -> str:
    text = key if isinstance(key, str) else str(key)
    if not text:
        return "_"
    lowered = text.lower()
    if text.isascii():
        return lowered.translate(_ASCII_TO_SAFE)
    safe = "".join(char if char in _SAFE_CHARS else "_" for char in lowered)
    return f"{safe}_{_short_hash(text)}"


def _sanitize_key(key: object) -> str:
    """One key as a name segment; not length-bounded (the joined name is bounded)."""
    name = _sanitized_keys.get(key)  # type: ignore[arg-type]
    if name is None:
        name = _sanitize_key_uncached(key)
        if not isinstance(key, str):  # only str keys are cached: True == 1 would share an entry
            return name
        if len(_sanitized_keys) >= _CACHE_LIMIT:
            _sanitized_keys.clear()
        _sanitized_keys[key] = name
    return name


def _bound(name: str) -> str:
    if len(name) <= MAX_NAME_LENGTH:
        return name
    keep = MAX_NAME_LENGTH - _HASH_HEX_DIGITS - 1
    return f"{name[:keep]}_{_short_hash(name)}"


def sanitize_name(name: str) -> str:
    """A single key as a safe column name: ``^[a-z0-9_]{1,63}$`` (rules in the module docstring)."""
    return _bound(_sanitize_key(name))


def column_name(path: Sequence[str]) -> str:
    """The column that flattening gives a value at ``path`` (``("a", "b")`` → ``a_b``).

    Mapping uses it to key explicit casts by the names the rows will have.
    """
    return _bound("_".join(_sanitize_key(key) for key in path)) if path else "_"


_TOO_DEEP = "Recursion limit reached"
"""orjson's TypeError for a value nested beyond its limit (255 levels)."""


def to_json(value: object) -> str:
    """A compact JSON string for an array (or an object nested too deeply).

    A value orjson refuses as nested too deeply raises ValueError here, whoever calls: the stdlib
    encoder would take it or not depending on how deep the caller's own Python stack already is
    (the compiled flatten walk uses none of it), so the same event could load or fail."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError as exc:  # orjson refuses ints beyond 64 bits, unknown types and deep nesting
        if str(exc) == _TOO_DEEP:
            raise ValueError("array or object is nested too deeply to store as JSON") from exc
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (RecursionError, ValueError) as exc:
        raise ValueError("array or object is nested too deeply to store as JSON") from exc


def json_text(value: object) -> str:
    """The JSON text a JSON column stores (a kept subtree, the unmapped column): compact, keys sorted.

    Sorted keys make equal subtrees equal text, whatever the order the client sent their keys in,
    so the text can be compared, grouped and deduplicated in every warehouse (ClickHouse stores
    it in a String). Raises ValueError when the value cannot be JSON (nested too deeply).
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError as exc:  # orjson refuses ints beyond 64 bits, unknown types and deep nesting
        if str(exc) == _TOO_DEEP:  # as `to_json`
            raise ValueError("the value cannot be stored as JSON (nested too deeply?)") from exc
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True, default=str)
    except (RecursionError, TypeError, ValueError) as exc:
        raise ValueError("the value cannot be stored as JSON (nested too deeply?)") from exc


class _NameNode:
    """The cached column names of the keys found under one prefix (one position in events).

    ``columns`` maps a key to the finished column name of a leaf there (prefix + sanitised key,
    already length-bounded), ``children`` a key to the node of the object it holds. A tree rather
    than one dict per prefix string: descending into an object then costs one lookup by key, and
    no prefix string is built and hashed per object per event.
    """

    __slots__ = ("children", "columns", "prefix")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # the full (unbounded) name of the object, plus "_"; "" at the root
        self.columns: dict[str, str] = {}
        self.children: dict[str, _NameNode] = {}


_name_root = _NameNode("")
_cached_names = 0  # entries in all the nodes reachable from _name_root


def _column(node: _NameNode, key: object) -> str:
    """The column name of a leaf at ``key`` under ``node``, cached (the miss path of flatten)."""
    name = _bound(node.prefix + _sanitize_key(key))
    if isinstance(key, str):  # JSON keys are str; others (from YAML constants) stay uncached
        _make_room()
        node.columns[key] = name
    return name


def _child(node: _NameNode, key: object) -> _NameNode:
    """The node of the object at ``key`` under ``node``, cached (the miss path of flatten)."""
    child = _NameNode(node.prefix + _sanitize_key(key) + "_")
    if isinstance(key, str):
        _make_room()
        node.children[key] = child
    return child


def _make_room() -> None:
    """Count one more cached entry; when the cache is full, forget it all first.

    Forgetting replaces the root (atomic, safe with other threads): a running flatten keeps
    filling the nodes it holds, which are freed once it is done.
    """
    global _name_root, _cached_names
    if _cached_names >= _CACHE_LIMIT:
        _name_root = _NameNode("")
        _cached_names = 0
    _cached_names += 1


def _flatten_into(obj: dict, node: _NameNode, out: dict[str, object], depth: int) -> int:
    """Add obj's leaves to ``out``; returns how many leaves it wrote (collisions overwrite).

    The hot path: a scalar leaf costs a type check, a cached name lookup and a store; no length
    or collision check (names are cached bounded, and ``flatten`` compares the count it gets
    with ``len(out)``). Leaves are counted per object (``len(obj)`` less the items that give no
    leaf), not per leaf.
    """
    leaves = len(obj)
    columns = node.columns
    for key, value in obj.items():
        if type(value) in _SCALAR_TYPES:
            # Subscript and KeyError rather than .get: about 8% faster for flatten, and a miss
            # (the first event with a key, or an uncacheable key) pays for sanitising anyway.
            try:
                out[columns[key]] = value
            except KeyError:
                out[_column(node, key)] = value
            continue
        kind = type(value)
        if kind is dict or isinstance(value, dict):
            if not value:
                leaves -= 1
                continue
            if depth < MAX_DEPTH:
                child = node.children.get(key)
                if child is None:
                    child = _child(node, key)
                leaves += _flatten_into(value, child, out, depth + 1) - 1
                continue
            value = to_json(value)
        elif value is None:
            leaves -= 1
            continue
        elif kind is list or kind is tuple or isinstance(value, list | tuple):
            value = to_json(value)
        name = columns.get(key)
        out[_column(node, key) if name is None else name] = value
    return leaves


# The compiled walk (speedups/_flatten.pyx) when built: the same results as _flatten_into, which
# stays the reference, at less than half its cost per event (bench/steps.py --stages).
_compiled = speedups.load("flatten")
_walk = _flatten_into if _compiled is None else _compiled.flatten_into


def flatten(event: dict) -> dict[str, object]:
    """The flat row of ``event``: safe, unique column names → scalar values (module docstring)."""
    out: dict[str, object] = {}
    if _walk(event, _name_root, out, 1) == len(out):  # no two leaves shared a name
        return out
    return flatten_with_losses(event)[0]


def flatten_with_losses(event: dict) -> tuple[dict[str, object], list[str]]:
    """Like ``flatten``, plus the JSON Pointer paths of values dropped because their names collided."""
    leaves: list[tuple[str, bool, tuple[str, ...], object]] = []
    _collect_leaves(event, (), "", False, leaves, 1)
    winners: dict[str, int] = {}  # name → index of the leaf that keeps it
    for index, (name, changed, path, _) in enumerate(leaves):
        held = winners.get(name)
        if held is None or (changed, path) < leaves[held][1:3]:
            winners[name] = index
    lost = [_pointer(leaf[2]) for index, leaf in enumerate(leaves) if winners[leaf[0]] != index]
    return {name: leaves[index][3] for name, index in winners.items()}, lost


def _collect_leaves(
    obj: dict,
    path: tuple[str, ...],
    prefix: str,
    changed: bool,
    leaves: list[tuple[str, bool, tuple[str, ...], object]],
    depth: int,
) -> None:
    """Every leaf with its name, whether any key on its path was altered, and its original path."""
    for key, value in obj.items():
        text = key if isinstance(key, str) else str(key)
        segment = _sanitize_key(key)
        name = prefix + segment
        here = (*path, text)
        altered = changed or segment != text
        if isinstance(value, dict):
            if not value:
                continue
            if depth < MAX_DEPTH:
                _collect_leaves(value, here, name + "_", altered, leaves, depth + 1)
                continue
            value = to_json(value)
        elif value is None:
            continue
        elif isinstance(value, list | tuple):
            value = to_json(value)
        bounded = _bound(name)
        leaves.append((bounded, altered or bounded != name, here, value))


def _pointer(path: tuple[str, ...]) -> str:
    # RFC 6901 escaping, so a key containing "/" cannot be mistaken for two levels.
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)
