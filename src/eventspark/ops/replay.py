"""Replaying a failed file or an archived log through the pipeline again.

`plan_replay` checks a request (the file name comes from the internet: only files inside
`failed/` or `archive/` of this `log.path`), finds the destinations and refuses what was
replayed already (409, unless forced). `hand_over` then gives the events durably to the pipeline:

* a batch destination gets a replay log `incoming/replay.dst=<id>-<stamp>-<tag>.log`
  (`logs.replay`), written under a temporary name, fsynced, then renamed: the next batch pass
  loads it into that destination only, with a status file and load markers like any rotated log;
* a stream destination gets the events in its persistent queue under the writer name `replay`
  (the collector's writers are `main` and `w<n>`, so the two never share a segment).

A failed file is first *moved* into `failed/replayed/<replay id>/` (never removed): new failures,
including the events of this replay that fail again, go to a new `failed.dst=<id>.log`, so the
listing shows what remains. The move waits for a batch pass's appends to that file and first cuts
off what a pass that died while appending left (`logs.failed.quiet_failed_log`: those lines go to
the new file, once). Failed records are replayed from their original `event`. The writers are in
`ops.replay_sinks`.

The record (`failed/replayed/<id>/replay.json`) says how far a replay got: `state` `started`
(running, or the process died: some events may have been handed over), `interrupted` (an error:
each destination's entry has `events` when some were handed over), `handed` (all of them). A
source counts as replayed into a destination that got some of its events, or when its replay
stopped in `started`: only then is a replay again refused without `force`.
`run_batch_pass` then asks the serving node for a pass (`ops.passes`), or runs one here when no
node serves the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

from eventspark.config import LoadedConfig
from eventspark.config.models import Config
from eventspark.config.routing import token_routes
from eventspark.logs.failed import quiet_failed_log
from eventspark.logs.incoming import ServerLock, ServerLockHeld, parse_log_name
from eventspark.logs.replay import replay_destination
from eventspark.logs.status import replace_file, sync_dir
from eventspark.ops.fallback import (
    FAILED_DIR,
    RECORD_FILE,
    REPLAYED_DIR,
    failed_destination,
    replay_records,
    replay_running,
)
from eventspark.ops.passes import request_pass, wait_answer
from eventspark.ops.replay_sinks import Sink, SinkBusy, open_sink, write_all

MAX_NAME_CHARS = 512
MAX_SEGMENT_BYTES = 255
FILE_FORMATS = ("failed", "raw_json")
"""`failed`: EventError lines (`{"event", "error", "event_id"}`), the default in `failed/`;
`raw_json`: one event per line, the default in `archive/`."""
WRITE_BATCH = 1000
SETTLE_SECONDS = 0.1
"""How long a moved failed file must not grow before its replay has read it all (`_lines`)."""
_STREAM_ARCHIVE_NAME = re.compile(
    r"^streaming-archive\.dst=(?P<dst>.+?)(?:-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3})?\.log$"
)
"""`stream.archive`'s names, live and rotated."""

log = logging.getLogger(__name__)


