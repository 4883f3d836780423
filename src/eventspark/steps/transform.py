"""JavaScript transform step: EventNative's `transform`, a function body over `$` (the event).

The body returns an event, an array of events, or null/undefined to skip the event (EventNative
1.3x+). A body that is one expression (`$.type == "x" ? null : $`) returns its value, as
EventNative's "last statement" rewrite did. Each event object may carry two conventions, which
`steps/chain.py` applies: `JITSU_TABLE_NAME` (the table, instead of the table name template) and
`__sql_type_<field>` (the column type of `<field>`: `"numeric(12,2)"`, or `["type"]` /
`["type", "column DDL"]`).

Engine: QuickJS (the `quickjs` wheel), in a child process per thread (`steps/transform_host.py`:
QuickJS can crash its process on some out-of-memory paths), with no I/O at all (no `std`/`os` modules, no
fetch). Events go in and out as JSON text. Each call has a CPU-time limit, the context a memory
limit and a stack limit: an endless loop, a huge allocation or a deep recursion fails that event
(`TransformFailed`, whose message names the cause) and the context stays usable (it is rebuilt
after anything unexpected). A QuickJS context is not thread-safe: each thread gets its own
(stream workers are threads; a Spark Python worker runs one task at a time).
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

import orjson

from eventspark.steps.transform_host import HEADER, read_frame

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
MAX_CONTEXTS = 16
"""Engines one thread keeps (one per distinct transform and limits): bounded, reloads add more."""
WALL_LIMIT_FACTOR = 20
WALL_LIMIT_MIN_SEC = 30.0
"""The wall-clock guard of one call: 20 × the CPU-time limit, at least 30 s (a loaded machine
stretches CPU time into more wall time: only a stuck engine hits this)."""

TABLE_NAME_KEYS = ("JITSU_TABLE_NAME", "__JITSU_TABLE_NAME")
"""The table of one returned event; the second is EventNative's first spelling."""
SQL_TYPE_PREFIX = "__sql_type_"


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

    def close(self) -> None:
        """Stops this thread's engine of the transform (the next run starts a new one)."""
        _forget(self)

    def run(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The events the transform makes of `event` (none: skip it); raises TransformFailed."""
        return parse_result(self.run_text(orjson.dumps(event).decode()))

    def run_text(self, event_json: str) -> str | None:
        """The transform's result as JSON text (None for null/undefined); raises TransformFailed."""
        runner = _context(self)
        try:
            kind, text = runner.call(event_json)
        except _HostDied as exc:  # the engine crashed (or overran the wall-clock guard): a new one next time
            _forget(self)
            raise TransformFailed(str(exc)) from None
        if kind == "E":
            raise TransformFailed(_describe(text, self))
        if text is not None and len(text) > MAX_RESULT_BYTES:
            raise TransformFailed(f"the result is larger than {MAX_RESULT_BYTES // (1024 * 1024)} MiB")
        return text


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


def _describe(first: str, transform: Transform) -> str:
    """A short reason from the engine's first line of the error (its stack traces repeat frames)."""
    if first == "InternalError: interrupted":
        return f"the transform ran longer than {transform.timeout_ms} ms (CPU time) and was stopped"
    if first in ("", "null") or "out of memory" in first:
        return f"the transform used more than {transform.memory_mb} MiB of memory"
    if first == "InternalError: stack overflow":
        return "stack overflow (recursion too deep)"
    return first[:MAX_ERROR_CHARS]


class _HostDied(Exception):
    """The engine's process ended or stopped answering."""


class _Runner:
    """The process running one transform (`steps/transform_host.py`), used by one thread only."""

    __slots__ = ("process", "wall_limit")

    def __init__(self, transform: Transform) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "eventspark.steps.transform_host"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        # The engine limits CPU time; this bounds wall-clock time too (a starved or stuck engine).
        self.wall_limit = max(WALL_LIMIT_MIN_SEC, transform.timeout_ms / 1000 * WALL_LIMIT_FACTOR)
        settings = {
            "source": transform.source,
            "timeout_ms": transform.timeout_ms,
            "memory_mb": transform.memory_mb,
            "stack_bytes": STACK_BYTES,
            "variables": transform.variables,
        }
        try:
            kind, text = self.request(b"L" + orjson.dumps(settings))
        except _HostDied as exc:
            self.close()
            raise TransformSyntaxError(f"the JavaScript engine did not start: {exc}") from None
        if kind == "S":
            self.close()
            raise TransformSyntaxError(text or "the transform does not compile")

    def call(self, event_json: str) -> tuple[str, str | None]:
        """("O", result JSON), ("O", None) for null, or ("E", the engine's error line)."""
        return self.request(b"R" + event_json.encode("utf-8", "surrogatepass"))

    def request(self, payload: bytes) -> tuple[str, str | None]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(HEADER.pack(len(payload)) + payload)
            stdin.flush()
            if not select.select([stdout], [], [], self.wall_limit)[0]:
                self.close()
                raise _HostDied(f"the transform did not answer within {self.wall_limit:g} s and was stopped")
            answer = read_frame(stdout, MAX_RESULT_BYTES + 1)
        except OverflowError as exc:  # not read: the engine with the rest of it in its pipe goes
            self.close()
            raise _HostDied(str(exc)) from None
        except (BrokenPipeError, OSError, ValueError) as exc:
            answer = None
            if isinstance(exc, ValueError):  # the pipe was closed under us
                raise _HostDied("the JavaScript engine was stopped") from None
        if answer is None:
            code = self.close()
            raise _HostDied(f"the JavaScript engine crashed on this event (exit status {code})")
        kind, body = answer[:1].decode(), answer[1:].decode("utf-8", "surrogatepass")
        if kind == "N":
            return "O", None
        return kind, body

    def close(self) -> int | None:
        """Stops the process (if still running); its exit status."""
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


_local = threading.local()


def _forget(transform: Transform) -> None:
    runners: dict[Any, _Runner] | None = getattr(_local, "runners", None)
    runner = runners.pop(transform.key, None) if runners is not None else None
    if runner is not None:
        runner.close()


def _context(transform: Transform) -> _Runner:
    """This thread's runner of `transform`, started on first use."""
    runners: dict[Any, _Runner] | None = getattr(_local, "runners", None)
    if runners is None:
        runners = _local.runners = {}
    runner = runners.get(transform.key)
    if runner is None:
        if len(runners) >= MAX_CONTEXTS:
            for old in runners.values():
                old.close()
            runners.clear()
        runner = runners[transform.key] = _Runner(transform)
    return runner
