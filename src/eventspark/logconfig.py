"""The process's own log: text (default) or JSON lines, with request and job ids.

`server.log.format: json` makes every line one JSON object: `time` (UTC, RFC 3339 with
milliseconds), `level`, `logger`, `message`, `exception` when there is one, `request_id` for lines
logged while the collector handles a request, `job_id` for lines of a batch pass or a replay.

Ids live in context variables, so they follow a request into `asyncio.to_thread` and stay out
of other requests and threads:
- the collector sets `REQUEST` to the request's ASGI scope (one `ContextVar.set`, nothing else on
  the hot path); the id itself is made only when a line is logged: the client's `X-Request-Id`
  when it is safe (`SAFE_REQUEST_ID`), else a random one, kept in the scope for later lines;
- `job(kind)` sets `JOB_ID` for a batch pass or a replay (driver-side lines: Spark's executors log
  in their own processes).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from pathlib import Path
from typing import IO, Any, TextIO, TypeVar

import orjson

REQUEST: ContextVar[dict[str, Any] | None] = ContextVar("eventspark_request", default=None)
"""The ASGI scope of the request being handled (set by `eventspark.collector.app`)."""
JOB_ID: ContextVar[str | None] = ContextVar("eventspark_job_id", default=None)
REQUEST_ID_KEY = "eventspark.request_id"
"""Where the request's id is kept in its scope once made."""
SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

F = TypeVar("F", bound=Callable[..., Any])


def request_id(scope: dict[str, Any]) -> str:
    """The id of the request of `scope`: made on first use, the same afterwards."""
    found = scope.get(REQUEST_ID_KEY)
    if found is None:
        found = _incoming_id(scope) or uuid.uuid4().hex
        scope[REQUEST_ID_KEY] = found
    return found


def _incoming_id(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if SAFE_REQUEST_ID.fullmatch(text) else None
    return None


def new_job_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:12]}"


@contextmanager
def job(kind: str, job_id: str | None = None) -> Iterator[str]:
    """Lines logged inside carry `job_id` (a new `<kind>-<hex>` unless given)."""
    token = JOB_ID.set(job_id or new_job_id(kind))
    try:
        yield JOB_ID.get() or ""
    finally:
        JOB_ID.reset(token)


def in_job(kind: str) -> Callable[[F], F]:
    """Decorator: every call of the function is a job of `kind` (see `job`)."""

    def decorate(func: F) -> F:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with job(kind):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


class ContextIds(logging.Filter):
    """Adds `request_id` and `job_id` (or None) to every record, in the thread that logs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = REQUEST.get()
        record.request_id = request_id(scope) if scope is not None else None
        record.job_id = JOB_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module doc)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _message(record),
        }
        for key in ("request_id", "job_id"):
            value = getattr(record, key, None)
            if value is not None:
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(data).decode()
        except TypeError:  # lone surrogates (from `surrogateescape`, JSON's "\ud800"): escaped, not lost
            return orjson.dumps({k: _escaped(v) for k, v in data.items()}).decode()


def _message(record: logging.LogRecord) -> str:
    """The record's message; a call whose arguments do not fit its format still gives a line."""
    try:
        return record.getMessage()
    except Exception as exc:
        return f"{record.msg!r} % {record.args!r} (the log call failed: {type(exc).__name__}: {exc})"


def _escaped(value: Any) -> Any:
    return value.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(value, str) else value


def _utc(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a line is logged: a progress bar on a terminal
    redirects it, and then prints the line above itself instead of through it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always the current sys.stderr


def configure(
    log_format: str = "text", level: str = "info", verbose: bool = False, stream: TextIO | None = None
) -> None:
    """Replaces the root logger's handlers with one on `stream` (stderr) in `log_format` at
    `level` (DEBUG when `verbose`)."""
    handler = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handler.addFilter(ContextIds())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else level.upper(), handlers=[handler], force=True)


class RotatingFile:
    """Lines appended to `path`, renamed to `<stem>-<UTC time><suffix>` every `rotation_min`
    minutes with at most `max_backups` renamed files kept (0: all). Thread-safe; opened on the
    first line. Only the process that made it rotates (the serving process): a forked process
    writes on, reopening the file once it has been renamed (the server's log of collector workers)."""

    def __init__(self, path: Path, rotation_min: float, max_backups: int) -> None:
        self.path = path
        self.period = rotation_min * 60
        self.max_backups = max_backups
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._inode = 0
        self._next = time.time() + self.period

    def write(self, line: str) -> None:
        data = line.encode("utf-8", "backslashreplace") + b"\n"
        with self._lock:
            if os.getpid() == self._owner and time.time() >= self._next:
                self._rotate()
            self._reopen_if_moved()
            assert self._file is not None
            self._file.write(data)
            self._file.flush()

    def _reopen_if_moved(self) -> None:
        try:
            moved = os.stat(self.path).st_ino != self._inode
        except FileNotFoundError:
            moved = True
        if self._file is None or moved:
            if self._file is not None:
                self._file.close()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("ab")
            self._inode = os.fstat(self._file.fileno()).st_ino

    def _rotate(self) -> None:
        self._next = time.time() + self.period
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path.exists() and self.path.stat().st_size:
            stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime())
            self.path.rename(self.path.with_name(f"{self.path.stem}-{stamp}{self.path.suffix}"))
        if self.max_backups:
            backups = sorted(self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}"))
            for old in backups[: -self.max_backups]:
                old.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class FileLogHandler(logging.Handler):
    """The server's log also written to `server.log.path` (a `RotatingFile`)."""

    def __init__(self, file: RotatingFile) -> None:
        super().__init__()
        self.file = file

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.file.write(self.format(record))
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self.file.close()
        super().close()


SERVER_LOG_FILE = "eventspark.log"
"""The server's log file in `server.log.path`."""


def add_log_file(directory: str, log_format: str, rotation_min: float, max_backups: int) -> Path:
    """Adds a handler writing the root logger's lines to `<directory>/eventspark.log` as well."""
    path = Path(directory) / SERVER_LOG_FILE
    handler = FileLogHandler(RotatingFile(path, rotation_min, max_backups))
    handler.addFilter(ContextIds())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.getLogger().addHandler(handler)
    return path
