"""Mapping step: the ``data_layout.mappings`` rules of a destination, applied to each event.

Rules run in order. Each reads its ``src`` from the event as it arrived (so one src can be
moved to several dsts) and writes into the mapped event:

* ``move``: put the src subtree at dst and remove it from src; an optional ``type`` casts dst.
* ``remove``: drop the src subtree.
* ``cast``: record an explicit type for the src column (``type`` required): a literal SQL type
  of the destination, or a generic one of ``string integer double timestamp boolean``.
* ``constant``: put ``value`` at dst.

JSON columns (``docs/json-columns.md``): a ``move`` or ``cast`` whose type is a JSON type
(``json jsonb variant object array super``, any case) keeps the subtree at its path whole: the
value there becomes its JSON text (``flatten.json_text``), so flattening stops there and the column
named after the path holds objects, arrays and scalars as JSON. With the generic ``string`` type
(ClickHouse's ``String``) an object or array there becomes JSON text too, while a scalar stays as it
is. A JSON ``cast`` is run as a ``move`` of the path onto itself.

With ``keep_unmapped: false`` the mapped event starts empty and holds only what move and
constant wrote and the fields that cast rules name.

Implicit casts (``pipeline-design.md``): ``/_timestamp`` is TIMESTAMP for every event, and
``/eventn_ctx/utc_time`` for JavaScript events (``src`` other than ``api``); configured rules
for the same column win.

The input event is not changed (it may be shared by several destinations): writes copy only
the objects on the written path (copy on write), and the result shares every other subtree with
the input, so treat both as read-only. A caller that owns the event (the step chain: each
destination gets its own parsed copy) passes ``in_place=True`` instead, and when the rules allow
it (see ``_in_place_safe``; nearly every real rule set does) they change the event itself,
with the same result and no copying.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from eventspark.steps.flatten import column_name, json_text
from eventspark.steps.paths import MISSING, Path, get_path, parse_path
from eventspark.steps.typing import format_timestamp

ACTIONS = ("move", "remove", "cast", "constant")
_RULE_KEYS = frozenset({"src", "dst", "action", "type", "value"})
_IMPLICIT_CASTS = {"_timestamp": "TIMESTAMP"}
_IMPLICIT_JS_CASTS = {"_timestamp": "TIMESTAMP", "eventn_ctx_utc_time": "TIMESTAMP"}
JSON_TYPES = frozenset({"json", "jsonb", "variant", "object", "array", "super"})
"""Type names (lower-cased) of JSON columns: every value at the rule's path is stored as JSON text."""
WHOLE_JSON, WHOLE_STRING = "json", "string"

# A type is pasted into DDL, so only type-like text is accepted: no statement separators,
# comments, or identifier quotes. Single quotes and '=' allow e.g. Enum8('a' = 1), DateTime64(3, 'UTC').
_SQL_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_ ,.()'=-]{0,199}", re.ASCII)


class MappingError(ValueError):
    """A mapping rule that cannot work; the message names the rule (``mappings.fields[i]``)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated mapping rule with its paths parsed."""

    action: str
    src: Path = ()
    dst: Path = ()
    sql_type: str | None = None
    value: Any = None
    whole: str | None = None
    """WHOLE_JSON or WHOLE_STRING when the value at dst is kept whole as JSON text (module docstring)."""


def whole_kind(sql_type: str | None) -> str | None:
    """WHOLE_JSON for a JSON type, WHOLE_STRING for the generic ``string``, else None."""
    if sql_type is None:
        return None
    name = sql_type.strip().lower()
    if name in JSON_TYPES:
        return WHOLE_JSON
    return WHOLE_STRING if name == "string" else None


def keep_whole(kind: str, value: Any) -> Any:
    """The value a kept-whole column stores: JSON text (WHOLE_STRING: objects and arrays only); null
    stays None."""
    if value is None or (kind == WHOLE_STRING and not isinstance(value, dict | list | tuple)):
        return value  # a JSON null is a NULL, as everywhere else
    return json_text(value)


