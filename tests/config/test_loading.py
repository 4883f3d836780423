import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from eventspark.config import ConfigError, load_config
from eventspark.destinations.clickhouse.configuration import ClickHouseDestination
from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.destinations.postgres.configuration import PostgresDestination

REFERENCE_CONFIG = """
server:
  name: collector-01
  port: 8001
  admin_token: change-me
  max_columns: 100
  metrics: {prometheus: {enabled: true}}
api_keys:
  - id: web
    client_secret: 5f15eba2-js
    server_secret: 9b6c31c2-s2s
    origins: ['*example.com']
log: {path: ./events, rotation_min: 5}
geo.maxmind_path: /path/GeoIP2-City.mmdb
destinations:
  pg:
    type: postgres
    mode: batch
    only_tokens: [web]
    datasource: {host: localhost, port: 5432, db: analytics, schema: public, username: u, password: p}
    data_layout:
      table_name_template: '{{.event_type}}_{{._timestamp.Format "2006_01"}}'
      primary_key_fields: [eventn_ctx_event_id]
      mappings:
        keep_unmapped: true
        fields:
          - {src: /key1/key3, dst: /key4, action: move, type: varchar(256)}
          - {src: /secret, action: remove}
          - {src: /amount, action: cast, type: 'numeric(12,2)'}
          - {dst: /app, action: constant, value: shop}
    enrichment:
      - {name: ip_lookup, from: /ip, to: /geo}
      - {name: user_agent_parse, from: /ua, to: /parsed_ua}
  ch:
    type: clickhouse
    clickhouse:
      dsns: ["http://default:@localhost:8123/analytics"]
      db: analytics
      engine:
        partition_fields: [{function: toYYYYMM, field: _timestamp}]
        order_fields: [{field: eventn_ctx_event_id}]
coordination: {redis: {host: localhost, port: 6379}}
"""


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reference_config_loads(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, REFERENCE_CONFIG), env={})
    cfg = loaded.config
    assert loaded.warnings == []
    assert loaded.generated_token is None
    assert cfg.server.name == "collector-01"
    assert cfg.geo.maxmind_path == "/path/GeoIP2-City.mmdb"
    assert [k.id for k in cfg.api_keys] == ["web"]
    pg = cfg.destinations["pg"]
    assert isinstance(pg, PostgresDestination)
    assert pg.datasource.schema_ == "public"
    assert pg.data_layout.mappings is not None
    assert [f.action for f in pg.data_layout.mappings.fields] == ["move", "remove", "cast", "constant"]
    assert pg.enrichment[0].from_ == "/ip"
    ch = cfg.destinations["ch"]
    assert isinstance(ch, ClickHouseDestination)
    assert ch.clickhouse.engine.partition_fields[0].function == "toYYYYMM"
    assert cfg.coordination is not None and cfg.coordination.redis is not None
    assert cfg.spark.master == "local[*]"


def test_json_config_and_env_substitution(tmp_path: Path) -> None:
    text = """{"server": {"port": "${env.ES_PORT}", "admin_token": "${env.ES_ADMIN:-fallback}"},
               "api_keys": [{"client_secret": "${env.ES_SECRET}"}]}"""
    cfg = load_config(write(tmp_path, text, "c.json"), env={"ES_PORT": "9000", "ES_SECRET": "s3"}).config
    assert cfg.server.port == 9000
    assert cfg.server.admin_token == "fallback"
    assert cfg.api_keys[0].client_secret == "s3"


def test_missing_env_var_names_the_key(tmp_path: Path) -> None:
    text = "destinations:\n  pg:\n    type: postgres\n    datasource: {db: x, password: '${env.NOPE_PW}'}\n"
    with pytest.raises(ConfigError, match=r"destinations\.pg\.datasource\.password: environment variable NOPE_PW"):
        load_config(write(tmp_path, text), env={})


def test_token_id_defaults_to_md5_of_secrets(tmp_path: Path) -> None:
    text = "api_keys:\n  - {client_secret: abc, server_secret: def}\n  - plain-token\n"
    keys = load_config(write(tmp_path, text), env={}).config.api_keys
    assert keys[0].id == hashlib.md5(b"abcdef").hexdigest()
    assert keys[1].client_secret == keys[1].server_secret == "plain-token"


def test_server_auth_is_merged_into_api_keys(tmp_path: Path) -> None:
    text = "server:\n  auth: [{id: legacy, client_secret: a}]\napi_keys: [{id: new, client_secret: b}]\n"
    assert [k.id for k in load_config(write(tmp_path, text), env={}).config.api_keys] == ["new", "legacy"]


