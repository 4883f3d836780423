"""The `failed/failed.dst=<destination_id>.log` files: one EventError JSON object per line.

A line is `{"event": <original event>, "error": "<reason>", "event_id": "<id>"}`. The Spark
executors spool the failures of a pass into files of their own; the driver appends a spool to the
destination's failed log once the pass's outcome for those events is final.

Every spool a batch pass appends is first *parked* in `failed/pending/<group>/` with a manifest
naming its (log, destination, table). Each failed line is appended exactly once, whatever point
a crash (or power loss) hits:

1. a pass parks its groups, commits its pairs (a commit leaves a load marker in the warehouse);
2. it writes the destination's *journal* `pending/journal.dst=<id>.json` (the failed log's size
   and inode before the appends, the groups appended), appends the groups of settled pairs and
   fsyncs the log;
3. it writes the status files (the outcome of pairs without a marker: only failures, given up,
   template failures);
4. it marks the journal done, removes the appended groups, then the journal.

The next pass, before it appends anything to that failed log, *recovers*: a journal not done
means "maybe appended": the log is truncated back to the journal's size (its lines are still
parked); a done journal only has its groups left to remove. Then each parked group is appended
(under a journal of its own) when its pair is settled (its load marker, or its log's status file;
a log no longer in incoming/ was archived, so settled), or dropped when it is not (the retry
spools those events again). A group whose pair failed is left parked until a pass can read the
markers: a commit whose answer was lost may have happened.

Truncating is safe because one pass at a time appends to a batch destination's failed log: passes
run under the node's batch lock (`log.path` is never shared between nodes), stream destinations
have failed logs of their own, and every journal lives under the *append lock*
(an `flock` of `failed/`, `appending`): a pass holds it from writing a journal to removing it, and
recovers under it. Whoever moves a failed log away (a replay, retention) takes that lock and
recovers first (`quiet_failed_log`): a journal found then belongs to a pass that died, and the
file moved holds no line that the next pass appends again. (Without it, a replay taking a file
with a dead pass's lines would bring them back while their groups are appended again.) The inode
check still leaves a moved or recreated file alone. Spools are fsynced by the executors,
manifests, journals and the failed log here, so a power loss loses none of it either.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from eventspark.logs.status import replace_file, sync_dir

log = logging.getLogger(__name__)

COPY_CHUNK = 1024 * 1024
PENDING_DIR = "pending"
JOURNAL_PREFIX = "journal.dst="


def failed_log_path(failed_dir: Path, dest_id: str) -> Path:
    return failed_dir / f"failed.dst={dest_id}.log"


def event_id_of(event: Any) -> str:
    """`eventn_ctx.event_id`, else the flat `eventn_ctx_event_id`, else ''."""
    if not isinstance(event, dict):
        return ""
    ctx = event.get("eventn_ctx")
    found = ctx.get("event_id") if isinstance(ctx, dict) else None
    if found is None:
        found = event.get("eventn_ctx_event_id")
    return found if isinstance(found, str) else "" if found is None else str(found)


def event_error_line(event: Any, error: str, event_id: str | None = None) -> bytes:
    """One EventError line (with its newline). `event` is the parsed event (or an
    `orjson.Fragment` of the line as received), or the raw line when it was not JSON, so that
    nothing the client sent is lost. `event_id` defaults to the id found in `event`."""
    record = {
        "event": event,
        "error": error,
        "event_id": event_id_of(event) if event_id is None else event_id,
    }
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)


# --- spools parked across a commit ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParkedSpools:
    """The failed-event spools of one (log, destination, table), parked while the pair commits."""

    manifest: Path
    log: str
    dest_id: str
    table: str
    spools: tuple[Path, ...]
    claimed: bool = False
    """Parked with a claim on `log.remote`'s store (`logs.store.ParkClaims`): appended only while
    the claim is there (another node's pass that spooled the same pair again removes it)."""

    @property
    def group_id(self) -> str:
        return self.manifest.parent.name


def park_spools(
    failed_dir: Path, log_name: str, dest_id: str, table: str, spools: list[Path], claimed: bool = False
) -> ParkedSpools:
    """Moves the spools under `failed/pending/` with a manifest naming their pair (module docstring)."""
    folder = failed_dir / PENDING_DIR / uuid.uuid4().hex
    folder.mkdir(parents=True)
    found = [spool for spool in spools if spool.exists()]
    if len(found) < len(spools):
        # Only on a cluster whose executors spool to their own disks: log.path must be shared.
        log.warning(
            "failed-event spools missing on this node (is log.path shared?): %d of %d",
            len(spools) - len(found),
            len(spools),
        )
    # shutil.move renames, or copies when the staging folder is on another file system.
    moved = tuple(Path(shutil.move(spool, folder / f"{index}.log")) for index, spool in enumerate(found))
    manifest = folder / "manifest.json"
    record = {"log": log_name, "dest": dest_id, "table": table, "spools": [p.name for p in moved], "claimed": claimed}
    replace_file(manifest, orjson.dumps(record))
    return ParkedSpools(manifest, log_name, dest_id, table, moved, claimed)


def parked_spools(failed_dir: Path) -> list[ParkedSpools]:
    """Every parked group a pass left behind; a folder without a manifest (cut short while parking) is removed."""
    found = []
    root = failed_dir / PENDING_DIR
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        if not folder.is_dir():
            continue  # a journal
        try:
            record = orjson.loads((folder / "manifest.json").read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            shutil.rmtree(folder, ignore_errors=True)  # its spools came from a pass that never committed
            continue
        spools = tuple(folder / name for name in record["spools"])
        claimed = record.get("claimed") is True
        found.append(
            ParkedSpools(folder / "manifest.json", record["log"], record["dest"], record["table"], spools, claimed)
        )
    return found


def remove_groups(groups: Iterable[ParkedSpools]) -> None:
    for group in groups:
        group.manifest.unlink(missing_ok=True)  # first: a folder without a manifest is never appended
        shutil.rmtree(group.manifest.parent, ignore_errors=True)


# --- appending exactly once -----------------------------------------------------------------------


def journal_path(failed_dir: Path, dest_id: str) -> Path:
    return failed_dir / PENDING_DIR / f"{JOURNAL_PREFIX}{quote(dest_id, safe='')}.json"


@contextmanager
def appending(failed_dir: Path) -> Iterator[None]:
    """Holds the append lock of the batch failed logs (module docstring): blocks while a pass
    appends or recovers, in this process (another thread) or another one. Never nested. The lock
    is an `flock` of the `failed/` folder itself: no file of its own to list or to keep."""
    failed_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(failed_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def quiet_failed_log(failed_dir: Path, dest_id: str) -> Iterator[None]:
    """For moving the failed log of `dest_id` away (a replay, retention): no append is in flight
    while this holds, and what a dead pass may have appended is cut off first (its groups stay
    parked: the next pass appends them to the new file)."""
    with appending(failed_dir):
        if _recover(failed_dir, dest_id):
            log.info("destination %s: the failed-log appends of a pass cut short were undone", dest_id)
        yield


def append_groups(
    failed_dir: Path, dest_id: str, groups: list[ParkedSpools], fault: Callable[[str], None] | None = None
) -> Path | None:
    """Appends the groups to the failed log of `dest_id` under a journal (module docstring, step 2);
    returns the journal, for `finish_appends` once the groups' outcomes are durable. The caller
    holds `appending` until then."""
    if not groups:
        return None
    target = failed_log_path(failed_dir, dest_id)
    (failed_dir / PENDING_DIR).mkdir(parents=True, exist_ok=True)
    journal = journal_path(failed_dir, dest_id)
    created = not target.exists()
    with target.open("ab") as out:
        stat = os.fstat(out.fileno())
        record = {
            "dest": dest_id,
            "inode": stat.st_ino,
            "start": stat.st_size,
            "groups": [group.manifest.parent.name for group in groups],
            "done": False,
        }
        replace_file(journal, orjson.dumps(record))
        if created:
            sync_dir(failed_dir)
        for group in groups:
            _copy(group.spools, out)
            if fault is not None:
                out.flush()
                fault("failed group appended")
        out.flush()
        os.fsync(out.fileno())
    return journal


def _copy(spools: Iterable[Path], out: Any) -> int:
    written = 0
    for spool in spools:
        try:
            with spool.open("rb") as src:
                shutil.copyfileobj(src, out, COPY_CHUNK)
                written += src.tell()
        except FileNotFoundError:
            continue
    return written


def finish_appends(failed_dir: Path, journals: Iterable[Path | None], groups: Iterable[ParkedSpools]) -> None:
    """Step 4: the appended groups' outcomes are durable: journals done, groups removed, journals removed."""
    found = [journal for journal in journals if journal is not None]
    for journal in found:
        record = _read_journal(journal)
        if record is not None:
            replace_file(journal, orjson.dumps({**record, "done": True}))
    remove_groups(groups)
    for journal in found:
        journal.unlink(missing_ok=True)
    if found:
        sync_dir(found[0].parent)


def append_settled(failed_dir: Path, dest_id: str, groups: list[ParkedSpools]) -> None:
    """Appends groups whose outcome is already durable (a committed pair, a recovered group) and removes them."""
    with appending(failed_dir):
        finish_appends(failed_dir, [append_groups(failed_dir, dest_id, groups)], groups)


def _read_journal(path: Path) -> dict[str, Any] | None:
    try:
        record = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def recover_journal(failed_dir: Path, dest_id: str) -> bool:
    """Undoes what a pass cut short may have appended to the failed log of `dest_id` (module
    docstring); True when there was a journal. Needs no connection; idempotent."""
    with appending(failed_dir):
        return _recover(failed_dir, dest_id)


def _recover(failed_dir: Path, dest_id: str) -> bool:
    journal = journal_path(failed_dir, dest_id)
    record = _read_journal(journal)
    if record is None:
        journal.unlink(missing_ok=True)  # never half-written (replace_file): only a foreign file
        return False
    if record.get("done"):
        listed = record.get("groups")
        names = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
        remove_groups(group for group in parked_spools(failed_dir) if group.manifest.parent.name in names)
    else:
        _truncate(failed_log_path(failed_dir, dest_id), record.get("inode"), record.get("start"))
    journal.unlink()
    sync_dir(journal.parent)
    return True


def _truncate(target: Path, inode: Any, start: Any) -> None:
    if not isinstance(start, int) or start < 0:
        return
    try:
        with target.open("r+b") as file:
            stat = os.fstat(file.fileno())
            # Another inode: a replay moved the file away, the lines went with it (appended again).
            if stat.st_ino == inode and stat.st_size > start:
                log.warning("failed log %s: %d byte(s) of a pass cut short removed", target, stat.st_size - start)
                file.truncate(start)
                os.fsync(file.fileno())
    except FileNotFoundError:
        return


def settle_recovered(
    failed_dir: Path, dest_id: str, groups: list[ParkedSpools], settled: Callable[[ParkedSpools], bool | None]
) -> tuple[int, int]:
    """Parked groups of `dest_id` a pass left: appended when `settled` says True, dropped when
    False, left parked when None (not known yet). Returns (appended, dropped)."""
    decided = [(group, settled(group)) for group in groups]
    done = [group for group, outcome in decided if outcome is True]
    dropped = [group for group, outcome in decided if outcome is False]
    if done:
        append_settled(failed_dir, dest_id, done)
    remove_groups(dropped)
    return len(done), len(dropped)
