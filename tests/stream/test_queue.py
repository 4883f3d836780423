"""The persistent queue: order, acknowledgement, segments, torn records, processes, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventspark.stream.queue import READ_CHUNK, QueueBusy, QueueReader, QueueWriter
from eventspark.stream.segments import FRAME, MAGIC, frame, segment_name

WRITER_SCRIPT = """
import sys
from pathlib import Path
from eventspark.stream.queue import QueueWriter

writer = QueueWriter(Path(sys.argv[1]), segment_bytes=int(sys.argv[2]))
i = 0
while True:
    writer.append(b'{"n": %d}\\n' % i)
    sys.stdout.write(f"{i}\\n")
    sys.stdout.flush()
    i += 1
"""


def lines(*numbers: int) -> bytes:
    return b"".join(b'{"n": %d}\n' % n for n in numbers)


def payloads(*numbers: int) -> list[bytes]:
    return [b'{"n": %d}' % n for n in numbers]


def reader_of(path: Path) -> QueueReader:
    reader = QueueReader(path, poll_interval=0.005)
    reader.open()
    return reader


def drain(reader: QueueReader, batch: int = 1000) -> list[bytes]:
    out: list[bytes] = []
    while True:
        got = reader.read(batch)
        if not got:
            return out
        out += got


def segment_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("*.dque"))


def test_single_and_bulk_appends_come_back_in_order(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path)
    writer.append(lines(0))
    writer.append(lines(1, 2, 3), 3)
    writer.append(b"\n")  # empty lines are not events
    reader = reader_of(tmp_path)
    assert reader.read(2) == payloads(0, 1)
    assert reader.read(10) == payloads(2, 3)
    assert reader.read(10) == []
    assert writer.lines == 4


def test_unacknowledged_records_are_redelivered_and_acknowledged_ones_are_not(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path)
    writer.append(lines(0, 1, 2), 3)
    reader = reader_of(tmp_path)
    assert reader.read(2) == payloads(0, 1)
    reader.ack()
    assert reader.read(5) == payloads(2)
    reader.close()  # crash before the ack of n=2

    again = reader_of(tmp_path)
    assert drain(again) == payloads(2)
    again.rewind()
    assert drain(again) == payloads(2)
    again.ack()
    again.close()
    assert drain(reader_of(tmp_path)) == []


def test_segments_roll_over_and_consumed_ones_are_deleted(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path, segment_bytes=200)
    for n in range(50):
        writer.append(lines(n))
    assert len(segment_files(tmp_path)) >= 5
    reader = reader_of(tmp_path)
    assert drain(reader, batch=7) == payloads(*range(50))
    reader.ack()
    assert len(segment_files(tmp_path)) == 1
    writer.append(lines(50))
    assert reader.read(10) == payloads(50)


def test_only_the_newest_segment_survives_full_consumption(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path, segment_bytes=100)
    for n in range(20):
        writer.append(lines(n))
    newest = segment_files(tmp_path)[-1]
    reader = reader_of(tmp_path)
    drain(reader)
    reader.ack()
    assert segment_files(tmp_path) == [newest]


def test_a_restarted_writer_starts_a_new_segment(tmp_path: Path) -> None:
    first = QueueWriter(tmp_path)
    first.append(lines(0))
    first.close()
    second = QueueWriter(tmp_path)
    second.append(lines(1))
    assert segment_files(tmp_path) == [segment_name("main", 1), segment_name("main", 2)]
    assert drain(reader_of(tmp_path)) == payloads(0, 1)


@pytest.mark.parametrize(
    "torn",
    [
        FRAME.pack(100, 0)[:5],  # a header cut short
        FRAME.pack(100, 12345) + b'{"n": 9',  # a payload cut short
        FRAME.pack(7, 0) + b'{"n":9}',  # complete length, wrong CRC (garbage that fits)
    ],
    ids=["short-header", "short-payload", "bad-crc"],
)
def test_a_torn_last_record_is_skipped_once_the_segment_is_sealed(tmp_path: Path, torn: bytes) -> None:
    writer = QueueWriter(tmp_path)
    writer.append(lines(0, 1), 2)
    writer.close()
    with (tmp_path / segment_name("main", 1)).open("ab") as f:
        f.write(torn)  # what a writer killed inside write() may leave

    reader = reader_of(tmp_path)
    assert drain(reader) == payloads(0, 1)  # the live segment: the rest may still come
    assert reader.skipped_bytes == 0
    restarted = QueueWriter(tmp_path)
    restarted.append(lines(2))
    assert drain(reader) == payloads(2)
    assert reader.skipped_bytes == len(torn)


def test_records_after_a_corrupt_one_in_a_live_segment_wait_for_the_writer(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path)
    writer.append(lines(0))
    path = tmp_path / segment_name("main", 1)
    with path.open("ab") as f:
        f.write(FRAME.pack(3, 1) + b"abc" + frame(b'{"n": 1}'))
    reader = reader_of(tmp_path)
    assert drain(reader) == payloads(0)
    writer.close()
    QueueWriter(tmp_path).append(lines(2))
    # Without resynchronisation markers, the rest of a segment after a corrupt record is lost.
    assert drain(reader) == payloads(2)
    assert reader.skipped_bytes == FRAME.size + 3 + len(frame(b'{"n": 1}'))


def test_a_record_larger_than_a_read_chunk(tmp_path: Path) -> None:
    big = b'{"s": "' + b"x" * (READ_CHUNK * 2) + b'"}'
    writer = QueueWriter(tmp_path)
    writer.append(lines(0) + big + b"\n" + lines(1), 3)
    assert drain(reader_of(tmp_path), batch=1) == [payloads(0)[0], big, payloads(1)[0]]


def test_several_writers_are_all_consumed(tmp_path: Path) -> None:
    QueueWriter(tmp_path).append(lines(0))
    QueueWriter(tmp_path, worker=0).append(lines(1))
    QueueWriter(tmp_path, worker=1).append(lines(2))
    assert sorted(drain(reader_of(tmp_path))) == payloads(0, 1, 2)


def test_one_consumer_and_one_writer_per_name(tmp_path: Path) -> None:
    reader_of(tmp_path)
    with pytest.raises(QueueBusy):
        reader_of(tmp_path)
    QueueWriter(tmp_path).append(lines(0))
    with pytest.raises(QueueBusy):
        QueueWriter(tmp_path).append(lines(1))


def test_unreadable_offsets_mean_redelivery_not_loss(tmp_path: Path) -> None:
    QueueWriter(tmp_path).append(lines(0, 1), 2)
    reader = reader_of(tmp_path)
    drain(reader)
    reader.ack()
    reader.close()
    (tmp_path / "offsets.json").write_bytes(b"{not json")
    assert drain(reader_of(tmp_path)) == payloads(0, 1)


def test_a_wait_ends_as_soon_as_an_event_is_appended_in_process(tmp_path: Path) -> None:
    writer = QueueWriter(tmp_path)
    writer.append(lines(0))
    reader = QueueReader(tmp_path, poll_interval=5.0)  # polling alone would take 5 s
    reader.open()
    drain(reader)
    timer = threading.Timer(0.05, writer.append, args=(lines(1),))
    started = time.monotonic()
    timer.start()
    assert reader.read(10, wait=10.0) == payloads(1)
    assert time.monotonic() - started < 1.0


def test_segments_start_with_the_magic(tmp_path: Path) -> None:
    QueueWriter(tmp_path).append(lines(0))
    assert (tmp_path / segment_name("main", 1)).read_bytes().startswith(MAGIC)


def test_kill_9_of_a_writer_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """A writer process appends as fast as it can and is killed; every record it reported as
    appended is read back, in order, with no gap and nothing invented."""
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(tmp_path), "20000"],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": "src"},
    )
    assert process.stdout is not None
    reported = -1
    deadline = time.monotonic() + 20
    while reported < 3000 and time.monotonic() < deadline:
        reported = int(process.stdout.readline())
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert reported >= 3000
    got = [int(p[6:-1]) for p in drain(reader_of(tmp_path))]
    assert got == list(range(len(got)))
    assert len(got) > reported


def test_kill_9_of_a_consumer_redelivers_what_it_did_not_acknowledge(tmp_path: Path) -> None:
    QueueWriter(tmp_path).append(lines(*range(10)), 10)
    script = (
        "import os, sys; from pathlib import Path; from eventspark.stream.queue import QueueReader\n"
        "r = QueueReader(Path(sys.argv[1])); r.open(); r.read(4); r.ack(); r.read(4)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], env={**os.environ, "PYTHONPATH": "src"})
    assert drain(reader_of(tmp_path)) == payloads(*range(4, 10))
