"""The streaming archive: appends, daily rotation into gzipped day folders, crash leftovers."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from pathlib import Path

from eventspark.stream.archive import StreamArchive, rotated_archive_name

DAY1 = datetime(2026, 11, 1, 23, 59, tzinfo=UTC)
DAY2 = datetime(2026, 11, 2, 0, 1, tzinfo=UTC)


def test_lines_append_to_the_live_file(tmp_path: Path) -> None:
    archive = StreamArchive(tmp_path, "pg")
    archive.open()
    archive.append([b'{"a":1}'], DAY1)
    archive.append([b'{"a":2}', b'{"a":3}'], DAY1)
    archive.append([], DAY1)
    assert (tmp_path / "streaming-archive.dst=pg.log").read_bytes() == b'{"a":1}\n{"a":2}\n{"a":3}\n'


def test_a_new_day_rotates_the_file_into_the_day_folder(tmp_path: Path) -> None:
    archive = StreamArchive(tmp_path, "pg")
    archive.open()
    archive.append([b'{"a":1}'], DAY1)
    archive.append([b'{"a":2}'], DAY2)
    archive.wait()
    gzipped = list((tmp_path / "2026-11-01").iterdir())
    assert [p.name for p in gzipped] == [rotated_archive_name("pg", DAY2) + ".gz"]
    assert gzipped[0].name == "streaming-archive.dst=pg-2026-11-02T00-01-00.000.log.gz"
    assert gzip.decompress(gzipped[0].read_bytes()) == b'{"a":1}\n'
    assert (tmp_path / "streaming-archive.dst=pg.log").read_bytes() == b'{"a":2}\n'


def test_rotation_happens_without_new_events(tmp_path: Path) -> None:
    archive = StreamArchive(tmp_path, "pg")
    archive.open()
    archive.append([b'{"a":1}'], DAY1)
    assert archive.rotate_if_due(DAY1) is None
    assert archive.rotate_if_due(DAY2) is not None
    archive.wait()
    assert not (tmp_path / "streaming-archive.dst=pg.log").exists()
    assert len(list((tmp_path / "2026-11-01").iterdir())) == 1


def test_a_rotated_file_left_by_a_crash_is_compressed_on_open(tmp_path: Path) -> None:
    leftover = tmp_path / rotated_archive_name("pg", DAY2)
    leftover.write_bytes(b'{"a":1}\n')
    other = tmp_path / rotated_archive_name("other", DAY2)
    other.write_bytes(b"x\n")
    archive = StreamArchive(tmp_path, "pg")
    archive.open()
    archive.wait()
    assert not leftover.exists() and other.exists()
    (gz,) = tmp_path.glob("*/streaming-archive.dst=pg-*.log.gz")
    assert gzip.decompress(gz.read_bytes()) == b'{"a":1}\n'
