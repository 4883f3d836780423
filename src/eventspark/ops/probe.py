"""Destination tests: validate one destination's config and prove it works, in bounded time.

`POST /api/v1/destinations/test` (a config from the request body) and `eventspark check
--connect` (every destination of a config file) both come here. The config is validated with
the config loader's own model (`config.models.Destination`), the adapter is built as the node
builds it, and the type's probe (`DestinationType.probe`: a probe table for SQL warehouses, a
probe object for S3/GCS, a validation request or a connection for HTTP services) runs on a
daemon thread, so that a black-holed host can delay neither the event loop nor the process's
exit; the caller stops waiting after `timeout` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from eventspark.destinations.base import DestinationError, TransientError
from eventspark.destinations.registry import destination_type

DEFAULT_TIMEOUT = 20.0
MAX_TIMEOUT = 120.0
DUCKDB_SUFFIXES = (".duckdb", ".ddb", ".db")
"""The names a DuckDB file tested over HTTP may have (see `check_confined`)."""
MAX_CONCURRENT = 4
"""Destination tests running at once in one process; more are refused (each may hold a thread
until its drivers' own timeouts end it)."""

T = TypeVar("T")
_slots = threading.BoundedSemaphore(MAX_CONCURRENT)


class ProbeTimeout(TransientError):
    """The probe did not finish in time (its thread is left to the drivers' own timeouts)."""


class Busy(Exception):
    """`MAX_CONCURRENT` tests are already running in this process."""


def parse_destination(raw: Any) -> Any:
    """A destination config (the YAML block, as JSON; `config:` or the type's own block) as the
    config loader validates it; ValueError listing what is wrong."""
    from eventspark.config.loading import format_validation_error
    from eventspark.config.models import Destination

    if not isinstance(raw, dict):
        raise ValueError(f"a destination config is a JSON object, got {type(raw).__name__}")
    try:
        return TypeAdapter(Destination).validate_python(raw)
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc).replace("invalid config:", "invalid destination:")) from None


def probe_destination(
    dest_id: str, dest: Any, events_dir: Path, send_event: bool = False, confine: bool = False
) -> str:
    """Builds the adapter and runs its type's probe (blocking); what was checked, or
    DestinationError. `confine`, for configs that come over HTTP: the node's own files stay its
    own (a DuckDB path under `events_dir` with a database's name, no key file path)."""
    entry = destination_type(dest.type)
    if confine:
        check_no_key_path(dest)
    adapter = entry.build(dest_id, dest, events_dir)
    if confine:
        check_confined(adapter, events_dir)
    return entry.run_probe(adapter, send_event)


def check_confined(adapter: Any, events_dir: Path) -> None:
    """ValueError when the adapter's local file (`path`: DuckDB's) is outside `events_dir` or is
    not named like a database."""
    path = getattr(adapter, "path", None)
    if not isinstance(path, Path):
        return
    if not path.resolve().is_relative_to(events_dir.resolve()):
        raise ValueError(
            f"a destination tested over HTTP keeps its files under log.path ({events_dir}): use a relative path"
        )
    # log.path also holds the node's logs: a database created under a rotated log's name
    # (`incoming/incoming.tok=web-<time>.log`) would be read by the next batch pass as events.
    if path.suffix.lower() not in DUCKDB_SUFFIXES:
        raise ValueError(f"a DuckDB file tested over HTTP is named *{', *'.join(DUCKDB_SUFFIXES)}")


def check_no_key_path(config: Any) -> None:
    """ValueError when a block of the config has a `key_file` that is a path, or names an
    endpoint without keys of its own: over HTTP the keys come in the body, so that a caller
    cannot make the node send its own credentials (a key file, the environment's) to a host the
    caller chose (Google's clients send a bearer token to the endpoint)."""
    for block in _models(config):
        key = getattr(block, "key_file", None)
        if isinstance(key, str) and key.strip() and not key.strip().startswith("{"):
            raise ValueError("a destination tested over HTTP gives key_file as the key's JSON, not as a path")
        endpoint = any(getattr(block, name) for name in type(block).model_fields if name.endswith("endpoint"))
        keyless = any(
            name in type(block).model_fields and not getattr(block, name) for name in ("key_file", "access_key_id")
        )
        if endpoint and keyless:
            raise ValueError("a destination tested over HTTP that names an endpoint gives its own keys")


def _models(model: Any, depth: int = 0) -> list[Any]:
    """`model` and the pydantic models in its fields, a few levels deep (the config's blocks)."""
    found = [model]
    if depth < 4:
        for name in type(model).model_fields:
            value = getattr(model, name, None)
            if isinstance(value, BaseModel):
                found += _models(value, depth + 1)
    return found


def run_bounded(work: Callable[[], T], timeout: float) -> T:
    """`work()` on a daemon thread; ProbeTimeout after `timeout` seconds, Busy when too many run."""
    answers: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    _start(work, lambda ok, value: answers.put((ok, value)))
    try:
        ok, value = answers.get(timeout=timeout)
    except queue.Empty:
        raise ProbeTimeout(f"no answer within {timeout:g} s") from None
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


async def run_bounded_async(work: Callable[[], T], timeout: float) -> T:
    """`run_bounded` for a coroutine: the event loop waits without blocking."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def answer(ok: bool, value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, ok, value)

    _start(work, answer)
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        raise ProbeTimeout(f"no answer within {timeout:g} s") from None


def run_all(works: dict[str, Callable[[], str]], timeout: float) -> dict[str, tuple[bool, str]]:
    """Every work at once, each on a daemon thread (not counted against `MAX_CONCURRENT`: for
    the CLI), all within one `timeout`: name → (ok, what was checked or why it failed)."""
    answers: queue.SimpleQueue[tuple[str, bool, Any]] = queue.SimpleQueue()

    def run(name: str, work: Callable[[], str]) -> None:
        try:
            answers.put((name, True, work()))
        except Exception as exc:
            answers.put((name, False, exc))

    for name, work in works.items():
        threading.Thread(target=run, args=(name, work), name=f"probe-{name}", daemon=True).start()
    results: dict[str, tuple[bool, str]] = {}
    deadline = time.monotonic() + timeout
    while len(results) < len(works):
        try:
            name, ok, value = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        results[name] = (True, value) if ok else (False, f"{failure_message(value)}: {value}")
    for name in works.keys() - results.keys():
        results[name] = (False, f"{failure_message(ProbeTimeout(''))}: no answer within {timeout:g} s")
    return results


def _start(work: Callable[[], Any], answer: Callable[[bool, Any], None]) -> None:
    if not _slots.acquire(blocking=False):
        raise Busy(f"{MAX_CONCURRENT} destination tests are already running; try again later")

    def run() -> None:
        try:
            result = work()
        except Exception as exc:
            answer(False, exc)
        else:
            answer(True, result)
        finally:
            _slots.release()

    threading.Thread(target=run, name="destination-probe", daemon=True).start()


def failure_message(exc: BaseException) -> str:
    """The `message` of a failed test's answer (its `error` is the warehouse's own text)."""
    if isinstance(exc, ProbeTimeout):
        return "The destination did not answer in time"
    if isinstance(exc, TransientError):
        return "Unable to connect to the destination. Please check the access"
    if isinstance(exc, DestinationError):
        return "The destination refused the test"
    return "The destination config cannot be used"
