"""Metrics snapshots across real processes: sums, ended processes folded, no counter going back."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

from eventspark.ops.metrics import (
    ANSWERED,
    RETIRED,
    STALE_OTHER_HOST,
    Histogram,
    Sample,
    Snapshots,
    _start_ticks,
    merge_snapshots,
    pipeline_metrics,
)

CHILD = """
import sys
import time
from pathlib import Path
from eventspark.ops.metrics import Histogram, Sample, Snapshots

snapshots = Snapshots(Path(sys.argv[1]))
histogram = Histogram((1.0, 2.0), [1, 0, 0], 0.5)
sample = Sample({"events_accepted": {("web",): float(sys.argv[2])}}, {"h": {(): histogram}})
snapshots.add_source(lambda: sample)
snapshots.write()
print("written", flush=True)
sys.stdin.read()  # lives until the test closes its stdin
"""


class Child:
    """A process of its own that writes one snapshot and lives until `end`."""

    def __init__(self, directory: Path, accepted: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory), str(accepted)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None and self.process.stdout.readline() == b"written\n"

    def end(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


def accepted(sample: Sample) -> float:
    return sample.counters.get("events_accepted", {}).get(("web",), 0)


def test_live_counters_plus_other_processes_and_ended_ones_never_go_back(tmp_path: Path) -> None:
    own = Snapshots(tmp_path)
    own.add_source(lambda: Sample({"events_accepted": {("web",): 3}}))
    try:
        first, second = Child(tmp_path, 5), Child(tmp_path, 7)
        assert accepted(own.merged()) == 15
        first.end()
        assert accepted(own.merged()) == 15  # folded into retired.json
        assert (tmp_path / RETIRED).is_file()
        assert len([p for p in tmp_path.glob("*.json") if p.name not in (RETIRED, ANSWERED, own.name)]) == 1
        second.end()
        third = Child(tmp_path, 1)  # a restarted worker starts from zero: the sum goes on
        merged = own.merged()
        assert accepted(merged) == 16
        assert merged.histograms["h"][()].counts == [3, 0, 0]
        third.end()
        assert accepted(merge_snapshots(tmp_path, own.host, exclude=own.name)) == 13
    finally:
        own.stop()


def test_a_snapshot_folded_before_a_crash_is_not_counted_twice(tmp_path: Path) -> None:
    child = Child(tmp_path, 4)
    (name,) = [p.name for p in tmp_path.glob("*.json")]
    child.end()
    copy = (tmp_path / name).read_bytes()
    host = name.rsplit("-", 2)[0]
    assert accepted(merge_snapshots(tmp_path, host)) == 4
    (tmp_path / name).write_bytes(copy)  # as if the fold crashed before deleting it
    assert accepted(merge_snapshots(tmp_path, host)) == 4
    assert not (tmp_path / name).exists()


def test_other_hosts_and_garbage_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "otherhost-1-abcd.json").write_bytes(orjson.dumps(Sample({"events_accepted": {("web",): 9}}).to_json()))
    (tmp_path / f"h-{os.getpid()}-x.json").write_bytes(b"{not json")
    (tmp_path / f"h-{os.getpid()}-y.json").write_bytes(b'{"counters": {"events_accepted": [["web", "many"]]}}')
    assert accepted(merge_snapshots(tmp_path, "h")) == 0
    assert (tmp_path / "otherhost-1-abcd.json").exists()


def test_an_answer_is_never_below_the_last_one(tmp_path: Path) -> None:
    # Another worker's snapshot lags it by up to a second: the sum seen by a scrape answered here
    # may be lower than the one a scrape answered there saw. Simulated with a snapshot that drops.
    own_count = {"web": 3}
    own = Snapshots(tmp_path)
    own.add_source(lambda: Sample({"events_accepted": {("web",): own_count["web"]}}))
    other = tmp_path / f"{own.host}-{os.getpid()}-{_start_ticks('self')}_other.json"
    try:
        other.write_bytes(orjson.dumps(Sample({"events_accepted": {("web",): 10}}).to_json()))
        assert accepted(own.merged()) == 13
        other.write_bytes(orjson.dumps(Sample({"events_accepted": {("web",): 8}}).to_json()))
        assert accepted(own.merged()) == 13  # not 11
        own_count["web"] = 6
        assert accepted(own.merged()) == 14  # rises again with the true counts
        assert accepted(Sample.from_json(orjson.loads((tmp_path / ANSWERED).read_bytes()))) == 14
    finally:
        own.stop()


def test_a_reused_pid_does_not_keep_an_ended_snapshot(tmp_path: Path) -> None:
    # A restart may give a new process the pid of an old one (pid 1 in a container): the start
    # time in the name tells them apart, and the old snapshot is folded when a process starts.
    assert _start_ticks("self")
    own = Snapshots(tmp_path)
    old = tmp_path / f"{own.host}-{os.getpid()}-1_oldrun.json"
    old.write_bytes(orjson.dumps(Sample({"events_accepted": {("web",): 4}}).to_json()))
    own.add_source(lambda: Sample({"events_accepted": {("web",): 1}}))
    try:
        assert not old.exists()
        assert accepted(Sample.from_json(orjson.loads((tmp_path / RETIRED).read_bytes())["sample"])) == 4
        assert accepted(own.merged()) == 5
        own.write()
        assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted([ANSWERED, RETIRED, own.name])
    finally:
        own.stop()


def test_stale_snapshots_of_other_hosts_are_deleted(tmp_path: Path) -> None:
    fresh, stale = tmp_path / "otherhost-1-1_fresh.json", tmp_path / "otherhost-2-1_stale.json"
    for path in (fresh, stale):
        path.write_bytes(orjson.dumps(Sample({"events_accepted": {("web",): 9}}).to_json()))
    old = time.time() - STALE_OTHER_HOST - 60
    os.utime(stale, (old, old))
    assert accepted(merge_snapshots(tmp_path, "h")) == 0
    assert fresh.exists() and not stale.exists()


def test_an_unchanged_snapshot_is_touched(tmp_path: Path) -> None:
    snapshots = Snapshots(tmp_path, period=3600)
    snapshots.add_source(lambda: Sample({"events_accepted": {("web",): 1}}))
    try:
        snapshots.write()
        path = tmp_path / snapshots.name
        os.utime(path, (1, 1))
        snapshots.write()
        assert path.stat().st_mtime > 1
        path.unlink()  # deleted by hand: written again although unchanged
        snapshots.write()
        assert accepted(Sample.from_json(orjson.loads(path.read_bytes()))) == 1
    finally:
        snapshots.stop()


def test_a_released_source_keeps_its_counts(tmp_path: Path) -> None:
    snapshots = Snapshots(tmp_path)
    counts = {"web": 2}

    def collector() -> Sample:
        return Sample({"events_accepted": {("web",): counts["web"]}})

    snapshots.add_source(collector)
    snapshots.add_source(lambda: Sample({"stream_inserts": {("pg",): 1}}))
    counts["web"] = 5
    snapshots.release(collector)
    counts["web"] = 100  # no longer read
    written = Sample.from_json(orjson.loads((tmp_path / snapshots.name).read_bytes()))
    assert accepted(written) == 5 and written.counters["stream_inserts"] == {("pg",): 1}
    snapshots.stop()


def test_histograms_add_and_render_cumulative() -> None:
    histogram = Histogram((1.0, 5.0))
    for value in (0.5, 1.0, 3.0, 9.0):
        histogram.observe(value)
    assert histogram.cumulative() == [("1.0", 2), ("5.0", 3), ("+Inf", 4)] and histogram.total == 13.5
    other = histogram.copy()
    other.add(histogram)
    assert other.counts == [4, 2, 2] and histogram.counts == [2, 1, 1]


def _child_pipeline(queue: multiprocessing.Queue[int]) -> None:
    queue.put(len(pipeline_metrics().sample().counters))


def test_a_forked_process_counts_its_own_pipeline_from_zero() -> None:
    pipeline_metrics().stream_insert("pg")
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[int] = context.Queue()
    child = context.Process(target=_child_pipeline, args=(queue,))
    child.start()
    assert queue.get(timeout=30) == 0
    child.join(timeout=30)
    assert pipeline_metrics().sample().counters["stream_inserts"][("pg",)] >= 1


def test_stop_ends_the_thread_and_writes_the_last_snapshot(tmp_path: Path) -> None:
    snapshots = Snapshots(tmp_path, period=3600)
    count = {"web": 1}
    snapshots.add_source(lambda: Sample({"events_accepted": {("web",): count["web"]}}))
    thread = snapshots._thread
    assert thread is not None and thread.is_alive()
    count["web"] = 7
    snapshots.stop()
    assert not thread.is_alive()
    assert accepted(Sample.from_json(orjson.loads((tmp_path / snapshots.name).read_bytes()))) == 7
