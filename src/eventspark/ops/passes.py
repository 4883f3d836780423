"""Pass requests: asking the serving node's batch uploader for a pass now, from any process.

The uploader runs in the serving parent process; collector worker processes, `eventspark
process` and `eventspark replay` are other processes. They file a request under
`<log.path>/requests/`, and the uploader (`batch.uploader`) looks there at least every
`POLL_SECONDS` besides its period, so a request starts a pass within about a second (at once
when it was filed in the uploader's own process). Files:

* `pass-<id>.json` — a pending request (written to a temporary name, then renamed);
* `pass-<id>.taken` — the request, renamed by the uploader when a pass for it starts;
* `pass-<id>.result.json` — the answer: the pass's summary (`summary_of`) or its error;
* `pass-<id>.rotated.<main|w<n>>` — a collector process rotated its live logs for the request
  (`RotationRequests`; only for requests with `"rotate": true`).

A request is answered by the first pass that *starts* after it was filed, so the logs rotated
before the request are in it. Answers older than `KEEP_ANSWERS_SECONDS` are removed. Requests a
pass took but never answered (the node stopped or crashed during the pass) are put back when the
uploader starts again (`PassRequests.recover`): only one node serves a directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eventspark.logs.status import replace_file

if TYPE_CHECKING:
    from eventspark.batch.job import JobResult

REQUESTS_DIR = "requests"
POLL_SECONDS = 0.25
"""How often the uploader looks for requests filed by other processes (one `scandir`)."""
KEEP_ANSWERS_SECONDS = 24 * 3600
ROTATION_WAIT_SECONDS = 2.0
"""How long a pass waits for the collector processes to rotate before it runs with what is rotated."""
_ID = re.compile(r"^[0-9a-f]{32}$")
_wakeups: dict[str, threading.Event] = {}
_wakeups_lock = threading.Lock()


def requests_dir(log_path: Path) -> Path:
    return log_path / REQUESTS_DIR


def _wakeup(directory: Path) -> threading.Event:
    key = str(directory.resolve())
    with _wakeups_lock:
        return _wakeups.setdefault(key, threading.Event())


def valid_id(request_id: str) -> bool:
    return bool(_ID.match(request_id))


# --- the asking side ------------------------------------------------------------------------------


def request_pass(log_path: Path, reason: str = "", rotate: bool = False) -> str:
    """Files a pass request and returns its id; wakes the uploader at once if it runs in this process.

    `rotate`: the collector processes rotate their live logs first (`RotationRequests`)."""
    folder = requests_dir(log_path)
    folder.mkdir(parents=True, exist_ok=True)
    request_id = uuid.uuid4().hex
    record = {"id": request_id, "requested_at": time.time(), "pid": os.getpid(), "reason": reason, "rotate": rotate}
    replace_file(folder / f"pass-{request_id}.json", orjson.dumps(record))
    _wakeup(folder).set()
    return request_id


def request_state(log_path: Path, request_id: str) -> tuple[str, dict[str, Any] | None]:
    """("done", answer), ("running", None), ("pending", None) or ("unknown", None)."""
    folder = requests_dir(log_path)
    answer = read_answer(log_path, request_id)
    if answer is not None:
        return "done", answer
    if (folder / f"pass-{request_id}.taken").exists():
        return "running", None
    if (folder / f"pass-{request_id}.json").exists():
        return "pending", None
    return "unknown", None


def read_answer(log_path: Path, request_id: str) -> dict[str, Any] | None:
    try:
        answer: dict[str, Any] = orjson.loads((requests_dir(log_path) / f"pass-{request_id}.result.json").read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return answer


def wait_answer(log_path: Path, request_id: str, timeout: float) -> dict[str, Any] | None:
    """The answer to a request, waiting up to `timeout` seconds; None when it has not come."""
    deadline = time.monotonic() + timeout
    while True:
        answer = read_answer(log_path, request_id)
        if answer is not None or time.monotonic() >= deadline:
            return answer
        time.sleep(0.1)


async def wait_answer_async(log_path: Path, request_id: str, timeout: float) -> dict[str, Any] | None:
    """`wait_answer` for the collector's event loop."""
    deadline = time.monotonic() + timeout
    while True:
        answer = read_answer(log_path, request_id)
        if answer is not None or time.monotonic() >= deadline:
            return answer
        await asyncio.sleep(0.1)


# --- the uploader's side --------------------------------------------------------------------------