class ReplayError(Exception):
    """A request that cannot be replayed: its HTTP status, message and detail."""

    def __init__(self, status: int, message: str, error: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error = error


@dataclass(slots=True)
class ReplayPlan:
    """What a replay will do; nothing is changed until `hand_over`."""

    file_name: str
    """The source relative to `log.path`: `failed/...` or `archive/...`."""
    path: Path
    kind: str
    """`failed` (pending), `replayed` (a failed file moved by an earlier replay) or `archive`."""
    file_format: str
    targets: dict[str, str]
    """Destination id → its mode (`batch` or `stream`)."""
    previous: list[str] = field(default_factory=list)
    """Ids of earlier replays of the same source into one of these destinations (forced)."""


# --- checking a request ---------------------------------------------------------------------------


def resolve_source(log_path: Path, file_name: Any) -> tuple[str, Path, str]:
    """(name relative to log.path, path, kind) of a requested file; 400 for a name that could
    leave `failed/` or `archive/`, 404 for a missing file."""
    if not isinstance(file_name, str) or not file_name or len(file_name) > MAX_NAME_CHARS:
        raise ReplayError(400, "file_name must be a non-empty string", f"at most {MAX_NAME_CHARS} characters")
    if "\x00" in file_name or "\\" in file_name or file_name.startswith("/"):
        raise ReplayError(400, "Invalid file_name", "a name inside failed/ or archive/, without '\\' or a leading '/'")
    parts = file_name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ReplayError(400, "Invalid file_name", "no empty, '.' or '..' path segments")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES for part in parts) or not _encodable(
        file_name
    ):
        raise ReplayError(400, "Invalid file_name", f"UTF-8 names of at most {MAX_SEGMENT_BYTES} bytes per segment")
    if parts[0] not in (FAILED_DIR, "archive"):
        parts = [FAILED_DIR, *parts]  # names as the fallback listing gives them
    base = log_path / parts[0]
    path = base.joinpath(*parts[1:]) if len(parts) > 1 else base
    kind = _kind(parts)
    if kind is None:
        raise ReplayError(
            400, "Not a replayable file", "failed/failed.dst=<id>.log, a file of failed/replayed/ or archive/"
        )
    # Symbolic links must not lead out of the folder either.
    try:
        inside = path.resolve().is_relative_to(base.resolve()) and path.is_file()
    except OSError:
        inside = False
    if not inside:
        raise ReplayError(404, "File not found", file_name)
    return "/".join(parts), path, kind


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    return True


def _kind(parts: list[str]) -> str | None:
    name = parts[-1]
    if parts[0] == "archive":
        return "archive" if len(parts) > 1 and (name.endswith(".log.gz") or name.endswith(".log")) else None
    if failed_destination(name) is None:
        return None
    if len(parts) == 2:
        return "failed"
    return "replayed" if len(parts) == 4 and parts[1] == REPLAYED_DIR else None


def plan_replay(
    config: Config,
    file_name: Any,
    destination_id: Any = None,
    file_format: Any = None,
    force: bool = False,
) -> ReplayPlan:
    """Checks a replay request (module docstring); raises ReplayError (400, 404, 409)."""
    log_path = Path(config.log.path)
    try:
        name, path, kind = resolve_source(log_path, file_name)
    except ReplayError as exc:
        if exc.status != 404 or not _fetched_from_store(config, file_name):
            if exc.status == 404:
                refuse_replayed_name(log_path, file_name)
            raise
        name, path, kind = resolve_source(log_path, file_name)
    if file_format is not None and file_format not in FILE_FORMATS:
        raise ReplayError(400, "Unknown file_format", f"one of {', '.join(FILE_FORMATS)}")
    fmt = file_format or ("raw_json" if kind == "archive" else "failed")
    if destination_id is not None and (not isinstance(destination_id, str) or not destination_id):
        raise ReplayError(400, "destination_id must be a non-empty string")
    dest_ids = [destination_id] if destination_id is not None else default_destinations(config, path, kind)
    destinations = config.destinations
    unknown = [d for d in dest_ids if d not in destinations]
    if unknown:
        raise ReplayError(400, "Unknown destination", ", ".join(unknown))
    targets = {d: destinations[d].mode for d in dest_ids}
    unkeyed = sorted(d for d in dest_ids if not _replaces_events(config, d))
    if kind == "archive" and unkeyed and not force:
        raise ReplayError(
            409,
            "Would store events twice",
            f"{name} was loaded before it was archived and {', '.join(unkeyed)} does not upsert "
            "(no primary_key_fields, or a type that never replaces events): "
            "set force to replay it anyway (e.g. into a destination added since, or after deleting its rows)",
        )
    plan = ReplayPlan(name, path, kind, fmt, targets)
    plan.previous = earlier_replays(log_path, plan)
    if plan.previous and not force:
        raise ReplayError(
            409,
            "Already replayed",
            f"{name} was replayed into {', '.join(sorted(targets))} (replay {', '.join(plan.previous)}); "
            "set force to replay it again (keyed destinations upsert, others get the events twice)",
        )
    return plan


