"""`eventspark check --connect` exit codes and `eventspark dry-run`, each in its own process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from tests.collector.conftest import TESTDATA
from tests.tools.conftest import S2S, TOKENS, closed_port

EVENTSPARK = Path(sys.executable).with_name("eventspark")


def write(tmp_path: Path, destinations: dict[str, Any]) -> Path:
    path = tmp_path / "eventspark.json"
    config = {"api_keys": TOKENS, "log": {"path": str(tmp_path / "events")}, "destinations": destinations}
    path.write_bytes(orjson.dumps(config))
    return path


def run(*args: str, stdin: bytes = b"", timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(EVENTSPARK), *args], input=stdin, capture_output=True, timeout=timeout, check=False)


def test_check_connect(tmp_path: Path, pg_datasource: dict[str, Any]) -> None:
    duck = {"type": "duckdb"}
    good = write(tmp_path, {"pg": {"type": "postgres", "datasource": pg_datasource}, "dd": duck})
    done = run("check", "-c", str(good), "--connect")
    text = done.stdout.decode()
    assert done.returncode == 0, text + done.stderr.decode()
    assert "pg: ok: created, read and dropped table _eventspark_probe_" in text
    assert "dd: ok:" in text
    bad_source = {**pg_datasource, "port": closed_port()}
    bad = write(tmp_path, {"pg": {"type": "postgres", "datasource": bad_source}, "dd": duck})
    done = run("check", "-c", str(bad), "--connect")
    text = done.stdout.decode()
    assert done.returncode == 1
    assert "pg: error: Unable to connect to the destination" in text and "Connection refused" in text
    assert "dd: ok:" in text
    assert run("check", "-c", str(bad)).returncode == 0  # without --connect nothing is tried


def test_check_connect_is_bounded(tmp_path: Path, black_hole: int) -> None:
    source = {"host": "127.0.0.1", "port": black_hole, "db": "test"}
    config = write(tmp_path, {"pg": {"type": "postgres", "datasource": source}})
    started = time.monotonic()
    done = run("check", "-c", str(config), "--connect", "--timeout", "2")
    assert done.returncode == 1
    assert "no answer within 2 s" in done.stdout.decode()
    assert time.monotonic() - started < 10  # the hung probe's thread does not hold the exit


def test_dry_run_stdin_and_file(tmp_path: Path) -> None:
    layout = {"table_name_template": '{{if eq .event_type "skip"}}{{else}}dry_run{{end}}'}
    config = write(tmp_path, {"dd": {"type": "duckdb", "data_layout": layout}})
    vector = (TESTDATA / "api_event_input_1.0.json").read_bytes()
    done = run("dry-run", "-c", str(config), "--destination", "dd", stdin=vector)
    text = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "table dry_run" in text and "event_data_customkey_key1" in text and "BIGINT" in text
    events = tmp_path / "events.json"
    events.write_bytes(orjson.dumps([{"event_type": "a", "n": 1.5}, {"event_type": "skip"}]))
    done = run("dry-run", "-c", str(config), "-d", "dd", "--file", str(events), "--json")
    assert done.returncode == 0
    answer = orjson.loads(done.stdout)
    first, second = answer["events"]
    assert answer["destination_id"] == "dd"
    assert {"field": "n", "type": "DOUBLE", "value": 1.5} in first["fields"]
    assert {"field": "api_key", "type": "VARCHAR", "value": S2S} in first["fields"]
    assert second["status"] == "skipped"
    assert not (tmp_path / "events").exists()  # nothing written


def test_dry_run_failures(tmp_path: Path) -> None:
    cast = {"fields": [{"src": "/n", "action": "cast", "type": "integer"}]}
    config = write(tmp_path, {"dd": {"type": "duckdb", "data_layout": {"mappings": cast}}})
    failed = run("dry-run", "-c", str(config), "-d", "dd", stdin=b'{"n": "many"}')
    assert failed.returncode == 1 and "failed" in failed.stdout.decode()
    unknown = run("dry-run", "-c", str(config), "-d", "nope", stdin=b"{}")
    assert unknown.returncode == 2 and "no destination 'nope'" in unknown.stderr.decode()
    not_json = run("dry-run", "-c", str(config), "-d", "dd", stdin=b"{")
    assert not_json.returncode == 2 and "Failed to parse body" in not_json.stderr.decode()
