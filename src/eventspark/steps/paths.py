"""Slash paths (`/a/b`) into nested JSON objects: parse once, then get, set and pop.

A path names a node by the keys leading to it: `/eventn_ctx/user_agent` is
``event["eventn_ctx"]["user_agent"]``. The leading and trailing `/` are optional (`a/b` is
`/a/b`, as in EventNative's mapping `dst`), whitespace around each key is ignored, and `/`
alone (or an empty string) is the root: the object itself. There is no escaping (a key
containing `/` cannot be named), matching EventNative.

Parse paths when a step is built and pass the tuples on the hot path; every function also
accepts the string form, parsed through a small bounded cache.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final

__all__ = ["MISSING", "Path", "get_path", "parse_path", "pop_path", "set_path"]

Path = tuple[str, ...]
"""A parsed path: the keys from the root to the node; ``()`` is the root."""


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""Sentinel to pass as ``default`` to tell an absent node from a node holding ``None``."""


@lru_cache(maxsize=2048)
def parse_path(path: str) -> Path:
    """Split `/a/b` into ``("a", "b")``; `/` and `""` give the root ``()``."""
    trimmed = path.strip().removeprefix("/").removesuffix("/")
    if not trimmed:
        return ()
    return tuple(key.strip() for key in trimmed.split("/"))


def get_path(obj: dict[str, Any], path: Path | str, default: Any = None) -> Any:
    """The node at ``path``, or ``default`` when a key is missing or a parent is not an object."""
    keys = parse_path(path) if path.__class__ is str else path
    node: Any = obj
    for key in keys:
        if not isinstance(node, dict):
            return default
        node = node.get(key, MISSING)
        if node is MISSING:
            return default
    return node


def set_path(obj: dict[str, Any], path: Path | str, value: Any) -> bool:
    """Put ``value`` at ``path``, creating missing (or null) parent objects.

    Returns False, changing nothing, when a parent holds a non-object value: an existing
    string or number is never replaced by an object. At the root, an object value is merged
    into ``obj`` (key by key) and any other value is refused.
    """
    keys = parse_path(path) if path.__class__ is str else path
    if not keys:
        if not isinstance(value, dict):
            return False
        obj.update(value)
        return True
    node = obj
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            return False
        node = child
    node[keys[-1]] = value
    return True


def pop_path(obj: dict[str, Any], path: Path | str, default: Any = None) -> Any:
    """Remove the node at ``path`` and return it (``default`` when absent).

    Emptied parents are kept. Popping the root returns a shallow copy of ``obj`` and
    empties ``obj`` itself.
    """
    keys = parse_path(path) if path.__class__ is str else path
    if not keys:
        whole = dict(obj)
        obj.clear()
        return whole
    parent = get_path(obj, keys[:-1]) if len(keys) > 1 else obj
    if not isinstance(parent, dict):
        return default
    return parent.pop(keys[-1], default)
