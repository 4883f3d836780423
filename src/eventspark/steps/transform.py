"""JavaScript transform step: EventNative's `transform`, a function body over `$` (the event).

The body returns an event, an array of events, or null/undefined to skip the event (EventNative
1.3x+). A body that is one expression (`$.type == "x" ? null : $`) returns its value, as
EventNative's "last statement" rewrite did. Each event object may carry two conventions, which
`steps/chain.py` applies: `JITSU_TABLE_NAME` (the table, instead of the table name template) and
`__sql_type_<field>` (the column type of `<field>`: `"numeric(12,2)"`, or `["type"]` /
`["type", "column DDL"]`).

Engine: QuickJS (the `quickjs` wheel), in-process, with no I/O at all (no `std`/`os` modules, no
fetch). Events go in and out as JSON text. Each call has a CPU-time limit, the context a memory
limit and a stack limit: an endless loop, a huge allocation or a deep recursion fails that event
(`TransformFailed`, whose message names the cause) and the context stays usable (it is rebuilt
after anything unexpected). A QuickJS context is not thread-safe: each thread gets its own
(stream workers are threads; a Spark Python worker runs one task at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import orjson

DEFAULT_TIMEOUT_MS = 1000
"""CPU time one call may take before it is interrupted."""
DEFAULT_MEMORY_MB = 64
"""Memory of one context (the engine, the event parsed, whatever the transform allocates)."""
STACK_BYTES = 512 * 1024
"""Stack of one context: deep recursion fails the event instead of the process."""
MAX_SOURCE_BYTES = 256 * 1024
MAX_RESULT_EVENTS = 1000
"""Most events one transform may return for one event."""
MAX_RESULT_BYTES = 16 * 1024 * 1024
"""Largest result, as JSON text."""
MAX_ERROR_CHARS = 500
MAX_CONTEXTS = 64
"""Contexts one thread keeps (one per distinct transform and limits): bounded, reloads add more."""

TABLE_NAME_KEYS = ("JITSU_TABLE_NAME", "__JITSU_TABLE_NAME")
"""The table of one returned event; the second is EventNative's first spelling."""
SQL_TYPE_PREFIX = "__sql_type_"

# The runner: `$` and `_` are the event (EventNative offered both). The body is compiled by
# `new Function`, so it can never break out of its function; an expression body is tried first.
_PRELUDE = """
var __es_body = %s;
var __es_fn = (function () {
  try { return new Function("$", "_", "return (" + __es_body + "\\n);"); } catch (e) {}
  return new Function("$", "_", __es_body);
})();
__es_body = undefined;
function __es_run(text) {
  var $ = JSON.parse(text);
  var result = __es_fn($, $);
  return result === undefined || result === null ? null : JSON.stringify(result);
}
"""


class TransformSyntaxError(ValueError):
    """The transform does not compile (a config error)."""


class TransformFailed(Exception):
    """The transform failed on one event: the event goes to `events/failed` with this message."""