def _fetched_from_store(config: Config, file_name: str) -> bool:
    """With `log.remote`, an archived log is on the store: fetched here to be replayed
    (`ops.replay_archive`); a store that does not answer is a 502."""
    from eventspark.ops.replay_archive import StoreUnreachable, fetch_archived

    try:
        return fetch_archived(config, file_name)
    except StoreUnreachable as exc:
        raise ReplayError(502, "The store of log.remote did not answer", str(exc)) from None


def _replaces_events(config: Config, dest_id: str) -> bool:
    """Whether a destination stores an event sent twice once (an upsert on its key)."""
    from eventspark.destinations.registry import REGISTRY

    dest = config.destinations[dest_id]
    return bool(dest.data_layout.primary_key_fields) and REGISTRY[dest.type].capabilities.upsert != "none"


def refuse_replayed_name(log_path: Path, file_name: str) -> None:
    """409 for a failed file that a replay moved away and that nothing has failed into since."""
    name = file_name if file_name.startswith(f"{FAILED_DIR}/") else f"{FAILED_DIR}/{file_name}"
    for _folder, record in replay_records(log_path):
        if record.get("source") == name and record.get("moved_to"):
            moved = record["moved_to"].removeprefix(f"{FAILED_DIR}/")
            unfinished = "" if record.get("state") == "handed" else f" (it did not finish: replay {moved})"
            raise ReplayError(
                409,
                "Already replayed",
                f"replay {record['id']} moved {name} to {record['moved_to']}; no event has failed since{unfinished}",
            )


def default_destinations(config: Config, path: Path, kind: str) -> list[str]:
    """A failed file's destination; for an archived log, the destinations of its token (or the
    destination a streaming archive or a replay log was written for)."""
    name = path.name.removesuffix(".gz")
    if kind != "archive":
        return [failed_destination(name) or ""]
    stream = _STREAM_ARCHIVE_NAME.match(name)
    if stream is not None:
        return [stream.group("dst")]
    replayed_into = replay_destination(name)
    if replayed_into is not None:
        return [replayed_into]
    parsed = parse_log_name(name)
    if parsed is None:
        raise ReplayError(400, "destination_id is required", f"no destination is known for {path.name}")
    _secrets, by_token, default = token_routes(config.api_keys, config.destinations)
    found = list(by_token.get(parsed.token_id, default))
    if not found:
        raise ReplayError(400, "destination_id is required", f"token {parsed.token_id} has no destination")
    return found


def earlier_replays(log_path: Path, plan: ReplayPlan) -> list[str]:
    """Replays whose events were handed over from this source into one of the plan's destinations:
    those that read it (its `source`) and, for a moved failed file, the one that moved it."""
    if plan.kind == "failed":
        return []  # a pending failed file holds only events no replay has read (replays move it)
    found = []
    for folder, record in replay_records(log_path):
        same = plan.file_name in (record.get("source"), record.get("moved_to"))
        if same and any(_handed(record, dest_id) for dest_id in plan.targets):
            found.append(folder.name)
    return found


def _handed(record: dict[str, Any], dest_id: str) -> bool:
    """Whether some of a replay's events may have reached `dest_id` (module docstring)."""
    target = record.get("destinations", {}).get(dest_id)
    return target is not None and (record.get("state") == "started" or "events" in target)


# --- handing the events over ----------------------------------------------------------------------


def count_events(plan: ReplayPlan) -> tuple[int, int]:
    """(events, unreadable lines) the plan would replay (the dry run)."""
    events = unreadable = 0
    with _open_source(plan.path) as file:
        for line in file:
            if not line.strip():
                continue
            if event_line(line, plan.file_format) is None:
                unreadable += 1
            else:
                events += 1
    return events, unreadable