class PassRequests:
    """The uploader's view of the request folder."""

    def __init__(self, log_path: Path) -> None:
        self.folder = requests_dir(log_path)

    def pending(self) -> list[str]:
        names = _listing(self.folder)
        return sorted(
            name[5:-5]
            for name in names
            if name.startswith("pass-")
            and name.endswith(".json")
            and not name.endswith(".result.json")
            and valid_id(name[5:-5])
        )

    def wait(self, stop: threading.Event, timeout: float, min_wait: float = 0.0) -> bool:
        """Waits `timeout` seconds or until a request is pending (not before `min_wait`);
        False when `stop` is set."""
        wakeup = _wakeup(self.folder)
        started = time.monotonic()
        deadline = started + timeout
        while not stop.is_set():
            now = time.monotonic()
            if now >= deadline:
                return True
            if now - started >= min_wait and self.pending():
                return True
            if wakeup.wait(min(POLL_SECONDS, deadline - now)):
                wakeup.clear()
        return False

    def wait_rotated(self, taken: list[str], writers: int, timeout: float = ROTATION_WAIT_SECONDS) -> bool:
        """Waits until `writers` collector processes have rotated for every request of `taken` that
        asks for it (`RotationRequests`); False when some did not within `timeout`."""
        wanted = [request_id for request_id in taken if _asks_rotation(self.folder / f"pass-{request_id}.taken")]
        deadline = time.monotonic() + timeout
        while wanted:
            acks = _listing(self.folder)
            wanted = [r for r in wanted if sum(name.startswith(f"pass-{r}.rotated.") for name in acks) < writers]
            if not wanted:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def recover(self) -> list[str]:
        """Puts back the requests marked running by an uploader that stopped before answering them;
        for the uploader's start, when no pass of this directory runs."""
        recovered = [
            name[5:-6] for name in _listing(self.folder) if name.startswith("pass-") and name.endswith(".taken")
        ]
        self.release(recovered)
        return recovered

    def take(self) -> list[str]:
        """Marks the pending requests as running (a pass for them starts now)."""
        taken = []
        for request_id in self.pending():
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.folder / f"pass-{request_id}.json", self.folder / f"pass-{request_id}.taken")
                taken.append(request_id)
        return taken

    def release(self, taken: list[str]) -> None:
        """Puts requests back (the pass could not run: another process held the batch lock)."""
        for request_id in taken:
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.folder / f"pass-{request_id}.taken", self.folder / f"pass-{request_id}.json")

    def answer(self, taken: list[str], result: JobResult | None, error: str = "", started: float = 0.0) -> None:
        """Writes each request's answer, then removes the request."""
        record = {
            "status": "failed" if error or (result is not None and not result.ok) else "ok",
            "started_at": started,
            "finished_at": time.time(),
            "error": error,
            **(summary_of(result) if result is not None else {}),
        }
        for request_id in taken:
            replace_file(self.folder / f"pass-{request_id}.result.json", orjson.dumps({"id": request_id, **record}))
            (self.folder / f"pass-{request_id}.taken").unlink(missing_ok=True)
            for ack in self.folder.glob(f"pass-{request_id}.rotated.*"):
                ack.unlink(missing_ok=True)
        self._forget_old()

    def _forget_old(self) -> None:
        limit = time.time() - KEEP_ANSWERS_SECONDS
        # Answers, acknowledgements written after their request was answered, and temporary
        # files of requests or answers whose writer died before the rename.
        old = ("pass-*.result.json", "pass-*.rotated.*", "pass-*.tmp")
        for path in [path for pattern in old for path in self.folder.glob(pattern)]:
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < limit:
                    path.unlink()


# --- the collector processes' side ----------------------------------------------------------------


class RotationRequests:
    """What a collector process (worker `worker`, None: the only one) needs to rotate its live logs
    when a pass request asks for it: the uploader cannot, as each process writes its own files.

    `Collector`'s rotation loop waits with `wait(period)` instead of sleeping, rotates, then calls
    `done(ids)`; the uploader waits for the acknowledgements (`PassRequests.wait_rotated`)."""

    def __init__(self, log_path: Path, worker: int | None) -> None:
        self.folder = requests_dir(log_path)
        self.writer = "main" if worker is None else f"w{worker}"
        self._seen: tuple[int, list[str]] | None = None
        """(the folder's mtime, what `asking` found then)."""

    def asking(self) -> list[str]:
        """Requests that ask for a rotation this process has not acknowledged yet.

        Called on the collector's event loop every `POLL_SECONDS`: while the folder's mtime has
        not changed (and is over a second old, as file system clocks are coarse), the last answer
        holds, for one `stat` instead of listing the folder and reading its requests."""
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            return []
        if self._seen is not None and self._seen[0] == mtime and time.time_ns() - mtime > 1_000_000_000:
            return list(self._seen[1])
        found = self._scan()
        self._seen = (mtime, found)
        return list(found)

    def _scan(self) -> list[str]:
        names = _listing(self.folder)
        acked = {name.split(".", 1)[0][5:] for name in names if name.endswith(f".rotated.{self.writer}")}
        found = []
        for name in names:
            request_id, _, kind = name[5:].partition(".")
            pending = name.startswith("pass-") and kind in ("json", "taken") and valid_id(request_id)
            if pending and request_id not in acked and _asks_rotation(self.folder / name):
                found.append(request_id)
        return found

    async def wait(self, period: float) -> list[str]:
        """Sleeps `period` seconds or until a request asks for a rotation; the ids of those asking."""
        deadline = time.monotonic() + period
        while (remaining := deadline - time.monotonic()) > 0:
            asking = self.asking()
            if asking:
                return asking
            await asyncio.sleep(min(POLL_SECONDS, remaining))
        return self.asking()

    def done(self, request_ids: list[str]) -> None:
        """Acknowledges the rotation for these requests."""
        for request_id in request_ids:
            with contextlib.suppress(FileNotFoundError):  # answered meanwhile: nothing to acknowledge
                (self.folder / f"pass-{request_id}.rotated.{self.writer}").touch()


def _listing(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return [entry.name for entry in entries]
    except FileNotFoundError:
        return []


def _asks_rotation(path: Path) -> bool:
    try:
        return bool(orjson.loads(path.read_bytes()).get("rotate"))
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False


def summary_of(result: JobResult) -> dict[str, Any]:
    """A pass's summary as JSON: per destination/table counts and errors, logs archived and kept."""
    pairs = [
        {
            "destination_id": dest_id,
            "table": table,
            "rows": pair.rows,
            "failed": pair.failed,
            "skipped": pair.skipped,
            "error": pair.error,
        }
        for (dest_id, table), pair in sorted(result.pairs.items())
    ]
    return {
        "pairs": pairs,
        "archived": len(result.archived),
        "kept": len(result.kept),
        "deleted_empty": len(result.deleted_empty),
        "held": dict(sorted(result.held.items())),
    }
