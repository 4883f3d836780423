"""The persistent queue of one stream destination: `events/queue.dst=<destination_id>/`.

Writers (collector processes) append events; one consumer (the destination's stream worker)
reads them, and acknowledges a micro-batch once it is delivered or sent to `failed`. A crash
before the acknowledgement redelivers the batch: delivery is at-least-once, and a primary key on
`eventn_ctx_event_id` makes the warehouse side exactly-once.

Files in the directory:

* `<writer>.<NNNNNNNNNNNN>.dque` — segment files of one writer (`main`, or `w<n>` for collector
  worker process n), numbered from 1 (`stream.segments` holds the format). A segment is an 8-byte magic
  `ESQUEUE1` followed by records:

      u32 little-endian  payload length (1 .. 2^31)
      u32 little-endian  CRC-32 (zlib) of the payload
      payload            one event, the JSON line without its newline

  A record of length 0 and CRC 0 ends a segment: the writer wrote everything it will write there
  and continues in the next number. A writer never appends to a segment it did not create, so a
  restarted writer starts a new segment and the one it left behind is *sealed*.
* `<writer>.writer.lock` — `flock`ed by the writer for its life: one process per writer name.
* `lock.lock` — `flock`ed by the consumer: one consumer per queue.
* `offsets.json` — the consumer's acknowledged position per writer, `{"<writer>": [segment,
  byte offset]}`, replaced atomically (write + rename) on every acknowledgement.
* `retry.json` — while deliveries fail, the consumer's retry state (`RetryState`: the first
  failed attempt since the last success, the attempts, the last error), so that the retry policy's
  maximum age counts across restarts; deleted by the next success. Read by `eventspark status`
  and the `eventspark_retry_*` gauges.
* `recording.json` — while the consumer appends a micro-batch's failed events to its failed log
  and until it acknowledges them: the log's inode, its size before the append and after it
  (`mark_recording`), so that a crash in between does not leave the failed lines twice (the batch
  is delivered again).

Crash safety: each record reaches the OS with one `os.write` before `append` returns (the
collector answers 200 after that), so killing a writer loses nothing it acknowledged. A writer
killed inside `write` may leave a torn last record; in a sealed segment the reader detects it
(short record or CRC mismatch), logs and skips the rest of that segment. In the segment a live
writer still appends to, an incomplete record is simply not read yet. Consumed segments are deleted
on acknowledgement; a lost or unreadable `offsets.json` means redelivery from the oldest segment,
never a loss. The queue is bounded only by the disk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import orjson

from eventspark.stream.segments import (
    END_OF_SEGMENT,
    FRAME,
    MAGIC,
    frame_lines,
    list_segments,
    parse_records,
    segment_name,
    try_flock,
)

__all__ = [
    "QueueBusy",
    "QueueReader",
    "QueueWriter",
    "RetryState",
    "clear_retry_state",
    "queue_dir",
    "read_retry_state",
    "write_retry_state",
]

log = logging.getLogger(__name__)

SEGMENT_BYTES = 16 * 1024 * 1024
READ_CHUNK = 1024 * 1024
OFFSETS_FILE = "offsets.json"
CONSUMER_LOCK = "lock.lock"
RETRY_FILE = "retry.json"
RECORDING_FILE = "recording.json"

# In-process wake-ups: a writer in the consumer's own process wakes it at once; a writer in
# another process is noticed by polling.
_wakeups: dict[str, threading.Event] = {}
_wakeups_lock = threading.Lock()


class QueueBusy(RuntimeError):
    """Another process writes this queue under the same writer name, or consumes it."""


def queue_dir(log_path: Path, destination_id: str) -> Path:
    """`<log.path>/queue.dst=<destination_id>`."""
    return log_path / f"queue.dst={destination_id}"


def writer_name(worker: int | None) -> str:
    """`main` for a single collector process, `w<n>` for collector worker process n."""
    return "main" if worker is None else f"w{worker}"


def _wakeup(directory: Path) -> threading.Event:
    key = str(directory.resolve())
    with _wakeups_lock:
        event = _wakeups.get(key)
        if event is None:
            event = _wakeups[key] = threading.Event()
        return event


# --- the consumer's retry state ------------------------------------------------------------------


@dataclass(slots=True)
class RetryState:
    """A stream destination's failing deliveries since its last success (epoch seconds)."""

    first_failure: float
    attempts: int = 0
    last_attempt: float = 0.0
    last_error: str = ""