def test_duplicate_token_ids_rejected(tmp_path: Path) -> None:
    text = "api_keys: [{id: a, client_secret: x}, {id: a, client_secret: y}]\n"
    with pytest.raises(ConfigError, match="used twice"):
        load_config(write(tmp_path, text), env={})


def test_generated_token_when_none_configured(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, "server: {port: 8100}\n"), env={})
    token = loaded.generated_token
    assert token is not None and len(token.client_secret) >= 24
    assert token.client_secret == token.server_secret
    assert loaded.config.api_keys == [token]
    assert loaded.config.destinations == {}


def test_embedded_defaults() -> None:
    loaded = load_config(None, env={})
    cfg = loaded.config
    assert cfg.server.port == 8001
    assert cfg.log.path == "./events" and cfg.log.rotation_min == 1
    assert isinstance(cfg.destinations["duckdb"], DuckDBDestination)
    assert cfg.destinations["duckdb"].mode == "batch"
    assert loaded.generated_token is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server: {port: abc}", r"server\.port: Input should be a valid integer"),
        ("server: {port: 70000}", r"server\.port: Input should be less than or equal to 65535"),
        ("destinations: {pg: {type: postgres}}", r"destinations\.pg\.datasource: Field required"),
        (
            "destinations: {pg: {type: postgress, datasource: {db: a}}}",
            r"destinations\.pg: .*unknown destination type .postgress.; supported types: [a-z, ]*clickhouse, duckdb",
        ),
        ("destinations: {pg: {type: postgres, mode: fast, datasource: {db: a}}}", r"destinations\.pg\.mode"),
        ("log: {rotation_min: 0}", r"log\.rotation_min: Input should be greater than 0"),
        ("api_keys: [{id: x}]", r"api_keys\.0: Value error, a token needs client_secret or server_secret"),
        ("coordination: {redis: {}, etcd: {endpoint: e}}", r"coordination: Value error, choose one"),
        (
            "destinations: {d: {type: duckdb, enrichment: [{name: geo, from: /a, to: /b}]}}",
            r"destinations\.d\.enrichment\.0\.name",
        ),
        ("- just\n- a list", r"<root>: the config must be a mapping"),
        ("server: [unclosed", r"is not valid YAML"),
    ],
)
def test_bad_config_names_key_path_and_reason(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), env={})


def test_unknown_keys_are_warned(tmp_path: Path) -> None:
    text = "server: {port: 8001, colour: blue}\nlog: {path: x, rotaton_min: 3}\nmystery: 1\n"
    warnings = load_config(write(tmp_path, text), env={}).warnings
    assert sorted(warnings) == [
        "log.rotaton_min: unknown key, ignored",
        "mystery: unknown key, ignored",
        "server.colour: unknown key, ignored",
    ]


def test_unknown_keys_in_destinations_are_warned(tmp_path: Path) -> None:
    text = "destinations: {d: {type: duckdb, data_layout: {table_nam_template: x}}}\n"
    warnings = load_config(write(tmp_path, text), env={}).warnings
    assert warnings == ["destinations.d.data_layout.table_nam_template: unknown key, ignored"]


def test_bad_template_is_a_config_error(tmp_path: Path) -> None:
    text = "destinations: {d: {type: duckdb, data_layout: {table_name_template: '{{.a'}}}\n"
    with pytest.raises(ConfigError, match=r"destinations\.d\.data_layout\.table_name_template: "):
        load_config(write(tmp_path, text), env={})


def test_bad_mapping_is_a_config_error(tmp_path: Path) -> None:
    text = "destinations: {d: {type: duckdb, data_layout: {mappings: {fields: [{src: /a, action: cast}]}}}}\n"
    with pytest.raises(ConfigError, match=r"destinations\.d\.data_layout\.mappings: "):
        load_config(write(tmp_path, text), env={})


def test_unquoted_type_in_yaml_flow_mapping_is_explained(tmp_path: Path) -> None:
    # In a YAML flow mapping the comma of numeric(12,2) ends the value: the error says so.
    text = (
        "destinations: {d: {type: duckdb, data_layout: "
        "{mappings: {fields: [{src: /a, action: cast, type: numeric(12,2)}]}}}}\n"
    )
    with pytest.raises(ConfigError, match=r"quote it"):
        load_config(write(tmp_path, text), env={})


def test_legacy_mapping_syntax(tmp_path: Path) -> None:
    text = "destinations: {d: {type: duckdb, data_layout: {mapping: ['/a/b -> /c', '/secret ->']}}}\n"
    mappings = load_config(write(tmp_path, text), env={}).config.destinations["d"].data_layout.mappings
    assert mappings is not None
    assert [(f.src, f.dst, f.action) for f in mappings.fields] == [("/a/b", "/c", "move"), ("/secret", None, "remove")]


