"""The process that runs one JavaScript transform (`steps/transform.py` starts it).

QuickJS can crash its process on some out-of-memory paths, so the engine lives here, in a child
process of the worker or executor that needs it: a crash costs one event and a restart, never the
worker. Frames on stdin/stdout are a 4-byte big-endian length and a payload whose first byte says
what it is: `L` + JSON {source, timeout_ms, memory_mb, stack_bytes, max_result_bytes, variables}
loads the transform (answer `K`, or `S` + the syntax error); `R` + the event as JSON runs it
(answer `O` + the result as JSON, `N` for null/undefined, or `E` + the error); `M` + events, each
a 4-byte length and its JSON, runs them one by one (each with the whole time limit) in one round
trip: the answer is `M` + per event a kind byte (`O`, `N`, `E`), a 4-byte length and its text. An
`M` answer may hold fewer answers than events (never none) when the answers grew past
`BATCH_ANSWER_BYTES`: the rest is asked again. EOF on stdin, or the parent's death, ends the
process. Imports only quickjs and orjson: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import struct
import sys
from typing import Any, BinaryIO

import orjson

HEADER = struct.Struct(">I")
BATCH_ANSWER_BYTES = 32 * 1024 * 1024
"""An `M` answer stops growing past this (the parent holds it in memory)."""
PR_SET_PDEATHSIG = 1  # <sys/prctl.h>

# The runner, as in EventNative: `$` and `_` are the event; `new Function` keeps the body inside
# its function; a body that is one expression returns its value.
PRELUDE = """
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


def read_frame(stream: BinaryIO, limit: int = 0) -> bytes | None:
    """One frame's payload, None at EOF; OverflowError for a frame longer than `limit` (if set)."""
    header = _read_exactly(stream, HEADER.size)
    if header is None:
        return None
    size = HEADER.unpack(header)[0]
    if limit and size > limit:
        raise OverflowError(f"the result is larger than {limit // (1024 * 1024)} MiB")
    return _read_exactly(stream, size)


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def load(settings: dict[str, Any]) -> Any:
    """A QuickJS context with the transform and its limits; its `__es_run` function."""
    import quickjs

    context = quickjs.Context()
    context.set_memory_limit(settings["memory_mb"] * 1024 * 1024)
    context.set_max_stack_size(settings["stack_bytes"])
    context.set_time_limit(settings["timeout_ms"] / 1000)
    for name, value in settings["variables"].items():
        context.set(name, value)
    context.eval(PRELUDE % orjson.dumps(settings["source"]).decode())
    return context, context.get("__es_run")


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answers frames until EOF."""
    context = function = None
    result_limit = 0
    while (frame := read_frame(stdin)) is not None:
        kind, payload = frame[:1], frame[1:]
        if kind == b"L":
            try:
                settings = orjson.loads(payload)
                context, function = load(settings)
            except Exception as exc:  # the engine's SyntaxError, or a limit hit while loading
                write_frame(stdout, b"S" + (first_line(exc) or "the transform does not compile").encode())
                continue
            result_limit = settings.get("max_result_bytes", 0)
            write_frame(stdout, b"K")
        elif kind == b"R" and function is not None:
            answer_kind, text = run_one(context, function, payload, result_limit)
            write_frame(stdout, answer_kind + text)
        elif kind == b"M" and function is not None:
            write_frame(stdout, b"M" + run_many(context, function, payload, result_limit))
        else:
            write_frame(stdout, b"E" + b"no transform loaded")


def run_one(context: Any, function: Any, event: bytes, result_limit: int) -> tuple[bytes, bytes]:
    """The answer's kind (`O`, `N`, `E`) and text for one event."""
    try:
        result = function(event.decode("utf-8", "surrogatepass"))
    except Exception as exc:  # every engine error fails the event alone
        context.gc()  # free what the failed call left behind
        return b"E", first_line(exc).encode("utf-8", "replace")
    if result is None:
        return b"N", b""
    text = str(result).encode("utf-8", "surrogatepass")
    if result_limit and len(text) > result_limit:
        return b"E", f"the result is larger than {result_limit // (1024 * 1024)} MiB".encode()
    return b"O", text


def run_many(context: Any, function: Any, payload: bytes, result_limit: int) -> bytes:
    """The answers to the events of an `M` frame, each run alone (its own time limit)."""
    view, offset, parts, size = memoryview(payload), 0, [], 0
    while offset < len(view) and (not parts or size < BATCH_ANSWER_BYTES):
        length = HEADER.unpack_from(view, offset)[0]
        offset += HEADER.size
        kind, text = run_one(context, function, bytes(view[offset : offset + length]), result_limit)
        offset += length
        parts.append(kind + HEADER.pack(len(text)) + text)
        size += len(text)
    return b"".join(parts)


def confine(parent: int) -> None:
    """Ends with the thread that started it (kill -9 included), and gives up what a JavaScript
    engine with no I/O never needs: new processes, written files, more file descriptors.
    QuickJS has none of these functions; this is the second wall, should a bug open a way."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: EOF on stdin still ends it
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent and os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(0)
    for limit, value in ((resource.RLIMIT_NPROC, 0), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_NOFILE, 16)):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(limit, (value, value))


def main() -> None:
    os.environ.pop("PYTHONSTARTUP", None)
    import quickjs  # noqa: F401  (before the limits: importing opens files)

    confine(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
