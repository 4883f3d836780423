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
import os
import select
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

import orjson

from eventspark.steps.transform_host import BATCH_ANSWER_BYTES, HEADER, read_frame

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
BATCH_EVENTS = 500
BATCH_BYTES = 4 * 1024 * 1024
"""`run_many` sends at most this many events (and bytes of them) per round trip to the engine:
one round trip per event costs more than a trivial transform itself."""
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
        """A transform whose syntax was checked now (TransformSyntaxError otherwise). The engine
        that checked it is not kept (chains are often built in one thread and run in another:
        serve's stream workers), unless this thread already had one running the transform."""
        transform = cls(source, **limits)
        runners: dict[Any, _Runner] | None = getattr(_local, "runners", None)
        if runners is None or transform.key not in runners:
            _Runner(transform).close()
        return transform

    def close(self) -> None:
        """Stops this thread's engine of the transform (the next run starts a new one)."""
        _forget(self)

    def run(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The events the transform makes of `event` (none: skip it); raises TransformFailed."""
        return parse_result(self.run_text(orjson.dumps(event).decode()))

    def run_text(self, event_json: str) -> str | None:
        """The transform's result as JSON text (None for null/undefined); raises TransformFailed."""
        outcome = self._run_alone(event_json)
        if isinstance(outcome, TransformFailed):
            raise outcome
        return outcome

    def run_many(self, events_json: list[str]) -> list[str | TransformFailed | None]:
        """`run_text` of each event, in order, the failures returned rather than raised; many
        events per round trip to the engine, each with its own limits. When the engine's process
        dies on a batch (QuickJS can crash on a huge allocation), the batch's events run again one
        by one, each in a fresh engine if need be: the event that kills it fails alone."""
        outcomes: list[str | TransformFailed | None] = []
        start = 0
        while start < len(events_json):
            batch = _next_batch(events_json, start)
            try:
                answers = _context(self).call_many(batch)
            except _HostDied:
                _forget(self)
                outcomes.extend(self._run_alone(text) for text in batch)
                start += len(batch)
                continue
            outcomes.extend(self._outcome(kind, text) for kind, text in answers)
            start += len(answers)  # the engine may answer fewer (a large answer): the rest again
        return outcomes

    def _run_alone(self, event_json: str) -> str | TransformFailed | None:
        try:
            kind, text = _context(self).call(event_json)
        except _HostDied as exc:  # the engine crashed (or overran the wall-clock guard): a new one next time
            _forget(self)
            return TransformFailed(str(exc))
        return self._outcome(kind, text)

    def _outcome(self, kind: str, text: str | None) -> str | TransformFailed | None:
        if kind == "E":
            return TransformFailed(_describe(text or "", self))
        if text is not None and len(text) > MAX_RESULT_BYTES:
            return TransformFailed(f"the result is larger than {MAX_RESULT_BYTES // (1024 * 1024)} MiB")
        return text


def _next_batch(events_json: list[str], start: int) -> list[str]:
    """The events from `start` that go in one round trip (at least one)."""
    end, size = start, 0
    while end < len(events_json) and end - start < BATCH_EVENTS and (end == start or size < BATCH_BYTES):
        size += len(events_json[end])
        end += 1
    return events_json[start:end]


def parse_result(text: str | None) -> list[dict[str, Any]]:
    """EventNative's rules: null → skip; an object; an array of objects where null, undefined
    and false are ignored (anything else, `true` included, fails the event)."""
    if text is None:
        return []
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:  # e.g. a lone surrogate the engine let through
        raise TransformFailed(f"the result is not valid JSON: {exc}") from None
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

    __slots__ = ("process", "timeout_sec", "wall_limit")

    def __init__(self, transform: Transform) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "eventspark.steps.transform_host", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        # The engine limits CPU time; this bounds wall-clock time too (a starved or stuck engine).
        self.wall_limit = max(WALL_LIMIT_MIN_SEC, transform.timeout_ms / 1000 * WALL_LIMIT_FACTOR)
        self.timeout_sec = transform.timeout_ms / 1000
        settings = {
            "source": transform.source,
            "timeout_ms": transform.timeout_ms,
            "memory_mb": transform.memory_mb,
            "stack_bytes": STACK_BYTES,
            "max_result_bytes": MAX_RESULT_BYTES,
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

    def call_many(self, events_json: list[str]) -> list[tuple[str, str | None]]:
        """The answers to the first events of `events_json` (at least one), as `call`'s."""
        parts = [b"M"]
        for text in events_json:
            data = text.encode("utf-8", "surrogatepass")
            parts.append(HEADER.pack(len(data)))
            parts.append(data)
        # Each event may use the whole CPU-time limit: the guard grows with the batch.
        wall = self.wall_limit + len(events_json) * self.timeout_sec * 2
        answer = self._exchange(b"".join(parts), wall, BATCH_ANSWER_BYTES + MAX_RESULT_BYTES + 1)
        if answer[:1] != b"M":
            raise _HostDied(f"the JavaScript engine answered {answer[:80]!r}")
        return _unpack_answers(memoryview(answer), len(events_json))

    def request(self, payload: bytes) -> tuple[str, str | None]:
        answer = self._exchange(payload, self.wall_limit, MAX_RESULT_BYTES + 1)
        kind, body = answer[:1].decode(), answer[1:].decode("utf-8", "surrogatepass")
        if kind == "N":
            return "O", None
        return kind, body

    def _exchange(self, payload: bytes, wall: float, limit: int) -> bytes:
        """Sends one frame, returns the answer's; _HostDied when the engine is gone or stuck."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(HEADER.pack(len(payload)) + payload)
            stdin.flush()
            if not select.select([stdout], [], [], wall)[0]:
                self.close()
                raise _HostDied(f"the transform did not answer within {wall:g} s and was stopped")
            answer = read_frame(stdout, limit)
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
        return answer

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


def _unpack_answers(view: memoryview, most: int) -> list[tuple[str, str | None]]:
    """The (kind, text) answers of an `M` frame (`N` becomes ("O", None), as in `request`)."""
    answers: list[tuple[str, str | None]] = []
    offset = 1
    while offset < len(view) and len(answers) < most:
        kind = chr(view[offset])
        length = HEADER.unpack_from(view, offset + 1)[0]
        offset += 1 + HEADER.size
        text = bytes(view[offset : offset + length]).decode("utf-8", "surrogatepass")
        offset += length
        answers.append(("O", None) if kind == "N" else (kind, text))
    if not answers:
        raise _HostDied("the JavaScript engine answered no event")
    return answers


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