class Mapper:
    """Applies one destination's mapping rules; build it once with ``Mapper.build``."""

    __slots__ = ("_casts_api", "_casts_js", "_identity", "_in_place_steps", "keep_unmapped", "rules")

    def __init__(self, keep_unmapped: bool, rules: Sequence[Rule]) -> None:
        self.keep_unmapped = keep_unmapped
        self.rules = tuple(rules)
        configured = _configured_casts(self.rules)
        self._casts_api = {**_IMPLICIT_CASTS, **configured}
        self._casts_js = {**_IMPLICIT_JS_CASTS, **configured}
        self._identity = keep_unmapped and not self.rules
        self._in_place_steps: tuple[_Step, ...] | None = None
        if _in_place_safe(self.rules, keep_unmapped):
            # with keep_unmapped a cast changes nothing in the event: no step
            kept = [rule for rule in self.rules if not (keep_unmapped and rule.action == "cast")]
            self._in_place_steps = tuple(_Step.of(rule) for rule in kept)

    @classmethod
    def build(cls, keep_unmapped: bool = True, fields: Sequence[Mapping[str, Any]] = ()) -> Mapper:
        """Validate the YAML ``mappings`` section; MappingError names the first bad rule."""
        if not isinstance(keep_unmapped, bool):
            raise MappingError(f"mappings.keep_unmapped must be true or false, not {keep_unmapped!r}")
        if isinstance(fields, str | bytes) or not isinstance(fields, Sequence):
            raise MappingError("mappings.fields must be a list of rules")
        return cls(keep_unmapped, [_parse_rule(index, raw) for index, raw in enumerate(fields)])

    def apply(self, event: dict[str, Any], in_place: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
        """The mapped event and the explicit column types, keyed by flattened column name.

        ``in_place=True``: the caller owns ``event`` and will not use it again, so the rules may
        change it rather than copy (the mapped event may then be ``event`` itself). The result
        is the same either way. The returned types dict is shared between calls: do not change it.
        """
        casts = self._casts_api if event.get("src") == "api" else self._casts_js
        if self._identity:  # no rules: nothing to copy or change
            return event, casts
        if in_place and self._in_place_steps is not None:
            return self._apply_in_place(event, self._in_place_steps), casts
        output: dict[str, Any] = dict(event) if self.keep_unmapped else {}
        owned = {id(output)}
        for rule in self.rules:
            _apply_rule(rule, event, output, owned, self.keep_unmapped)
        return output, casts

    def _apply_in_place(self, event: dict[str, Any], steps: tuple[_Step, ...]) -> dict[str, Any]:
        """``apply`` without copies: with keep_unmapped the rules change ``event`` itself.

        Only for rules that ``_in_place_safe`` accepts: then each src still reads as it arrived,
        and no write lands inside a subtree that is shared (a moved value, a constant).
        """
        keep_unmapped = self.keep_unmapped
        output: dict[str, Any] = event if keep_unmapped else {}
        for step in steps:
            action = step.action
            if action == "remove":
                parent = _walk(output, step.src_parent, create=False)
                if parent is not None:
                    parent.pop(step.src_key, None)
                continue
            if action == "constant":
                value = step.value
            else:  # move, or cast without keep_unmapped: the src value, if there is one
                parent = _walk(event, step.src_parent, create=False)
                value = MISSING if parent is None else parent.get(step.src_key, MISSING)
                if value is MISSING:
                    continue
                if keep_unmapped:  # a move: event is output, so parent is where src is
                    del parent[step.src_key]
                if step.whole is not None:
                    value = keep_whole(step.whole, value)
            parent = _walk(output, step.dst_parent, create=True)
            if parent is not None:
                parent[step.dst_key] = value
        return output


@dataclass(frozen=True, slots=True)
class _Step:
    """A rule for ``Mapper._apply_in_place``: paths split into the parent object and the key."""

    action: str
    src_parent: Path
    src_key: str
    dst_parent: Path
    dst_key: str
    value: Any
    whole: str | None

    @classmethod
    def of(cls, rule: Rule) -> _Step:
        # cast writes its value back at src (only run without keep_unmapped)
        dst = rule.src if rule.action == "cast" else rule.dst
        src_key = rule.src[-1] if rule.src else ""
        return cls(rule.action, rule.src[:-1], src_key, dst[:-1], dst[-1] if dst else "", rule.value, rule.whole)


def _walk(root: dict[str, Any], keys: Path, create: bool) -> dict[str, Any] | None:
    """The object at ``keys`` under ``root``; None when there is none there.

    With ``create``, missing or null objects on the way are created (a non-object value is
    never replaced), as ``paths.set_path`` does.
    """
    node = root
    for key in keys:
        child = node.get(key)
        if not isinstance(child, dict):
            if child is not None or not create:
                return None
            child = node[key] = {}
        node = child
    return node


def _in_place_safe(rules: Sequence[Rule], keep_unmapped: bool) -> bool:
    """Whether applying ``rules`` in place gives what copy on write gives.

    Copy on write reads every src from the event as it arrived and never changes an object it
    did not copy. In place, the same holds when (1) no rule writes strictly inside a path that a
    rule reads or sets: that would change a value that is also the event's (still to be read, or
    placed at a dst) or a constant shared by all events; and (2) no rule writes at or above a
    path that a later rule reads, which would then read the changed event. Overlapping rules
    are rare; for them ``apply`` copies.
    """
    reads = [_reads(rule, keep_unmapped) for rule in rules]
    sets = [_sets(rule, keep_unmapped) for rule in rules]
    writes = [_pops(rule, keep_unmapped) + set_paths for rule, set_paths in zip(rules, sets, strict=True)]
    shared = [path for paths in reads + sets for path in paths]
    for index, written in enumerate(writes):
        later_reads = [path for paths in reads[index + 1 :] for path in paths]
        for path in written:
            if any(_strictly_inside(path, other) for other in shared):
                return False
            if any(other[: len(path)] == path for other in later_reads):
                return False
    return True


def _strictly_inside(path: Path, other: Path) -> bool:
    return len(path) > len(other) and path[: len(other)] == other


def _reads(rule: Rule, keep_unmapped: bool) -> tuple[Path, ...]:
    """The src paths whose values ``rule`` places in the mapped event."""
    if rule.action == "move" or (rule.action == "cast" and not keep_unmapped):
        return (rule.src,)
    return ()


def _sets(rule: Rule, keep_unmapped: bool) -> tuple[Path, ...]:
    if rule.action in ("move", "constant"):
        return (rule.dst,)
    if rule.action == "cast" and not keep_unmapped:
        return (rule.src,)
    return ()


def _pops(rule: Rule, keep_unmapped: bool) -> tuple[Path, ...]:
    if rule.action == "remove" or (rule.action == "move" and keep_unmapped):
        return (rule.src,)
    return ()


def _apply_rule(rule: Rule, event: dict, output: dict, owned: set[int], keep_unmapped: bool) -> None:
    action = rule.action
    if action == "move":
        value = get_path(event, rule.src, MISSING)
        if value is MISSING:
            return
        if keep_unmapped:
            _pop_owned(output, rule.src, owned)
        if rule.whole is not None:
            value = keep_whole(rule.whole, value)
        _set_owned(output, rule.dst, value, owned)
    elif action == "remove":
        _pop_owned(output, rule.src, owned)
    elif action == "constant":
        _set_owned(output, rule.dst, rule.value, owned)
    elif not keep_unmapped:  # cast: a named field is a mapped field
        value = get_path(event, rule.src, MISSING)
        if value is not MISSING:
            _set_owned(output, rule.src, value, owned)


def _owned_parent(root: dict, keys: Path, owned: set[int], create: bool) -> dict | None:
    """The parent object of ``keys`` after copying every shared object on the way into ``owned``.

    Like ``paths.set_path``, a parent holding a non-object value is never replaced: None.
    """
    node = root
    for key in keys[:-1]:
        child = node.get(key)
        if isinstance(child, dict):
            if id(child) not in owned:
                child = node[key] = dict(child)
                owned.add(id(child))
        elif child is None and create:
            child = node[key] = {}
            owned.add(id(child))
        else:
            return None
        node = child
    return node


def _set_owned(root: dict, keys: Path, value: Any, owned: set[int]) -> None:
    parent = _owned_parent(root, keys, owned, create=True)
    if parent is not None:
        parent[keys[-1]] = value


def _pop_owned(root: dict, keys: Path, owned: set[int]) -> None:
    if get_path(root, keys, MISSING) is MISSING:  # nothing to remove: copy nothing
        return
    parent = _owned_parent(root, keys, owned, create=False)
    if parent is not None:
        parent.pop(keys[-1], None)


def _configured_casts(rules: Sequence[Rule]) -> dict[str, str]:
    casts: dict[str, str] = {}
    for rule in rules:
        if rule.sql_type is None:
            continue
        if rule.action == "cast":
            casts[column_name(rule.src)] = rule.sql_type
        elif rule.action == "move":
            casts[column_name(rule.dst)] = rule.sql_type
    return casts


def _parse_rule(index: int, raw: object) -> Rule:
    where = f"mappings.fields[{index}]"
    if not isinstance(raw, Mapping):
        raise MappingError(f"{where}: a rule must be an object with src, dst, action, type, value")
    unknown = sorted(str(key) for key in raw if key not in _RULE_KEYS)
    if unknown:
        raise MappingError(f"{where}: unknown key(s) {', '.join(unknown)}")
    action = raw.get("action")
    action = action.strip().lower() if isinstance(action, str) else action
    if action not in ACTIONS:
        raise MappingError(f"{where}: action must be one of {', '.join(ACTIONS)}, not {action!r}")
    sql_type = _parse_type(where, raw.get("type"))
    if action == "move":
        return Rule(action, _path(where, raw, "src"), _path(where, raw, "dst"), sql_type, whole=whole_kind(sql_type))
    if action == "remove":
        return Rule(action, src=_path(where, raw, "src"))
    if action == "cast":
        if sql_type is None:
            raise MappingError(f"{where}: cast needs a type")
        key = "src" if raw.get("src") is not None or raw.get("dst") is None else "dst"
        path = _path(where, raw, key)
        whole = whole_kind(sql_type)
        if whole is not None:  # the value changes (JSON text): a move of the path onto itself
            return Rule("move", path, path, sql_type, whole=whole)
        return Rule(action, src=path, sql_type=sql_type)
    if "value" not in raw:
        raise MappingError(f"{where}: constant needs a value")
    return Rule(action, dst=_path(where, raw, "dst"), value=_json_value(where, raw["value"]))


def _path(where: str, raw: Mapping[str, Any], key: str) -> Path:
    text = raw.get(key)
    if text is None:
        raise MappingError(f"{where}: {raw['action']} needs {key}")
    if not isinstance(text, str):
        raise MappingError(f"{where}: {key} must be a path like /a/b, not {text!r}")
    path = parse_path(text)
    if not path:
        raise MappingError(f"{where}: {key} {text!r} names the whole event; name a field like /a/b")
    if "" in path:
        raise MappingError(f"{where}: {key} {text!r} has an empty key")
    return path


def _parse_type(where: str, sql_type: object) -> str | None:
    if sql_type is None:
        return None
    if not isinstance(sql_type, str) or not sql_type.strip():
        raise MappingError(f"{where}: type must be a non-empty SQL type name")
    sql_type = sql_type.strip()
    balanced = sql_type.count("(") == sql_type.count(")") and sql_type.count("'") % 2 == 0
    if not _SQL_TYPE.fullmatch(sql_type) or "--" in sql_type or not balanced:
        hint = ""
        if sql_type.count("(") > sql_type.count(")"):
            hint = " (in a YAML flow mapping {...} a comma ends the value: quote it, 'numeric(12,2)')"
        raise MappingError(f"{where}: type {sql_type!r} does not look like an SQL type{hint}")
    return sql_type


def _json_value(where: str, value: object) -> Any:
    """The constant as JSON data: YAML gives dates and datetimes where JSON has strings, so they
    become strings (RFC 3339 in UTC for datetimes, like ``_timestamp``) and typing and serialising
    treat constants like event data."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MappingError(f"{where}: value {value!r} is not a JSON number")
        return value
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_json_value(where, item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _json_value(where, item) for key, item in value.items()}
    raise MappingError(f"{where}: value {value!r} is not JSON data")
