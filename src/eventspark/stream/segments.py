"""The queue's on-disk format: segment names, record framing and parsing (see `stream.queue`)."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import zlib
from pathlib import Path

MAGIC = b"ESQUEUE1"
FRAME = struct.Struct("<II")
END_OF_SEGMENT = FRAME.pack(0, 0)
MAX_RECORD = 1 << 31
_SEGMENT_NAME = re.compile(r"^(?P<writer>[A-Za-z0-9_-]+)\.(?P<seq>\d{12})\.dque$")


def segment_name(writer: str, seq: int) -> str:
    return f"{writer}.{seq:012d}.dque"


def try_flock(path: Path) -> int | None:
    """An fd holding an exclusive flock on `path`, or None when another holder has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def list_segments(directory: Path) -> dict[str, list[int]]:
    """Segment numbers per writer, ascending."""
    found: dict[str, list[int]] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        match = _SEGMENT_NAME.match(name)
        if match is not None:
            found.setdefault(match.group("writer"), []).append(int(match.group("seq")))
    for seqs in found.values():
        seqs.sort()
    return found


def frame(payload: bytes) -> bytes:
    """One record: length, CRC-32, payload."""
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def frame_lines(data: bytes) -> bytes:
    """Every non-empty line of `data` (newline-terminated lines) as one record each."""
    if data.count(b"\n") <= 1:
        line = data[:-1] if data.endswith(b"\n") else data
        return frame(line) if line else b""
    return b"".join(frame(line) for line in data.split(b"\n") if line)


def parse_records(data: bytes, out: list[bytes], limit: int) -> tuple[str, int]:
    """Complete valid records of `data` into `out`. Returns (state, bytes used): "more" (all of
    `data` used or limit reached), "end" (end marker at `used`), "need" (an incomplete record at
    `used`), "bad" (a CRC mismatch or impossible length at `used`)."""
    view = memoryview(data)
    pos, size, unpack, crc32 = 0, len(data), FRAME.unpack_from, zlib.crc32
    while len(out) < limit:
        if size - pos < FRAME.size:
            return ("need" if pos < size else "more"), pos
        length, crc = unpack(data, pos)
        if length == 0:
            return ("end" if crc == 0 else "bad"), pos
        if length >= MAX_RECORD:
            return "bad", pos
        end = pos + FRAME.size + length
        if end > size:
            return "need", pos
        payload = view[pos + FRAME.size : end]
        if crc32(payload) != crc:
            return "bad", pos
        out.append(payload.tobytes())
        pos = end
    return "more", pos
