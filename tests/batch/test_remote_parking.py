"""Failed events exactly once across nodes with `log.remote` (`logs.store.ParkClaims`): a node
whose pass died after parking its failed events, and another node's pass that loaded the same log
meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventspark.logs.remote import remote_filesystem
from tests.batch.helpers import event, failed_lines, pg_conninfo, pg_rows, postgres_destination
from tests.batch.test_remote_pass import incoming_names, put_remote, remote, remote_config, run

__all__ = ["remote"]  # the fixture, used by name

pytestmark = pytest.mark.spark


def crash_at(point: str) -> Any:
    def crash(at: str) -> None:
        if at == point:
            raise SystemExit(f"crash at {at}")

    return crash


def nodes(tmp_path: Path, remote: dict[str, Any], pg: dict[str, Any], **layout: Any) -> tuple[Any, Any]:
    """Two nodes of one cluster: their own log.path, the same store and Postgres schema."""
    destinations = {"pg": postgres_destination(pg, "t", **layout)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return (
        remote_config(tmp_path / "a", remote, destinations, node="node-a"),
        remote_config(tmp_path / "b", remote, destinations, node="node-b"),
    )


def after_a_bigint_column(spark: Any, node: Any, events: list[dict[str, Any]]) -> None:
    """A first pass makes t.n a bigint; then `events` wait on the store for the next one."""
    put_remote(node, [event("0", n=0)])
    assert run(spark, node).ok
    put_remote(node, events)


def claims_left(loaded: Any) -> list[str]:
    fs, root = remote_filesystem(loaded.config.log.remote)
    fs.invalidate_cache()
    return fs.find(f"{root}/claims")


def pending(root: Path) -> list[Path]:
    folder = root / "events" / "failed" / "pending"
    return list(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize(
    ("column", "point", "b_copy"),
    [
        # A new column: rows staged, A dies before its commit; B loads them and spools the misfit again.
        (True, "staged", True),
        # A new column: A patches and commits the task's rows (a split marker, `batch.commits`),
        # then dies before its statuses; B's pass spools the misfit again for the unsettled pair
        # (the split is done): B's copy.
        (True, "committed", True),
        # Rows that fit: executors write splits directly (split markers); A dies before its
        # statuses; B's pass spools the misfit again for the unsettled pair: B's copy.
        (False, "committed", True),
    ],
)
def test_a_node_back_after_another_loaded_its_log_appends_no_failed_event_twice(
    spark: Any,
    tmp_path: Path,
    remote: dict[str, Any],
    pg_datasource: dict[str, Any],
    column: bool,
    point: str,
    b_copy: bool,
) -> None:
    a, b = nodes(tmp_path, remote, pg_datasource)
    put_remote(a, [event("0", n=0)])
    assert run(spark, a).ok  # t.n is a bigint now
    extra = {"added": "x"} if column else {}
    name = put_remote(a, [event("1", n=1, **extra), event("2", n="not a number"), event("3", n=3)])
    with pytest.raises(SystemExit):  # node A parks the misfit, then dies
        run(spark, a, fault=crash_at(point))
    assert pending(tmp_path / "a") and name in incoming_names(a)

    assert run(spark, b).ok  # node B's pass, while A is down
    assert run(spark, a).ok  # A is back: its recovery runs first

    rows = pg_rows(pg_datasource["schema"], "SELECT eventn_ctx_event_id FROM t ORDER BY 1")
    assert rows == [("0",), ("1",), ("3",)]
    misfits = failed_lines(tmp_path / "a", "pg") + failed_lines(tmp_path / "b", "pg")
    assert [m["event_id"] for m in misfits] == ["2"]
    assert (failed_lines(tmp_path / "b", "pg") != []) == b_copy
    assert not pending(tmp_path / "a") and not pending(tmp_path / "b")
    assert incoming_names(a) == [] and claims_left(a) == []


def test_a_claim_is_released_when_its_group_is_appended(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    a, _b = nodes(tmp_path, remote, pg_datasource)
    after_a_bigint_column(spark, a, [event("1", n=1), event("2", n="not a number")])

    assert run(spark, a).ok

    assert [m["event_id"] for m in failed_lines(tmp_path / "a", "pg")] == ["2"]
    assert claims_left(a) == [] and not pending(tmp_path / "a")


def test_a_node_back_under_another_name_still_appends_its_committed_pairs_failed_events(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    # A pod restarted with a new host name keeps its disk: its claims are found by their groups.
    # A primary key: the pair is committed whole with its log's marker (no split markers, so B's
    # pass finds the pair settled and does not read the log again).
    keyed = {"primary_key_fields": ["eventn_ctx_event_id"]}
    a, b = nodes(tmp_path, remote, pg_datasource, **keyed)
    after_a_bigint_column(spark, a, [event("1", n=1, added="x"), event("2", n="not a number")])
    with pytest.raises(SystemExit):  # committed, then died: only A's parked copy knows the misfit
        run(spark, a, fault=crash_at("committed"))
    assert run(spark, b).ok
    destinations = {"pg": postgres_destination(pg_datasource, "t", **keyed)}
    renamed = remote_config(tmp_path / "a", remote, destinations, node="node-a2")

    assert run(spark, renamed).ok

    assert [m["event_id"] for m in failed_lines(tmp_path / "a", "pg")] == ["2"]
    assert failed_lines(tmp_path / "b", "pg") == [] and claims_left(a) == []


def test_a_rerun_without_failures_supersedes_the_claims_of_a_pass_cut_short(
    spark: Any, tmp_path: Path, remote: dict[str, Any], pg_datasource: dict[str, Any]
) -> None:
    # A's pass parks a misfit and dies before its commit; the column is widened meanwhile (by hand,
    # as another config's pass may), so B loads every event and has no failure to park: its
    # outcome still supersedes A's claim, or A, back, would append an event that is in the table.
    a, b = nodes(tmp_path, remote, pg_datasource)
    after_a_bigint_column(spark, a, [event("1", n=1, added="x"), event("2", n="not a number")])
    with pytest.raises(SystemExit):
        run(spark, a, fault=crash_at("staged"))
    schema = pg_datasource["schema"]
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{schema}"."t" ALTER COLUMN n TYPE text')

    assert run(spark, b).ok  # every event fits now: no failure, nothing parked, A's claim superseded
    assert run(spark, a).ok

    rows = pg_rows(schema, "SELECT eventn_ctx_event_id FROM t ORDER BY 1")
    assert rows == [("0",), ("1",), ("2",)]
    assert failed_lines(tmp_path / "a", "pg") == [] and failed_lines(tmp_path / "b", "pg") == []
    assert claims_left(a) == [] and not pending(tmp_path / "a")
