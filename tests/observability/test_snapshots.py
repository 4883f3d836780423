"""Metrics snapshots across real processes: sums, ended processes folded, no counter going back."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import orjson

from eventspark.ops.metrics import (
    RETIRED,
    Histogram,
    Sample,
    Snapshots,
    merge_snapshots,
    pipeline_metrics,
)

CHILD = """
import sys
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
        assert len([p for p in tmp_path.glob("*.json") if p.name not in (RETIRED, own.name)]) == 1  # second
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
