"""Users recognition in the config: EventNative's keys, refusals and warnings."""

from __future__ import annotations

from typing import Any

import pytest

from eventspark.config.loading import ConfigError, build_loaded

WEBHOOK = {"type": "webhook", "mode": "stream", "webhook": {"url": "http://127.0.0.1:9/x"}}
DUCKDB = {"type": "duckdb", "duckdb": {"path": "w.duckdb"}}


def load(destinations: dict[str, Any], **extra: Any) -> Any:
    raw = {"api_keys": [{"id": "w", "server_secret": "s"}], "destinations": destinations, **extra}
    return build_loaded(raw, embedded=False)


def test_eventnative_config_is_accepted_globally_and_per_destination() -> None:
    section = {"enabled": True, "anonymous_id_node": "/anon", "identification_nodes": ["/uid||/user/id"]}
    loaded = load({"dd": {**DUCKDB, "users_recognition": section}}, users_recognition={"enabled": True})
    own = loaded.config.destinations["dd"].users_recognition
    assert own.nodes() == ["/uid||/user/id"] and loaded.warnings == []


def test_a_destination_that_cannot_update_is_refused_or_warned_about() -> None:
    with pytest.raises(ConfigError, match="webhook cannot update rows"):
        load({"wh": {**WEBHOOK, "users_recognition": {"enabled": True}}})
    loaded = load({"wh": WEBHOOK, "dd": DUCKDB}, users_recognition={"enabled": True})
    assert loaded.warnings == ["users_recognition: has no effect on destinations.wh: webhook cannot update rows"]


def test_a_mapping_that_drops_the_ids_is_warned_about() -> None:
    layout = {"mappings": {"keep_unmapped": False, "fields": [{"src": "/n", "dst": "/n", "action": "move"}]}}
    loaded = load({"dd": {**DUCKDB, "data_layout": layout}}, users_recognition={"enabled": True})
    assert len(loaded.warnings) == 1 and "nothing can be recognised" in loaded.warnings[0]
