"""Config sources without `serve`: fetching, payload formats, start errors, the reloader."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from eventspark.config import ConfigError, load_config
from eventspark.config.sources import (
    ConfigSource,
    Reloader,
    SourceError,
    SourcesWatch,
    fetch,
    parse_payload,
    publish,
    published_raw,
    sources_status,
)
from tests.config_sources.conftest import ConfigServer

TOKENS = {"tokens": [{"id": "t1", "client_secret": "c1", "server_secret": "s1"}]}


def write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def test_http_source_needs_the_basic_auth_of_its_url(config_server: ConfigServer) -> None:
    config_server.payloads["/keys"] = TOKENS
    assert orjson.loads(fetch(config_server.url("/keys"))) == TOKENS
    with pytest.raises(SourceError, match="HTTP 401"):
        fetch(config_server.url("/keys", auth=False))


def test_password_is_hidden_where_the_source_is_shown(config_server: ConfigServer) -> None:
    shown = ConfigSource("api_keys", config_server.url("/keys")).shown
    assert "s3cret" not in shown and "cfg:***@127.0.0.1" in shown


def test_payload_formats_of_eventnative() -> None:
    assert parse_payload("api_keys", orjson.dumps(TOKENS)) == TOKENS["tokens"]
    assert parse_payload("api_keys", b"- {client_secret: x}\n") == [{"client_secret": "x"}]
    assert parse_payload("destinations", b'{"destinations": {"a": {"type": "postgres"}}}') == {
        "a": {"type": "postgres"}
    }
    assert parse_payload("destinations", b"a: {type: postgres}\n") == {"a": {"type": "postgres"}}
    with pytest.raises(SourceError, match="tokens"):
        parse_payload("api_keys", b'{"keys": []}')
    with pytest.raises(SourceError):
        parse_payload("destinations", b"[1, 2]")


def test_load_config_reads_file_and_http_sources(tmp_path: Path, config_server: ConfigServer) -> None:
    keys = tmp_path / "keys.json"
    keys.write_bytes(orjson.dumps(TOKENS))
    config_server.payloads["/dest"] = {"destinations": {"pg": {"type": "postgres", "datasource": {"db": "x"}}}}
    path = write(
        tmp_path / "c.yaml",
        {"api_keys": f"file://{keys}", "destinations": config_server.url("/dest"), "log": {"path": str(tmp_path)}},
    )
    loaded = load_config(path)
    assert [k.id for k in loaded.config.api_keys] == ["t1"]
    assert list(loaded.config.destinations) == ["pg"]
    assert set(loaded.sources) == {"api_keys", "destinations"}
    assert loaded.generated_token is None  # tokens from a source: none is generated


def test_a_source_that_cannot_be_read_at_start_is_a_config_error(tmp_path: Path, config_server: ConfigServer) -> None:
    path = write(tmp_path / "c.yaml", {"api_keys": config_server.url("/keys", auth=False)})
    with pytest.raises(ConfigError, match=r"api_keys: source http://127.0.0.1:\d+/keys: HTTP 401"):
        load_config(path)
    path = write(tmp_path / "c.yaml", {"destinations": f"file://{tmp_path}/missing.json"})
    with pytest.raises(ConfigError, match=r"destinations: source .*missing\.json: cannot read"):
        load_config(path)


def test_an_invalid_section_names_its_key_path(tmp_path: Path, config_server: ConfigServer) -> None:
    config_server.payloads["/dest"] = {"pg": {"type": "postgres", "datasource": {"port": "x", "db": "d"}}}
    path = write(tmp_path / "c.yaml", {"destinations": config_server.url("/dest")})
    with pytest.raises(ConfigError, match=r"destinations\.pg\.datasource\.port"):
        load_config(path)


def test_reloader_applies_a_change_and_keeps_the_last_good_config(tmp_path: Path, config_server: ConfigServer) -> None:
    config_server.payloads["/keys"] = TOKENS
    path = write(tmp_path / "c.yaml", {"api_keys": config_server.url("/keys"), "log": {"path": str(tmp_path)}})
    loaded = load_config(path)
    publish(tmp_path, published_raw(loaded))
    watch = SourcesWatch.open(tmp_path)
    assert watch is not None and watch.changed() is None
    applied: list[Any] = []
    reloader = Reloader(loaded, applied.append)
    reloader.start()  # writes the status; its thread waits a period (3 s) first
    try:
        assert not reloader.check(force=True)  # unchanged
        config_server.payloads["/keys"] = {"tokens": [*TOKENS["tokens"], {"id": "t2", "client_secret": "c2"}]}
        assert reloader.check(force=True)
        assert [k.id for k in applied[-1].config.api_keys] == ["t1", "t2"]
        raw = watch.changed()
        assert raw is not None and [k["id"] for k in raw["api_keys"]] == ["t1", "t2"]

        config_server.payloads["/keys"] = b"{broken"
        assert not reloader.check(force=True)
        config_server.payloads["/keys"] = {"tokens": [{"id": "t3"}]}  # no secret: invalid
        assert not reloader.check(force=True)
        assert len(applied) == 1 and watch.changed() is None
        status = sources_status(tmp_path)
        assert status is not None and "needs client_secret or server_secret" in status[0]["error"]
    finally:
        reloader.stop()


def test_errors_are_logged_once_per_change(
    tmp_path: Path, config_server: ConfigServer, caplog: pytest.LogCaptureFixture
) -> None:
    config_server.payloads["/keys"] = TOKENS
    path = write(tmp_path / "c.yaml", {"api_keys": config_server.url("/keys"), "log": {"path": str(tmp_path)}})
    reloader = Reloader(load_config(path), lambda loaded: None)
    del config_server.payloads["/keys"]
    for _ in range(3):
        reloader.check(force=True)
    assert sum("HTTP 404" in r.getMessage() for r in caplog.records) == 1


def test_auth_reload_sec_is_the_older_name_and_wins(tmp_path: Path, config_server: ConfigServer) -> None:
    config_server.payloads["/keys"] = TOKENS
    config = {"api_keys": config_server.url("/keys"), "server": {"auth_reload_sec": 7, "api_keys_reload_sec": 2}}
    reloader = Reloader(load_config(write(tmp_path / "c.yaml", config)), lambda loaded: None)
    assert reloader.states["api_keys"].period == 7


# --- coordination.type ------------------------------------------------------------------------------


def test_coordination_type_redis_uses_meta_storage_redis(tmp_path: Path) -> None:
    config = {"coordination": {"type": "redis"}, "meta": {"storage": {"redis": {"host": "h", "port": 6380}}}}
    loaded = load_config(write(tmp_path / "c.yaml", config))
    assert loaded.config.coordination is not None and loaded.config.coordination.redis is not None
    assert loaded.config.coordination.redis.port == 6380


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"type": "redis"}, "coordination.type redis needs meta.storage.redis"),
        ({"type": "etcd"}, "type etcd needs coordination.etcd.endpoint"),
        ({"type": "inmemory", "redis": {"host": "h"}}, "type inmemory does not use coordination.redis"),
        ({"type": "zookeeper"}, "coordination.type"),
    ],
)
def test_coordination_type_without_its_settings(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "c.yaml", {"coordination": section}))


# --- sql_debug_log and the rotating files -----------------------------------------------------------------


def test_sql_debug_lines_hide_parameters(tmp_path: Path) -> None:
    from eventspark.config.models import SqlDebugLogConfig
    from eventspark.destinations.sql import debug_log

    debug_log.configure(
        SqlDebugLogConfig.model_validate({"ddl": {"path": str(tmp_path)}, "queries": {"path": str(tmp_path / "q.log")}})
    )
    try:
        debug_log.log_statement("pg", 'CREATE TABLE "s"."t"\n  ("a" text)')
        debug_log.log_statement("pg", b'INSERT INTO "s"."t" VALUES (%s)', ["secret-value"])
    finally:
        debug_log.configure(None)
    ddl = (tmp_path / "ddl.log").read_text()
    queries = (tmp_path / "q.log").read_text()
    assert ddl.endswith(' [pg] CREATE TABLE "s"."t" ("a" text)\n')
    assert queries.endswith(' [pg] INSERT INTO "s"."t" VALUES (%s); 1 parameter(s)\n')
    assert "secret-value" not in queries


def test_rotating_file_keeps_max_backups(tmp_path: Path) -> None:
    from eventspark.logconfig import RotatingFile

    file = RotatingFile(tmp_path / "x.log", rotation_min=0.01, max_backups=2)
    for n in range(4):
        file.write(f"line {n}")
        file._next = 0  # due now
        time.sleep(1.01)  # one rotated name per second
    file.write("last")
    file.close()
    assert (tmp_path / "x.log").read_text() == "last\n"
    backups = sorted(tmp_path.glob("x-*.log"))
    assert [p.read_text() for p in backups] == ["line 2\n", "line 3\n"]


def test_sql_debug_log_wraps_slotted_clients_and_logs_once(tmp_path: Path) -> None:
    from dataclasses import dataclass, field

    from eventspark.config.models import SqlDebugLogConfig
    from eventspark.destinations.sql import debug_log

    @dataclass(slots=True)
    class Client:  # like ClickHouse's: slots, `rows` built on `execute`, `doing` optional
        seen: list[str] = field(default_factory=list)

        def execute(self, sql: str, doing: str = "running", data: bytes | None = None) -> str:
            self.seen.append(sql)
            return "ok"

        def rows(self, sql: str, doing: str = "reading") -> str:
            return self.execute(f"{sql} FORMAT JSON", doing)

    debug_log.configure(SqlDebugLogConfig.model_validate({"queries": {"path": str(tmp_path / "q.log")}}))
    try:
        client = debug_log.wrap(Client(), "ch")
        assert isinstance(client, Client)
        assert client.rows("SELECT 1") == "ok"
        assert client.execute("INSERT INTO t FORMAT TSV", "inserting", b"1\t2\n") == "ok"
        client.execute("ALTER TABLE t ADD COLUMN c String")  # no ddl file: not written anywhere
    finally:
        debug_log.configure(None)
    lines = (tmp_path / "q.log").read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["SELECT 1", "INSERT INTO t FORMAT TSV"]
    assert client.seen == ["SELECT 1 FORMAT JSON", "INSERT INTO t FORMAT TSV", "ALTER TABLE t ADD COLUMN c String"]


def test_the_generated_token_survives_a_reload_of_destinations(tmp_path: Path, config_server: ConfigServer) -> None:
    config_server.payloads["/dest"] = {"a": {"type": "postgres", "datasource": {"db": "x"}}}
    path = write(tmp_path / "c.yaml", {"destinations": config_server.url("/dest"), "log": {"path": str(tmp_path)}})
    loaded = load_config(path)
    assert loaded.generated_token is not None
    applied: list[Any] = []
    reloader = Reloader(loaded, applied.append)
    config_server.payloads["/dest"] = {"b": {"type": "postgres", "datasource": {"db": "y"}}}
    assert reloader.check(force=True)
    assert [k.client_secret for k in applied[0].config.api_keys] == [loaded.generated_token.client_secret]
    assert list(applied[0].config.destinations) == ["b"]


def test_server_auth_as_a_source(tmp_path: Path, config_server: ConfigServer) -> None:
    config_server.payloads["/auth"] = b"tokens:\n  - {id: old, client_secret: c0}\n"  # YAML
    loaded = load_config(write(tmp_path / "c.yaml", {"server": {"auth": config_server.url("/auth")}}))
    assert [k.id for k in loaded.config.api_keys] == ["old"] and set(loaded.sources) == {"server.auth"}
    assert loaded.generated_token is None
