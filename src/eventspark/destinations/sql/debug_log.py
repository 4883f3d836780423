"""EventNative's `sql_debug_log`: the statements of the SQL destinations appended to files.

`ddl` gets CREATE / ALTER / DROP / TRUNCATE statements, `queries` every other statement, one line
each: `<UTC time> [<destination id>] <statement>` (whitespace folded to one line, at most
`MAX_STATEMENT_CHARS`). Parameter values are never written (they are events' values and may be
secrets): a statement with parameters ends with `; <n> parameter(s)`. Keys written into a
statement as literals (the COPY of Redshift and Snowflake: `SECRET_ACCESS_KEY '...'`,
`AWS_SECRET_KEY = '...'`, tokens, passwords) are written as `'***'`.

Every `SqlWarehouse` client is wrapped where it is opened (`wrap`), so the statements of every SQL
destination are seen: patching, commits, stream inserts, marker reads. The files are written by
the process that `configure`d them: `serve`'s serving process (stream workers, the batch pass's
driver). Spark executors do not log: they only write stages (COPY, bulk loads), which never go
through `execute`.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eventspark.config.models import SqlDebugLogConfig, SqlDebugLogTarget
from eventspark.logconfig import RotatingFile

log = logging.getLogger(__name__)

MAX_STATEMENT_CHARS = 10_000
DDL_WORDS = frozenset({"CREATE", "ALTER", "DROP", "TRUNCATE", "RENAME", "COMMENT"})
_SPACES = re.compile(r"\s+")
_SECRETS = re.compile(
    r"\b(SECRET_ACCESS_KEY|SESSION_TOKEN|AWS_SECRET_KEY|AWS_TOKEN|AZURE_SAS_TOKEN|PASSWORD|IDENTIFIED\s+BY)"
    r"(\s*=?\s*)'(?:[^']|'')*'",
    re.IGNORECASE,
)
"""Keys and passwords written as literals into a statement (Redshift's and Snowflake's COPY)."""
_lock = threading.Lock()
_files: dict[str, RotatingFile | None] = {"ddl": None, "queries": None}
_inside = threading.local()
_classes: dict[tuple[type, str], type] = {}


def configure(section: SqlDebugLogConfig | None) -> None:
    """This process's files (none: nothing is logged); opened when a first statement is written."""
    with _lock:
        by_path: dict[Path, RotatingFile] = {}
        for kind in ("ddl", "queries"):
            target: SqlDebugLogTarget | None = getattr(section, kind, None) if section is not None else None
            if target is None:
                _files[kind] = None
                continue
            path = _file_path(target.path, kind)
            _files[kind] = by_path.setdefault(path, RotatingFile(path, target.rotation_min, target.max_backups))


def _file_path(path: str, kind: str) -> Path:
    """`path` itself when it names a `.log` file, else `<path>/<kind>.log`."""
    given = Path(path)
    return given if given.suffix == ".log" and not given.is_dir() else given / f"{kind}.log"


def wrap(client: Any, dest_id: str) -> Any:
    """`client` logging the statements of its `execute` and `rows`, when anything is configured.

    The client becomes an instance of a subclass of its own class (one per class and destination)
    whose two methods log first: packages check their client's type, and clients with __slots__
    or frozen dataclasses cannot take new attributes."""
    if _files["ddl"] is None and _files["queries"] is None:
        return client
    try:  # object's own __setattr__: a frozen dataclass refuses every other assignment
        object.__setattr__(client, "__class__", _logged_class(type(client), dest_id))
    except TypeError as exc:
        log.warning("sql_debug_log: the statements of %s cannot be logged: %s", dest_id, exc)
    return client


def _logged_class(cls: type, dest_id: str) -> type:
    with _lock:
        found = _classes.get((cls, dest_id))
        if found is None:
            namespace: dict[str, Any] = {"__slots__": (), "__module__": cls.__module__}
            for name in ("execute", "rows"):
                if callable(getattr(cls, name, None)):
                    namespace[name] = _logged(getattr(cls, name), dest_id)
            found = _classes[(cls, dest_id)] = type(cls.__name__, (cls,), namespace)
        return found


def _logged(method: Callable[..., Any], dest_id: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, statement: str, *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "call", False):  # `rows` built on `execute` (ClickHouse): one line
            return method(self, statement, *args, **kwargs)
        params = args[1] if len(args) > 1 else kwargs.get("params")
        log_statement(dest_id, statement, params)
        _inside.call = True
        try:
            return method(self, statement, *args, **kwargs)
        finally:
            _inside.call = False

    return call


def statement_line(dest_id: str, statement: str | bytes, params: Any = None) -> str:
    text = statement.decode("utf-8", "replace") if isinstance(statement, bytes) else statement
    text = _SECRETS.sub(r"\1\2'***'", _SPACES.sub(" ", text).strip())
    if len(text) > MAX_STATEMENT_CHARS:
        text = text[:MAX_STATEMENT_CHARS] + f"... ({len(text)} chars)"
    count = len(params) if isinstance(params, (list, tuple, dict)) else 0  # not ClickHouse's rows (bytes)
    suffix = f"; {count} parameter(s)" if count else ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    return f"{stamp} [{dest_id}] {text}{suffix}"


def log_statement(dest_id: str, statement: str | bytes, params: Any = None) -> None:
    head = statement[:40].decode("utf-8", "replace") if isinstance(statement, bytes) else statement[:40]
    words = head.split(None, 1)
    kind = "ddl" if words and words[0].upper() in DDL_WORDS else "queries"
    file = _files[kind]
    if file is not None:
        file.write(statement_line(dest_id, statement, params))
