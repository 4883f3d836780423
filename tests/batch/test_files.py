"""Status files, archive, failed logs, rotated names: the batch job's files on disk."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from pathlib import Path

import orjson

from eventspark.logs.archive import archive_log
from eventspark.logs.failed import (
    PENDING_DIR,
    append_settled,
    event_error_line,
    failed_log_path,
    park_spools,
    parked_spools,
    remove_groups,
)
from eventspark.logs.rotated import rotated_logs, rotated_token
from eventspark.logs.status import (
    PairStatus,
    all_uploaded,
    merge_status,
    read_status,
    status_path,
    uploaded_tables,
    write_status,
)


def test_status_round_trip_in_eventnative_format(tmp_path: Path) -> None:
    log = tmp_path / "incoming.tok=web-2020-08-02T18-00-00.000.log"
    assert read_status(log) == {}
    write_status(log, {"pg": {"users": PairStatus(True), "views": PairStatus(False, "boom")}, "dd": {}})
    raw = orjson.loads(status_path(log).read_bytes())
    assert raw == {
        "pg": {"users": {"uploaded": True, "error": ""}, "views": {"uploaded": False, "error": "boom"}},
        "dd": {},
    }
    status = read_status(log)
    assert uploaded_tables(status, "pg") == {"users"} and not all_uploaded(status)
    status_path(log).write_text("{not json")
    assert read_status(log) == {}


def test_merge_never_turns_an_uploaded_pair_back_to_failed() -> None:
    old = {"pg": {"a": PairStatus(True), "b": PairStatus(False, "x")}}
    new = {"pg": {"a": PairStatus(False, "late"), "b": PairStatus(True)}, "dd": {"c": PairStatus(True)}}
    merged = merge_status(old, new)
    assert merged == {"pg": {"a": PairStatus(True), "b": PairStatus(True)}, "dd": {"c": PairStatus(True)}}
    assert all_uploaded(merged) and old["pg"]["b"] == PairStatus(False, "x")


def test_archive_gzips_into_the_day_folder_and_removes_log_and_status(tmp_path: Path) -> None:
    log = tmp_path / "incoming" / "incoming.tok=web-2020-08-02T18-00-00.000.log"
    log.parent.mkdir()
    log.write_bytes(b'{"a":1}\n')
    write_status(log, {})
    target = archive_log(log, tmp_path / "archive", now=datetime(2021, 3, 4, 23, 59, tzinfo=UTC))
    assert target == tmp_path / "archive" / "2021-03-04" / (log.name + ".gz")
    assert gzip.decompress(target.read_bytes()) == b'{"a":1}\n'
    assert not log.exists() and not status_path(log).exists()
    assert list(target.parent.iterdir()) == [target]


def test_failed_lines_keep_the_event_and_spools_append(tmp_path: Path) -> None:
    line = event_error_line(orjson.Fragment(b'{"eventn_ctx":{"event_id":"e1"},"x":1}'), "bad", "e1")
    assert orjson.loads(line) == {"event": {"eventn_ctx": {"event_id": "e1"}, "x": 1}, "error": "bad", "event_id": "e1"}
    assert orjson.loads(event_error_line({"eventn_ctx_event_id": "e2"}, "oops"))["event_id"] == "e2"
    assert orjson.loads(event_error_line("not json", "oops")) == {"event": "not json", "error": "oops", "event_id": ""}
    spools = [tmp_path / "a.log", tmp_path / "b.log"]
    spools[0].write_bytes(line)
    spools[1].write_bytes(line)
    failed_dir = tmp_path / "failed"
    first = park_spools(failed_dir, "log-1", "pg", "t", [*spools, tmp_path / "missing.log"])
    append_settled(failed_dir, "pg", [first])
    spools[0].write_bytes(line)
    append_settled(failed_dir, "pg", [park_spools(failed_dir, "log-2", "pg", "t", spools[:1])])
    assert failed_log_path(failed_dir, "pg").read_bytes() == line * 3


def test_parked_spools_survive_until_settled(tmp_path: Path) -> None:
    failed_dir = tmp_path / "failed"
    spools = []
    for name, text in (("a", b"1\n"), ("b", b"2\n"), ("c", b"3\n")):
        spools.append(tmp_path / f"{name}.log")
        spools[-1].write_bytes(text)
    kept = park_spools(failed_dir, "log-1", "pg", "t|x", spools[:2])
    dropped = park_spools(failed_dir, "log-2", "pg", "t", spools[2:])
    (failed_dir / PENDING_DIR / "cut-short").mkdir()  # parking interrupted before its manifest
    assert not any(spool.exists() for spool in spools)

    found = parked_spools(failed_dir)  # as the next pass finds them

    assert sorted(found, key=lambda g: g.log) == [kept, dropped]
    assert not (failed_dir / PENDING_DIR / "cut-short").exists()
    append_settled(failed_dir, "pg", [kept])
    remove_groups([dropped])
    assert failed_log_path(failed_dir, "pg").read_bytes() == b"1\n2\n"
    assert list((failed_dir / PENDING_DIR).iterdir()) == []


def test_rotated_logs_are_found_by_name(tmp_path: Path) -> None:
    names = [
        "incoming.tok=web-2020-08-02T18-00-01.000.log",
        "incoming.tok=web|w=2-2020-08-02T18-00-00.000.log",
        "incoming.tok=web.log",
        "incoming.tok=web-2020-08-02T18-00-01.000.log.status",
        "other.txt",
    ]
    for name in names:
        (tmp_path / name).write_text("")
    assert [p.name for p in rotated_logs(tmp_path)] == names[:2]
    assert rotated_token(names[1]) == "web" and rotated_token(names[2]) is None
    assert rotated_logs(tmp_path / "missing") == []