def test_only_tokens_must_name_a_token(tmp_path: Path) -> None:
    text = "api_keys: [{id: web, client_secret: s}]\ndestinations: {d: {type: duckdb, only_tokens: [mobile]}}\n"
    with pytest.raises(ConfigError, match=r"destinations\.d\.only_tokens: no api key has id or secret 'mobile'"):
        load_config(write(tmp_path, text), env={})


def test_spark_section(tmp_path: Path) -> None:
    text = "spark: {master: 'spark://h:7077', conf: {spark.executor.memory: 2g, spark.sql.adaptive.enabled: true}}\n"
    spark = load_config(write(tmp_path, text), env={}).config.spark
    assert spark.master == "spark://h:7077"
    assert spark.conf == {"spark.executor.memory": "2g", "spark.sql.adaptive.enabled": "true"}


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eventspark.cli", "check", *args], capture_output=True, text=True, timeout=60
    )


def test_check_command_on_good_config(tmp_path: Path) -> None:
    result = run_check("-c", str(write(tmp_path, REFERENCE_CONFIG)))
    assert result.returncode == 0, result.stderr
    assert "config OK: 1 token(s), 2 destination(s)" in result.stdout
    assert "pg: postgres, batch mode" in result.stdout


def test_check_command_on_bad_config(tmp_path: Path) -> None:
    result = run_check("-c", str(write(tmp_path, "server: {port: abc}\nextra: 1\n")))
    assert result.returncode == 2
    assert "server.port: Input should be a valid integer" in result.stderr


