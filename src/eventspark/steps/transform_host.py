"""The process that runs one JavaScript transform (`steps/transform.py` starts it).

QuickJS can crash its process on some out-of-memory paths, so the engine lives here, in a child
process of the worker or executor that needs it: a crash costs one event and a restart, never the
worker. Frames on stdin/stdout are a 4-byte big-endian length and a payload whose first byte says
what it is: `L` + JSON {source, timeout_ms, memory_mb, stack_bytes, variables} loads the
transform (answer `K`, or `S` + the syntax error); `R` + the event as JSON runs it (answer `O` +
the result as JSON, `N` for null/undefined, or `E` + the error). EOF on stdin ends the process.
Imports only quickjs and orjson: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any, BinaryIO

import orjson

HEADER = struct.Struct(">I")

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
    while (frame := read_frame(stdin)) is not None:
        kind, payload = frame[:1], frame[1:]
        if kind == b"L":
            try:
                context, function = load(orjson.loads(payload))
            except Exception as exc:  # the engine's SyntaxError, or a limit hit while loading
                write_frame(stdout, b"S" + (first_line(exc) or "the transform does not compile").encode())
                continue
            write_frame(stdout, b"K")
        elif kind == b"R" and function is not None:
            try:
                result = function(payload.decode())
            except Exception as exc:  # every engine error fails the event alone
                context.gc()  # free what the failed call left behind
                write_frame(stdout, b"E" + first_line(exc).encode())
                continue
            write_frame(stdout, b"N" if result is None else b"O" + str(result).encode())
        else:
            write_frame(stdout, b"E" + b"no transform loaded")


def main() -> None:
    os.environ.pop("PYTHONSTARTUP", None)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