def event_line(line: bytes, file_format: str) -> bytes | None:
    """The event to replay from one line of the source, as one JSON line without newline; None
    for a line that holds none (it stays in the source file, which is never removed)."""
    line = line.strip()
    if file_format == "raw_json":
        return line or None
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or "event" not in record:
        return None
    event = record["event"]
    if isinstance(event, str):
        # A line that was not JSON when it arrived: replayed as it was, it fails again, with a reason.
        return event.replace("\n", " ").encode() or None
    return orjson.dumps(event)


def hand_over(config: Config, plan: ReplayPlan) -> dict[str, Any]:
    """Moves a failed file aside, writes its events durably to every target, records the replay;
    returns the record (`failed/replayed/<id>/replay.json`). Its folder is locked until it returns
    (`ops.fallback.replay_running`: the retention of `failed/` leaves a running replay alone)."""
    with contextlib.ExitStack() as running:
        return _hand_over(config, plan, running)


def _hand_over(config: Config, plan: ReplayPlan, running: contextlib.ExitStack) -> dict[str, Any]:
    log_path = Path(config.log.path)
    root = log_path / FAILED_DIR / REPLAYED_DIR
    root.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    replay_id = f"{now.strftime('%Y-%m-%dT%H-%M-%S')}-{uuid.uuid4().hex[:8]}"
    folder = root / replay_id
    with _replays_lock(root):
        if plan.kind != "failed" and earlier_replays(log_path, plan) != plan.previous:
            raise ReplayError(409, "Replayed meanwhile", f"{plan.file_name} was just replayed by another request")
        folder.mkdir()
        running.enter_context(replay_running(folder))
        record: dict[str, Any] = {
            "id": replay_id,
            "at": now.isoformat(),
            "source": plan.file_name,
            "file_format": plan.file_format,
            "state": "started",
            "destinations": {d: {"mode": mode} for d, mode in plan.targets.items()},
        }
        source = plan.path
        if plan.kind == "failed":
            # Moved first: failures appended from now on (this replay's too) start a new file.
            source = folder / plan.path.name
            try:
                _move_failed(plan.path, source)
            except FileNotFoundError:
                folder.rmdir()
                raise ReplayError(
                    409, "Replayed meanwhile", f"{plan.file_name} was just moved by another replay"
                ) from None
            sync_dir(plan.path.parent)
            record["moved_to"] = f"{FAILED_DIR}/{REPLAYED_DIR}/{replay_id}/{plan.path.name}"
        _write_record(folder, record)
    try:
        counts = _copy_events(log_path, source, plan, record)
    except BaseException as exc:
        record.update(state="interrupted", error=f"{type(exc).__name__}: {exc}")
        _write_record(folder, record)
        if isinstance(exc, SinkBusy):
            raise ReplayError(409, "Another replay writes this queue", str(exc)) from None
        raise
    record.update(counts, state="handed")
    _write_record(folder, record)
    return record


def _move_failed(path: Path, to: Path) -> None:
    """Renames a failed log with no batch append in flight, and without the lines a pass that
    died while appending left at its end: their groups are still parked and the next pass appends
    them to the new file, so that the replay does not bring them back too (`logs.failed`)."""
    with quiet_failed_log(path.parent, failed_destination(path.name) or ""):
        os.rename(path, to)


def _copy_events(log_path: Path, source: Path, plan: ReplayPlan, record: dict[str, Any]) -> dict[str, int]:
    targets = record["destinations"]
    sinks: dict[str, Sink] = {}
    finished: set[str] = set()
    events = unreadable = 0
    try:
        for dest_id, mode in plan.targets.items():
            sinks[dest_id] = open_sink(log_path, dest_id, mode)
        batch: list[bytes] = []
        for line in _lines(source):
            event = event_line(line, plan.file_format)
            if event is None:
                unreadable += line.strip() != b""
                continue
            batch.append(event + b"\n")
            events += 1
            if len(batch) >= WRITE_BATCH:
                write_all(list(sinks.values()), batch)
                batch = []
        write_all(list(sinks.values()), batch)
        for dest_id, sink in sinks.items():
            targets[dest_id].update(sink.finish())
            finished.add(dest_id)
    except BaseException:
        for dest_id, sink in sinks.items():
            if dest_id not in finished:
                targets[dest_id].update(sink.abort())
        raise
    return {"events": events, "unreadable": unreadable}


