"""A full disk and a read-only events directory under `eventspark serve` (issue 18).

`log.path` is a small tmpfs of the test's own (the tests run as root; a machine where mounting
is impossible fails the test with the reason). Load fills it: the collector answers 503 for what
it could not write, leaves no torn line in any file, keeps every event it acknowledged, and takes
events again by itself once a planted filler file is deleted. "Read-only" is made with the
immutable attribute (`chattr +i`) of the incoming and queue directories and their files: a
`mount -o remount,ro` is refused (EBUSY) while the collector holds files open for writing, which
it always does; an immutable file refuses writes through those open descriptors as well.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventspark.logs.incoming import parse_log_name
from eventspark.stream.queue import QueueReader, QueueWriter
from tests.collector import conftest as collector_fixtures
from tests.collector.conftest import Server, logged_numbers, post_numbered

run_server = collector_fixtures.run_server

JS, S2S = "full-js", "full-s2s"
FS_BYTES = 3 * 1024 * 1024
FREE_BYTES = 400 * 1024
"""What the filler file leaves free: a few hundred events."""
PAD = "x" * 1000


def config(workers: int, fsync: bool) -> dict[str, Any]:
    return {
        "server": {"workers": workers, "fsync": fsync},
        "api_keys": [{"id": "full", "client_secret": JS, "server_secret": S2S}],
        "log": {"rotation_min": 0.02, "uploader_period_sec": 3600},  # rotations during the test
        "destinations": {
            "dw": {"type": "duckdb"},
            # Its warehouse is down: the worker keeps every event in the queue, where they are counted.
            "live": {"type": "postgres", "mode": "stream", "datasource": {"host": "127.0.0.1", "port": 1, "db": "x"}},
        },
    }


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of FS_BYTES mounted at tmp_path/fs, unmounted (and made mutable again) at the end."""
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the disk-full test needs root): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["chattr", "-R", "-i", str(mount_point)], capture_output=True)
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)  # a server still dying


def fill(fs: Path, leave: int) -> Path:
    """A filler file taking all but `leave` bytes of the file system."""
    filler = fs / "filler"
    free = shutil.disk_usage(fs).free
    with filler.open("wb") as out:
        out.write(b"\0" * max(0, free - leave))
    return filler


class Load:
    """Threads posting numbered events (JS, s2s and bulk endpoints) until each saw enough 503s."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acknowledged: list[int] = []
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()

    def run(self, threads: int = 4, refusals: int = 20) -> None:
        workers = [threading.Thread(target=self._post, args=(t, refusals)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)

    def _post(self, thread: int, refusals: int) -> None:
        refused = 0
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for n in range(thread * 1_000_000, thread * 1_000_000 + 100_000, 10):
                ids = list(range(n, n + (10 if thread % 3 == 2 else 1)))
                status = post(client, thread % 3, ids)
                with self.lock:
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                    if status == 200:
                        self.acknowledged.extend(ids)
                refused += status == 503
                if refused >= refusals:
                    return


def post(client: httpx.Client, kind: int, ids: list[int]) -> int:
    return post_numbered(client, kind, ids, JS, S2S, PAD)


def wait_for(status: int, server: Server, acknowledged: list[int], timeout: float = 15.0) -> float:
    """Posts events (negative `n`) until one gets `status`; the seconds it took. The `n` of those
    answered 200 are added to `acknowledged`."""
    started = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        while True:
            n = -1 - len(acknowledged) - int(time.monotonic_ns() % 1_000_000) * 1_000
            got = post(client, 0, [n])
            if got == 200:
                acknowledged.append(n)
            if got == status:
                return time.monotonic() - started
            assert got in (200, 503), got
            assert time.monotonic() - started < timeout, f"still {got} after {timeout} s"
            time.sleep(0.1)


def set_immutable(events: Path, on: bool) -> None:
    paths = [events / "incoming", *events.glob("incoming/*.log"), events / "queue.dst=live"]
    paths += list(events.glob("queue.dst=live/*.dque"))
    subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], check=True)


@pytest.mark.parametrize(("workers", "fsync"), [(1, False), (2, True)], ids=["one-process", "two-workers-fsync"])
def test_disk_full_and_read_only_answer_503_and_recover(
    small_fs: Path, run_server: Callable[..., Server], figure: Callable[[str], None], workers: int, fsync: bool
) -> None:
    # small_fs first: it is unmounted after run_server's teardown killed what still runs.
    events = small_fs / "events"
    server = run_server({**config(workers, fsync), "log": {**config(workers, fsync)["log"], "path": str(events)}})
    filler = fill(small_fs, FREE_BYTES)
    load = Load(server.url)
    load.run()
    assert set(load.statuses) == {200, 503}, load.statuses  # no 500, no reset
    written = logged_numbers(server)
    assert sorted(written) == sorted(load.acknowledged)  # all acknowledged, once; nothing refused
    queued = [e["n"] for e in server.queued_events("live")]
    assert sorted(queued) == sorted(load.acknowledged)  # every queue record whole

    filler.unlink()  # space returns: no restart
    probes: list[int] = []
    recovered = wait_for(200, server, probes)
    # Writes through files already open go on until the next rotation closes them: from then on
    # nothing can be created in the directory.
    set_immutable(events, True)
    refused_read_only = wait_for(503, server, probes)
    set_immutable(events, False)
    recovered_read_only = wait_for(200, server, probes)
    assert server.stop() == 0  # a graceful stop rotates the live files
    assert all(parse_log_name(p.name).rotated_at for p in server.log_files())  # type: ignore[union-attr]
    assert sorted(logged_numbers(server)) == sorted(load.acknowledged + probes)
    assert sorted(e["n"] for e in server.queued_events("live")) == sorted(load.acknowledged + probes)
    figure(
        f"{'2 workers, fsync' if workers == 2 else '1 process'}: acknowledged {len(load.acknowledged):,} "
        f"events, refused {load.statuses[503]:,} requests with 503, 5xx other than 503: 0, torn lines 0, "
        f"lost 0; 200 again {recovered:.1f} s after space returned; read-only: 503 after "
        f"{refused_read_only:.1f} s (its next new file), 200 {recovered_read_only:.1f} s after it became writable"
    )


def test_queue_writer_rolls_over_on_a_full_disk(small_fs: Path, figure: Callable[[str], None]) -> None:
    """Segments end and start while the disk is full: nothing appended (returned) is lost or torn."""
    directory = small_fs / "queue"
    # Three records a segment, a segment a page of the tmpfs: the disk fills up when a segment starts.
    writer = QueueWriter(directory, segment_bytes=1024)
    filler = fill(small_fs, 64 * 1024)
    appended, refused = [], 0
    for n in range(100_000):
        try:
            writer.append(orjson.dumps({"n": n, "pad": PAD[:300]}) + b"\n")
        except OSError:
            refused += 1
            if refused == 50:
                break
            continue
        appended.append(n)
    filler.unlink()
    for later in range(n + 1, n + 501):  # space is back: every append succeeds again
        writer.append(orjson.dumps({"n": later, "pad": PAD[:300]}) + b"\n")
        appended.append(later)
    writer.close()
    reader = QueueReader(directory)
    reader.open()
    read = [orjson.loads(record)["n"] for record in reader.read(10_000)]
    assert refused == 50
    assert read == appended
    assert reader.skipped_bytes == 0
    figure(f"queue writer on a full disk: appended {len(appended):,}, refused {refused}, read back all, lost 0")
