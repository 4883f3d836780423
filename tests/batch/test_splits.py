"""Byte-range splits of the rotated logs: every line read exactly once, whatever the cut."""

from __future__ import annotations

import random
from pathlib import Path

from eventspark.batch.splits import Split, plan_splits, read_split


def test_every_line_is_read_once_for_any_cut(tmp_path: Path) -> None:
    rng = random.Random(7)
    for _ in range(50):
        lines = [b"x" * rng.randint(0, 30) for _ in range(rng.randint(0, 40))]
        path = tmp_path / "log"
        path.write_bytes(b"".join(line + rng.choice([b"\n", b"\r\n"]) for line in lines))
        size = path.stat().st_size
        for step in (1, 2, 5, 17, size + 1):
            read = [
                line for start in range(0, size, step) for line in read_split(Split(str(path), start, start + step))
            ]
            assert read == [line for line in lines if line]


def test_a_last_line_without_newline_is_read(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b'{"a":1}\n{"b":2}')
    assert list(read_split(Split(str(path), 0, 15))) == [b'{"a":1}', b'{"b":2}']


def test_splits_cover_the_logs_in_order(tmp_path: Path) -> None:
    logs = []
    for name, size in (("a", 10), ("b", 25), ("c", 0)):
        logs.append(tmp_path / name)
        logs[-1].write_bytes(b"x" * size)
    splits = plan_splits(logs, parallelism=2, max_bytes=8)
    assert [(Path(s.path).name, s.start, s.end) for s in splits] == [
        ("a", 0, 5),
        ("a", 5, 10),
        ("b", 0, 7),
        ("b", 7, 14),
        ("b", 14, 21),
        ("b", 21, 25),
    ]
    assert [s.name for s in plan_splits(logs, parallelism=2)] == ["a", "b"]  # small logs: one split each


def test_splits_are_even_and_bounded(tmp_path: Path) -> None:
    logs = []
    for name, size in (("a", 283), ("b", 57)):
        logs.append(tmp_path / name)
        logs[-1].write_bytes(b"x" * size)
    splits = plan_splits(logs, parallelism=2, max_bytes=64)
    sizes = {name: [s.end - s.start for s in splits if s.name == name] for name in ("a", "b")}
    assert sum(sizes["a"]) == 283 and sum(sizes["b"]) == 57
    assert all(max(v) - min(v) < len(v) and max(v) <= 64 for v in sizes.values())
    # Two cores taking the splits in order finish within one small split of each other.
    loads = [0, 0]
    for s in splits:
        loads[loads.index(min(loads))] += s.end - s.start
    assert abs(loads[0] - loads[1]) <= min(s.end - s.start for s in splits)