def read_retry_state(directory: Path) -> RetryState | None:
    """The state in `<directory>/retry.json`; None when absent or unreadable (a new clock then)."""
    try:
        raw = orjson.loads((directory / RETRY_FILE).read_bytes())
        return RetryState(
            float(raw["first_failure"]),
            int(raw.get("attempts", 0)),
            float(raw.get("last_attempt", 0.0)),
            str(raw.get("last_error", "")),
        )
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError) as exc:
        log.warning("queue %s: unreadable %s (%s); the retry age starts again", directory, RETRY_FILE, exc)
        return None


def write_retry_state(directory: Path, state: RetryState, fsync: bool = False) -> None:
    """Replaces `<directory>/retry.json` atomically."""
    _replace_file(directory / RETRY_FILE, orjson.dumps(state), fsync)  # a dataclass: its fields


def clear_retry_state(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / RETRY_FILE)


def _replace_file(path: Path, data: bytes, fsync: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as out:
        out.write(data)
        if fsync:
            os.fsync(out.fileno())
    os.replace(tmp, path)


# --- writing --------------------------------------------------------------------------------------


class QueueWriter:
    """Appends events to the queue under one writer name; files are opened on the first append.

    The same small contract as the collector's spool: `append(data, lines)` takes whole
    newline-terminated lines and returns once they are in the OS; `fsync()` forces them to disk
    (group commit); `close(sync)`. Not thread-safe: one thread (the collector's loop) appends.
    """

    def __init__(self, directory: Path, worker: int | None = None, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = directory
        self.writer = writer_name(worker)
        self.segment_bytes = segment_bytes
        self.lines = 0
        """Events appended by this object (the collector's queue gauge)."""
        self._lock_fd: int | None = None
        self._fd: int | None = None
        self._seq = 0
        self._size = 0
        self._fd_lock = threading.Lock()  # fsync runs on the group-commit thread
        self._syncing = False
        """Set by the first `fsync` (server.fsync): a segment is then fsynced when it is ended."""
        self._sync_error: OSError | None = None
        """That fsync of an ended segment failed: the next `fsync` raises it (its records' requests
        may still wait for the group commit, which fsyncs only the current segment)."""
        self._wakeup: threading.Event | None = None

    def append(self, data: bytes, lines: int = 1) -> None:
        """Appends the lines of `data` as records with one write; on error nothing is left half-written."""
        records = frame_lines(data)
        if not records:
            return
        if self._lock_fd is None:
            self._open()
        elif self._fd is None or self._size >= self.segment_bytes:
            self._roll_over()  # or a retry after a segment could not be created (disk full)
        self._write(records)
        self.lines += lines
        if self._wakeup is not None:
            self._wakeup.set()

    def _write(self, records: bytes) -> None:
        fd, start = self._fd, self._size
        assert fd is not None
        try:
            view = memoryview(records)
            while view:  # a regular file writes everything in one call unless the disk is full
                view = view[os.write(fd, view) :]
        except BaseException:
            with contextlib.suppress(OSError):  # the original error is the one worth reporting
                os.ftruncate(fd, start)
            raise
        self._size = start + len(records)

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        lock_fd = try_flock(self.path / f"{self.writer}.writer.lock")
        if lock_fd is None:
            raise QueueBusy(f"another process writes {self.path} as {self.writer!r}")
        self._lock_fd = lock_fd  # kept when the segment below fails: the next append retries it
        seqs = list_segments(self.path).get(self.writer, [])
        self._seq = seqs[-1] if seqs else 0
        self._wakeup = _wakeup(self.path)
        self._new_segment(self._seq + 1)

    def _new_segment(self, seq: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        fd = os.open(self.path / segment_name(self.writer, seq), flags, 0o644)
        try:
            if os.write(fd, MAGIC) != len(MAGIC):
                raise OSError(errno.ENOSPC, "No space left on device (a segment's magic)")
        except BaseException:
            # The number stays taken (a reader may have opened the file): an empty or torn
            # segment without records is skipped once a later one exists.
            os.close(fd)
            self._seq = seq
            raise
        with self._fd_lock:
            self._fd, self._seq, self._size = fd, seq, len(MAGIC)

    def _roll_over(self) -> None:
        """Ends the current segment, if any, and starts the next. Each step fails whole (disk
        full): an end marker is written completely or not at all, and after it nothing more goes
        to that segment, so a failed next segment is only created again by the next append."""
        old = self._fd
        if old is not None:
            self._write(END_OF_SEGMENT)
            # Under the lock: a group commit waiting for records of this segment must not find
            # it gone (a no-op fsync) before it is synced here, or miss the error.
            with self._fd_lock:
                self._fd = None
                try:
                    if self._syncing:  # group commit fsyncs the current segment only: this one now
                        os.fsync(old)
                except OSError as exc:
                    self._sync_error = exc
                    raise
                finally:
                    os.close(old)
        self._new_segment(self._seq + 1)

    def write(self, data: bytes, lines: int = 1) -> None:
        """`append` under the name of `logs.incoming.AppendOnlyFile.write`."""
        self.append(data, lines)

    @property
    def file(self) -> QueueWriter:
        """Itself: the collector writes, fsyncs (group commit) and counts (`lines`) a stream
        destination's `spool.file` like an incoming log, so a QueueWriter stands in for a StreamSpool."""
        return self

    def fsync(self) -> None:
        """Forces appended records to disk; a no-op before the first append or after close."""
        self._syncing = True
        with self._fd_lock:
            error, self._sync_error = self._sync_error, None
            if error is not None:
                raise error
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self, sync: bool = False) -> None:
        """Closes the current segment (a later writer of this name starts a new one)."""
        with self._fd_lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


# --- reading --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Partition:
    """The consumer's place in one writer's segments."""

    writer: str
    seq: int
    position: int
    acked: tuple[int, int]
    fd: int | None = None
    fd_seq: int = 0


class QueueReader:
    """The consumer side: `read` micro-batches, `ack` them once their outcome is final.

    One thread uses a reader. `open()` takes the consumer lock (QueueBusy when another process
    consumes the queue) and loads the acknowledged offsets.
    """

    def __init__(self, directory: Path, poll_interval: float = 0.01, fsync: bool = False) -> None:
        self.path = directory
        self.poll_interval = poll_interval
        self.fsync = fsync
        self.skipped_bytes = 0
        """Bytes of torn or corrupt records skipped since open (normally 0)."""
        self._partitions: dict[str, _Partition] = {}
        self._lock_fd: int | None = None
        self._wakeup: threading.Event | None = None

    def open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = try_flock(self.path / CONSUMER_LOCK)
        if fd is None:
            raise QueueBusy(f"another process consumes {self.path}")
        self._lock_fd = fd
        self._wakeup = _wakeup(self.path)
        offsets = self._load_offsets()
        self._recover_recording(offsets)
        for writer, (seq, offset) in offsets.items():
            # An offset inside the magic (0, as written by versions whose `rewind` could go there)
            # means the segment's first record.
            position = max(offset, len(MAGIC))
            self._partitions[writer] = _Partition(writer, seq, position, (seq, position))

    def _load_offsets(self) -> dict[str, tuple[int, int]]:
        try:
            raw = orjson.loads((self.path / OFFSETS_FILE).read_bytes())
            return {str(w): (int(v[0]), int(v[1])) for w, v in raw.items()}
        except FileNotFoundError:
            return {}
        except (orjson.JSONDecodeError, TypeError, ValueError, IndexError, AttributeError) as exc:
            log.warning(
                "queue %s: unreadable %s (%s); redelivering from the oldest segment",
                self.path,
                OFFSETS_FILE,
                exc,
            )
            return {}

    def read(self, max_records: int, wait: float = 0.0) -> list[bytes]:
        """Up to `max_records` events, in append order per writer; when none is queued, waits up
        to `wait` seconds for the first ones. Returns [] when nothing came."""
        assert self._wakeup is not None, "open() the reader first"
        records = self._read_available(max_records)
        remaining = wait
        while not records and remaining > 0:
            step = min(self.poll_interval, remaining)
            self._wakeup.wait(step)
            remaining -= step
            records = self._read_available(max_records)
        return records

    def _read_available(self, max_records: int) -> list[bytes]:
        assert self._wakeup is not None
        self._wakeup.clear()  # before reading: an append after this point wakes the next wait
        segments = list_segments(self.path)
        records: list[bytes] = []
        for writer, seqs in segments.items():
            if len(records) >= max_records:
                break
            part = self._partitions.get(writer)
            if part is None:
                # Acknowledged up to the first record: `rewind` before the first `ack` comes back here.
                start = (seqs[0], len(MAGIC))
                part = self._partitions[writer] = _Partition(writer, *start, acked=start)
            self._read_partition(part, seqs, records, max_records)
        return records

    def _read_partition(self, part: _Partition, seqs: list[int], out: list[bytes], limit: int) -> None:
        while len(out) < limit:
            if part.seq < seqs[0]:
                # Segments were removed behind our back (or the offsets are stale): start at the oldest.
                part.seq, part.position = seqs[0], len(MAGIC)
            if part.seq > seqs[-1]:
                return  # the writer ended its segment and has not created the next one yet
            # `seqs` was listed before this read: a writer finishes a segment before it creates
            # the next one, so everything a sealed segment will ever hold is readable now.
            sealed = part.seq < seqs[-1]
            state = self._read_segment(part, out, limit)
            if state == "full":
                return
            if state == "stuck" and not sealed:
                return  # the live segment: the writer may still be writing the rest
            if state == "stuck":
                self._skip_rest(part)  # a sealed segment without an end marker: its writer died
            self._next_segment(part, seqs)

    def _next_segment(self, part: _Partition, seqs: list[int]) -> None:
        later = [s for s in seqs if s > part.seq]
        part.seq = later[0] if later else part.seq + 1
        part.position = len(MAGIC)

    def _skip_rest(self, part: _Partition) -> None:
        try:
            size = os.stat(self.path / segment_name(part.writer, part.seq)).st_size
        except FileNotFoundError:
            return
        lost = max(0, size - part.position)
        if lost:
            self.skipped_bytes += lost
            log.warning(
                "queue %s: segment %s ends with %d bytes of a torn or corrupt record; skipped",
                self.path,
                segment_name(part.writer, part.seq),
                lost,
            )

    def _segment_fd(self, part: _Partition) -> int | None:
        if part.fd is not None and part.fd_seq == part.seq:
            return part.fd
        self._close_fd(part)
        try:
            fd = os.open(self.path / segment_name(part.writer, part.seq), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        if os.pread(fd, len(MAGIC), 0) not in (MAGIC, MAGIC[: os.fstat(fd).st_size]):
            os.close(fd)
            raise _CorruptSegment
        part.fd, part.fd_seq = fd, part.seq
        return fd

    def _read_segment(self, part: _Partition, out: list[bytes], limit: int) -> str:
        """Appends the segment's complete records to `out`. Returns "full" (limit reached), "end"
        (end marker read), or "stuck" (no complete valid record at the position)."""
        try:
            fd = self._segment_fd(part)
        except _CorruptSegment:
            return "stuck"
        if fd is None:
            return "stuck"
        while len(out) < limit:
            data = os.pread(fd, READ_CHUNK, part.position)
            if not data:
                return "stuck"
            state, used = parse_records(data, out, limit)
            if state == "need" and used == 0 and len(data) == READ_CHUNK:
                data = self._read_large(fd, part.position)
                if data:
                    state, used = parse_records(data, out, limit)
            part.position += used
            if state == "end":
                part.position += FRAME.size
                return "end"
            if state in ("need", "bad") and used == 0:
                return "stuck"
        return "full"

    @staticmethod
    def _read_large(fd: int, position: int) -> bytes:
        """A record larger than READ_CHUNK, when the file holds all of it (a torn record's length
        may be garbage: it is never trusted beyond the file's size)."""
        length = FRAME.unpack(os.pread(fd, FRAME.size, position))[0]
        if position + FRAME.size + length > os.fstat(fd).st_size:
            return b""
        return os.pread(fd, FRAME.size + length, position)

    def ack(self) -> None:
        """Records everything returned by `read` since the last `ack` (any number of calls) as
        consumed and deletes finished segments."""
        offsets = {}
        for part in self._partitions.values():
            part.acked = (part.seq, part.position)
            offsets[part.writer] = [part.seq, part.position]
        _replace_file(self.path / OFFSETS_FILE, orjson.dumps(offsets), self.fsync)
        self._delete_consumed()

    def _delete_consumed(self) -> None:
        for writer, seqs in list_segments(self.path).items():
            part = self._partitions.get(writer)
            if part is None:
                continue
            for seq in seqs:
                if seq >= part.acked[0] or seq == seqs[-1]:
                    break  # a writer's newest segment stays: its number continues the sequence
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path / segment_name(writer, seq))

    def positions(self) -> dict[str, list[int]]:
        """What `ack` would record now: the read position per writer."""
        return {part.writer: [part.seq, part.position] for part in self._partitions.values()}

    def mark_recording(self, failed_log: Path, length: int) -> None:
        """Before appending `length` bytes of a micro-batch's failed events to `failed_log`
        (created here when missing): its inode and size now, with the positions the coming `ack`
        records. A process that dies before that `ack` redelivers the batch, so `open` cuts what it
        appended (`_recover_recording`)."""
        failed_log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(failed_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            stat = os.fstat(fd)
        finally:
            os.close(fd)
        mark = {
            "path": str(failed_log),
            "inode": stat.st_ino,
            "size": stat.st_size,
            "end": stat.st_size + length,
            "ack": self.positions(),
        }
        _replace_file(self.path / RECORDING_FILE, orjson.dumps(mark), self.fsync)

    def end_recording(self) -> None:
        """After the `ack` of a batch `mark_recording` was called for."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / RECORDING_FILE)

    def _recover_recording(self, offsets: dict[str, tuple[int, int]]) -> None:
        """A mark left by a process that died while it recorded a batch: when its `ack` did not
        happen, the failed lines it appended are cut off (the batch is read and fails again).
        Only this consumer appends to its destination's failed log while it streams; a replay or
        the retention moves the file away, and a moved or replaced file (another inode) is left
        alone, as is one that grew past the mark's end (someone appended after these lines: a batch
        pass after the destination left stream mode and before it came back)."""
        try:
            mark = orjson.loads((self.path / RECORDING_FILE).read_bytes())
            target, inode = Path(mark["path"]), int(mark["inode"])
            size, end = int(mark["size"]), int(mark["end"])
            acked = {str(w): (int(v[0]), int(v[1])) for w, v in mark["ack"].items()}
        except FileNotFoundError:
            return
        except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            log.warning("queue %s: unreadable %s (%s); ignored", self.path, RECORDING_FILE, exc)
            self.end_recording()
            return
        # Acknowledged then (or later, when the mark outlived its ack): every writer at or past it.
        if not all(writer in offsets and offsets[writer] >= position for writer, position in acked.items()):
            _cut_back(target, inode, size, end)
        self.end_recording()

    def rewind(self) -> None:
        """Forgets what was read since the last `ack` (by any number of `read` calls): the next
        `read` returns it again."""
        for part in self._partitions.values():
            part.seq, part.position = part.acked

    def pending_bytes(self) -> int:
        """Bytes not acknowledged yet (records, their frames, unreadable tails); safe to call from
        another thread than the reading one."""
        acked = {p.writer: p.acked for p in list(self._partitions.values())}
        total = 0
        for writer, seqs in list_segments(self.path).items():
            seq_acked, position = acked.get(writer, (seqs[0], 0))
            for seq in seqs:
                if seq < seq_acked:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    size = os.stat(self.path / segment_name(writer, seq)).st_size
                    start = max(position, len(MAGIC)) if seq == seq_acked else len(MAGIC)
                    total += max(0, size - start)
        return total

    def close(self) -> None:
        for part in self._partitions.values():
            self._close_fd(part)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @staticmethod
    def _close_fd(part: _Partition) -> None:
        if part.fd is not None:
            with contextlib.suppress(OSError):
                os.close(part.fd)
            part.fd = None


def _cut_back(path: Path, inode: int, size: int, end: int) -> None:
    """Truncates `path` to `size` bytes when it is still the file the mark was taken of and ends
    within the `size`..`end` bytes that run appended (or began to)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        stat = os.fstat(fd)
        if stat.st_ino == inode and size < stat.st_size <= end:
            os.ftruncate(fd, size)
            os.fsync(fd)
            log.warning("%s: cut %d bytes appended by a run that died before its ack", path, stat.st_size - size)
    finally:
        os.close(fd)


class _CorruptSegment(Exception):
    """The segment does not start with the magic bytes."""