def _lines(source: Path) -> Iterator[bytes]:
    """Every line. A writer that opened a failed file just before the move may still append to it:
    after its end, the file is read again until `SETTLE_SECONDS` pass with nothing new, and a line
    such a writer had not finished at a read's end is joined with its rest."""
    with _open_source(source) as file:
        if source.suffix == ".gz":
            yield from file
            return
        partial = b""
        while True:
            grew = False
            for line in file:
                grew = True
                if not line.endswith(b"\n"):
                    partial += line
                    continue
                yield partial + line
                partial = b""
            if not grew:
                break
            time.sleep(SETTLE_SECONDS)
        if partial:
            yield partial  # a torn last line: it fails again, with its reason, or is unreadable


def _open_source(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")  # type: ignore[return-value]


@contextlib.contextmanager
def _replays_lock(root: Path) -> Iterator[None]:
    """Serialises the check and the record of concurrent replays (any process)."""
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_record(folder: Path, record: dict[str, Any]) -> None:
    replace_file(folder / RECORD_FILE, orjson.dumps(record, option=orjson.OPT_INDENT_2))


def save_pass(log_path: Path, record: dict[str, Any], request_id: str | None, answer: dict[str, Any] | None) -> None:
    """Adds the pass that loads the replay's batch logs to its record (the listing's statuses)."""
    for target in record["destinations"].values():
        if target.get("replay_log"):
            if request_id:
                target["request_id"] = request_id
            if answer is not None:
                target["pairs"] = answer.get("pairs", [])
    _write_record(log_path / FAILED_DIR / REPLAYED_DIR / record["id"], record)


def needs_batch_pass(record: dict[str, Any]) -> bool:
    return any(target.get("replay_log") for target in record["destinations"].values())


# --- the pass -------------------------------------------------------------------------------------


def node_serves(log_path: Path) -> bool:
    """Whether an `eventspark serve` holds this directory (its uploader then runs the passes)."""
    lock = ServerLock(log_path / "incoming")
    try:
        lock.acquire()
    except ServerLockHeld:
        return True
    lock.release()
    return False


def run_batch_pass(loaded: LoadedConfig, wait: float, reason: str) -> tuple[str | None, dict[str, Any] | None]:
    """(request id, the pass's answer): through the serving node's uploader, waiting up to `wait`
    seconds (answer None: not finished yet), or here and now when no node serves the directory."""
    log_path = Path(loaded.config.log.path)
    if node_serves(log_path):
        request_id = request_pass(log_path, reason)
        return request_id, wait_answer(log_path, request_id, wait)
    return None, run_local_pass(loaded)


def run_local_pass(loaded: LoadedConfig) -> dict[str, Any]:
    """One batch pass in this process (like `eventspark process`), as a pass answer."""
    from eventspark.batch.process import PassBusy, run_recorded, upload_local_logs
    from eventspark.batch.session import stop_session
    from eventspark.coordination import build_coordination
    from eventspark.ops.passes import summary_of
    from eventspark.progress import spark_tasks

    config = loaded.config
    coordination = build_coordination(config.coordination, config.server.name)
    started = time.time()
    try:
        upload_local_logs(config)  # with log.remote the pass reads the store: the replay logs go up first
        with spark_tasks("replay pass"):
            result = run_recorded(loaded, coordination)
    except PassBusy as exc:
        return {"status": "failed", "error": str(exc), "pairs": []}
    except Exception as exc:  # a failed Spark job: the replay logs stay for the next pass
        log.exception("the replay's batch pass failed")
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "pairs": []}
    finally:
        coordination.close()
        stop_session()
    status = "ok" if result.ok else "failed"
    return {"status": status, "started_at": started, "finished_at": time.time(), "error": "", **summary_of(result)}