def test_check_command_on_missing_file(tmp_path: Path) -> None:
    result = run_check("-c", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert "cannot read config file" in result.stderr


def test_check_refuses_an_unsupported_type_naming_the_supported_ones(tmp_path: Path) -> None:
    from eventspark.destinations.registry import REGISTRY

    # every EventNative type is registered since issue 15: an unknown type gets the same listing
    text = "destinations: {q: {type: kafka, kafka: {brokers: 'localhost:9092'}}}\n"
    result = run_check("-c", str(write(tmp_path, text)))
    assert result.returncode == 2
    supported = ", ".join(sorted(REGISTRY))
    assert {"clickhouse", "duckdb", "mysql", "postgres", "webhook"} <= set(REGISTRY)
    assert f"unknown destination type 'kafka'; supported types: {supported}" in result.stderr


def test_check_fails_on_keys_without_effect(tmp_path: Path) -> None:
    text = "destinations: {d: {type: duckdb, stream: {min_insert_rows: 5}, colour: blue}}\n"
    result = run_check("-c", str(write(tmp_path, text)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "destinations.d.stream: has no effect in batch mode" in result.stderr
    assert "destinations.d.colour: unknown key, ignored" in result.stderr


@pytest.mark.parametrize("where", ["global", "destination"])
def test_users_recognition_on_a_type_that_cannot_update(tmp_path: Path, where: str) -> None:
    """Users recognition (docs/users-recognition.md): a type without updates is refused in the
    destination's own section, warned about when turned on globally; a SQL warehouse takes it."""
    section = "users_recognition: {enabled: true}"
    webhook = "type: webhook, mode: stream, webhook: {url: 'http://127.0.0.1:9/x'}"
    if where == "global":
        text = f"{section}\ndestinations: {{w: {{{webhook}}}}}\n"
        expected, code = "users_recognition: has no effect on destinations.w: webhook cannot update rows", 1
    else:
        text = f"destinations: {{w: {{{webhook}, {section}}}}}\n"
        expected, code = "destinations.w.users_recognition: webhook cannot update rows", 2
    result = run_check("-c", str(write(tmp_path, text)))
    assert result.returncode == code, result.stdout + result.stderr
    assert expected in result.stderr
    duckdb = f"destinations: {{d: {{type: duckdb, {section}}}}}\n"
    assert run_check("-c", str(write(tmp_path, duckdb))).returncode == 0


def test_a_type_without_the_mode_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import dataclasses

    from eventspark.destinations import registry

    duck = registry.REGISTRY["duckdb"]
    batch_only = dataclasses.replace(
        duck, capabilities=dataclasses.replace(duck.capabilities, modes=frozenset({"batch"}))
    )
    monkeypatch.setattr(registry, "REGISTRY", {**registry.REGISTRY, "duckdb": batch_only})
    with pytest.raises(
        ConfigError, match=r"destinations\.d: .*type 'duckdb' does not support mode 'stream'; it supports: batch"
    ):
        load_config(write(tmp_path, "destinations: {d: {type: duckdb, mode: stream}}\n"), env={})


def test_a_missing_driver_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import dataclasses

    from typer.testing import CliRunner

    from eventspark.cli import app
    from eventspark.destinations import build_destination, registry
    from eventspark.destinations.base import TerminalError

    absent = dataclasses.replace(registry.REGISTRY["postgres"], driver="eventspark_no_such_driver")
    monkeypatch.setattr(registry, "REGISTRY", {**registry.REGISTRY, "postgres": absent})
    path = write(tmp_path, "destinations: {pg: {type: postgres, datasource: {db: a}}}\n")
    result = CliRunner().invoke(app, ["check", "-c", str(path)])
    assert result.exit_code == 2
    assert "destinations.pg: destination type 'postgres' needs the 'eventspark_no_such_driver' package" in result.output
    assert "pip install 'eventspark[postgres]'" in result.output
    with pytest.raises(TerminalError, match=r"eventspark\[postgres\]"):
        build_destination("pg", load_config(path, env={}).config.destinations["pg"], tmp_path)


def test_the_block_may_be_spelled_config(tmp_path: Path) -> None:
    """EventNative's newer spelling: `config:` holds the type's block."""
    text = (
        "destinations:\n"
        "  pg: {type: postgres, config: {host: db.example, db: analytics, schema: web}}\n"
        "  ch: {type: clickhouse, config: {dsns: ['http://ch:8123/x'], db: x}}\n"
        "  both: {type: postgres, datasource: {db: a}, config: {db: b}}\n"
    )
    loaded = load_config(write(tmp_path, text))
    pg = loaded.config.destinations["pg"]
    assert isinstance(pg, PostgresDestination)
    assert (pg.datasource.host, pg.datasource.db, pg.datasource.schema_) == ("db.example", "analytics", "web")
    ch = loaded.config.destinations["ch"]
    assert isinstance(ch, ClickHouseDestination) and ch.clickhouse.db == "x"
    both = loaded.config.destinations["both"]
    assert isinstance(both, PostgresDestination) and both.datasource.db == "a"
    assert any("destinations.both.config" in w for w in loaded.warnings), loaded.warnings


def test_primary_keys_of_a_destination_that_never_replaces_events_are_reported(tmp_path: Path) -> None:
    text = (
        "destinations:\n"
        "  hook: {type: webhook, mode: stream, webhook: {url: 'http://example.com'},"
        " data_layout: {primary_key_fields: [id]}}\n"
        "  pg: {type: postgres, datasource: {db: a}, data_layout: {primary_key_fields: [id]}}\n"
    )
    warnings = load_config(write(tmp_path, text), env={}).warnings
    assert warnings == ["destinations.hook.data_layout.primary_key_fields: webhook never replaces events"]


def test_without_a_mode_a_type_with_one_mode_runs_in_it(tmp_path: Path) -> None:
    text = (
        "destinations:\n"
        "  hook: {type: webhook, webhook: {url: 'http://example.com/e'}}\n"
        "  lake: {type: s3, s3: {bucket: lake}}\n"
        "  pg: {type: postgres, datasource: {db: a}}\n"
        "  sent: {type: webhook, mode: batch, webhook: {url: 'http://example.com/e'}}\n"
    )
    with pytest.raises(ConfigError, match=r"type 'webhook' does not support mode 'batch'"):
        load_config(write(tmp_path, text), env={})
    loaded = load_config(write(tmp_path, text.rsplit("  sent:", 1)[0]), env={})
    modes = {dest_id: dest.mode for dest_id, dest in loaded.config.destinations.items()}
    assert modes == {"hook": "stream", "lake": "batch", "pg": "batch"}


REMOTE = "log: {path: ./events, remote: {url: 's3://bucket/events'}}\ndestinations: {d: {type: duckdb}}\n"


@pytest.mark.parametrize("coordination", ["", "coordination: {lock_lease_sec: 5}\n"])
def test_log_remote_without_a_shared_coordination_is_refused(tmp_path: Path, coordination: str) -> None:
    # Review: the in-memory default lock is each node's own, so the cluster's pass lock protected
    # nothing: two nodes could run passes over the same logs at once.
    path = write(tmp_path, REMOTE + coordination)
    with pytest.raises(ConfigError, match=r"log\.remote: .*coordination\.redis or coordination\.etcd"):
        load_config(path, env={})
    result = run_check("-c", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "configure coordination.redis or coordination.etcd" in result.stderr


def test_log_remote_with_inmemory_coordination_chosen_is_a_single_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, REMOTE + "coordination: {type: inmemory}\n")
    with caplog.at_level("WARNING", logger="eventspark.config.loading"):
        load_config(path, env={})
    assert "a single node" in caplog.text
    result = run_check("-c", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "coordination type inmemory" in result.stderr
    shared = write(tmp_path, REMOTE + "coordination: {redis: {host: localhost}}\n")
    assert load_config(shared, env={}).config.log.remote is not None