class Transform:
    """One destination's transform: its source and limits; compiled lazily in each thread."""

    __slots__ = ("key", "memory_mb", "source", "timeout_ms", "variables")

    def __init__(
        self,
        source: str,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        memory_mb: int = DEFAULT_MEMORY_MB,
        variables: Mapping[str, str] | None = None,
    ) -> None:
        if len(source.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
            raise TransformSyntaxError(f"the transform is longer than {MAX_SOURCE_BYTES} bytes")
        self.source = source
        self.timeout_ms = timeout_ms
        self.memory_mb = memory_mb
        self.variables = dict(variables or {})
        """Globals of the context: EventNative's `destinationId` and `destinationType`."""
        self.key = (source, timeout_ms, memory_mb, tuple(sorted(self.variables.items())))

    @classmethod
    def compile(cls, source: str, **limits: Any) -> Transform:
        """A transform whose syntax was checked now (TransformSyntaxError otherwise)."""
        transform = cls(source, **limits)
        _context(transform)
        return transform

    def run(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The events the transform makes of `event` (none: skip it); raises TransformFailed."""
        return parse_result(self.run_text(orjson.dumps(event).decode()))

    def run_text(self, event_json: str) -> str | None:
        """The transform's result as JSON text (None for null/undefined); raises TransformFailed."""
        runner = _context(self)
        try:
            result = runner.call(event_json)
        except Exception as exc:  # every engine error fails the event alone
            if not _is_js_error(exc):  # not the script's own doing: start from a fresh context
                _forget(self)
            raise TransformFailed(_describe(exc, self)) from None
        finally:
            runner.after_call()
        if result is not None and not isinstance(result, str):
            raise TransformFailed(f"unexpected result {type(result).__name__}")
        if result is not None and len(result) > MAX_RESULT_BYTES:
            raise TransformFailed(f"the result is larger than {MAX_RESULT_BYTES // (1024 * 1024)} MiB")
        return result


def parse_result(text: str | None) -> list[dict[str, Any]]:
    """EventNative's rules: null → skip; an object; an array of objects where null, undefined
    and false are ignored (anything else, `true` included, fails the event)."""
    if text is None:
        return []
    value = orjson.loads(text)
    if isinstance(value, dict):
        return [value]
    if not isinstance(value, list):
        raise TransformFailed(f"the result is {_js_type(value)}: return an object, an array of objects or null")
    events = [item for item in value if item is not None and item is not False]
    if len(events) > MAX_RESULT_EVENTS:
        raise TransformFailed(f"the result has {len(events)} events, more than {MAX_RESULT_EVENTS}")
    for item in events:
        if not isinstance(item, dict):
            raise TransformFailed(f"the result holds {_js_type(item)}: an array may hold objects, null or false")
    return events


def _js_type(value: object) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null"


def _describe(exc: BaseException, transform: Transform) -> str:
    """A short reason: the engine's first line (its stack traces repeat the frames)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if first == "InternalError: interrupted":
        return f"the transform ran longer than {transform.timeout_ms} ms (CPU time) and was stopped"
    if first in ("", "null") or "out of memory" in first:
        return f"the transform used more than {transform.memory_mb} MiB of memory"
    if first == "InternalError: stack overflow":
        return "stack overflow (recursion too deep)"
    return first[:MAX_ERROR_CHARS]


class _Runner:
    """A QuickJS context with the transform loaded; used by one thread only."""

    __slots__ = ("context", "function", "healthy")

    def __init__(self, transform: Transform) -> None:
        import quickjs  # lazily: only destinations with a transform need the engine

        context = quickjs.Context()
        context.set_memory_limit(transform.memory_mb * 1024 * 1024)
        context.set_max_stack_size(STACK_BYTES)
        context.set_time_limit(transform.timeout_ms / 1000)
        for name, value in transform.variables.items():
            context.set(name, value)
        try:
            context.eval(_PRELUDE % orjson.dumps(transform.source).decode())
        except Exception as exc:  # the engine's SyntaxError, or a limit at load
            text = str(exc).strip()
            raise TransformSyntaxError(text.splitlines()[0] if text else "the transform does not compile") from None
        self.context = context
        self.function = context.get("__es_run")
        self.healthy = True

    def call(self, event_json: str) -> Any:
        self.healthy = False  # until the call returns: anything unexpected rebuilds the context
        result = self.function(event_json)
        self.healthy = True
        return result

    def after_call(self) -> None:
        if not self.healthy:
            self.context.gc()  # free what a failed call left behind (an allocation that hit the limit)


_local = threading.local()


def _is_js_error(exc: BaseException) -> bool:
    import quickjs

    return isinstance(exc, quickjs.JSException)


def _forget(transform: Transform) -> None:
    runners: dict[Any, _Runner] | None = getattr(_local, "runners", None)
    if runners is not None:
        runners.pop(transform.key, None)


def _context(transform: Transform) -> _Runner:
    """This thread's runner of `transform`, built on first use."""
    runners: dict[Any, _Runner] | None = getattr(_local, "runners", None)
    if runners is None:
        runners = _local.runners = {}
    runner = runners.get(transform.key)
    if runner is None:
        if len(runners) >= MAX_CONTEXTS:
            runners.clear()
        runner = runners[transform.key] = _Runner(transform)
    return runner
