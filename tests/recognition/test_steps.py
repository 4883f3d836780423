"""The pure part of users recognition: node paths → columns, reading rows, bounded sightings."""

from __future__ import annotations

from eventspark.config.base import UsersRecognition
from eventspark.steps.mapping import Mapper
from eventspark.steps.recognition import (
    MAX_ID_LENGTH,
    RecognitionColumns,
    Sighting,
    Sightings,
    missing_user_columns,
    split_entry,
)


def default_columns(mapper: Mapper | None = None) -> RecognitionColumns:
    section = UsersRecognition(enabled=True)
    return RecognitionColumns.build(section.anonymous_id_node, section.nodes(), mapper or Mapper.build())


def test_eventnative_defaults_cover_both_sdk_formats() -> None:
    columns = default_columns()
    assert columns.anonymous[:2] == ("eventn_ctx_user_anonymous_id", "user_anonymous_id")
    assert columns.identification[0] == ("eventn_ctx_user_id", "user_id")
    assert columns.identification[1] == ("eventn_ctx_user_email", "user_email")
    # JS SDK 2.x (flat) and 1.x (nested eventn_ctx) rows
    assert columns.read({"user_anonymous_id": "a1", "user_id": "u1"}) == Sighting(
        "a1", ("u1", None, None), "user_anonymous_id"
    )
    assert columns.read({"eventn_ctx_user_anonymous_id": "a1"}) == Sighting("a1", None, "eventn_ctx_user_anonymous_id")
    assert columns.read({"user_id": "u1"}) is None  # no anonymous id: nothing to connect


def test_the_older_single_user_id_node_and_numbers() -> None:
    section = UsersRecognition(enabled=True, anonymous_id_node="/anon", user_id_node="/uid")
    assert section.nodes() == ["/uid"]
    columns = RecognitionColumns.build(section.anonymous_id_node, section.nodes(), Mapper.build())
    assert columns.read({"anon": 17, "uid": 42}) == Sighting("17", ("42",), "anon")
    assert columns.read({"anon": "", "uid": 42}) is None
    assert columns.read({"anon": "x" * (MAX_ID_LENGTH + 1)}) is None


def test_a_mapping_that_moves_or_drops_the_ids_moves_the_columns() -> None:
    moved = Mapper.build(True, [{"src": "/user/id", "dst": "/customer", "action": "move"}])
    columns = default_columns(moved)
    assert columns.identification[0] == ("eventn_ctx_user_id", "customer")
    assert columns.read({"user_anonymous_id": "a", "customer": "c"}) == Sighting(
        "a", ("c", None, None), "user_anonymous_id"
    )
    only_n = Mapper.build(False, [{"src": "/n", "dst": "/n", "action": "move"}])
    assert not default_columns(only_n).usable


def test_table_columns_pick_what_the_table_has() -> None:
    columns = default_columns()
    table = {"user_anonymous_id": "text", "user_email": "text", "n": "bigint"}
    assert columns.table_columns(table) == ("user_anonymous_id", [(1, "user_email")])
    assert columns.table_columns({"user_anonymous_id": "text"}) is None
    assert columns.table_columns({"user_id": "text"}) is None


def test_a_table_with_rows_of_both_sdks_pairs_the_columns_by_position() -> None:
    columns = default_columns()
    table = dict.fromkeys(["eventn_ctx_user_anonymous_id", "user_anonymous_id", "eventn_ctx_user_id"], "text")
    assert columns.table_columns(table, "eventn_ctx_user_anonymous_id") == (
        "eventn_ctx_user_anonymous_id",
        [(0, "eventn_ctx_user_id")],
    )
    assert columns.table_columns(table, "user_anonymous_id") is None  # its user_id is not there yet
    assert missing_user_columns(columns, table, {0, 1}, "user_anonymous_id") == ["user_id", "user_email"]
    assert missing_user_columns(columns, table, {0}, "eventn_ctx_user_anonymous_id") == []
    seen = Sightings()
    seen.add("t", columns.read({"user_anonymous_id": "a"}))  # type: ignore[arg-type]
    seen.add("t", columns.read({"eventn_ctx_user_anonymous_id": "b"}))  # type: ignore[arg-type]
    assert {split_entry(e): ids for e, ids in seen.anonymous.items()} == {
        ("t", "user_anonymous_id"): {"a"},
        ("t", "eventn_ctx_user_anonymous_id"): {"b"},
    }


def test_sightings_are_bounded_and_survive_json() -> None:
    seen = Sightings(limit=3)
    seen.add("a", Sighting("x", None))
    seen.add("a", Sighting("x", None))  # known: free
    seen.add("b", Sighting("x", None))
    seen.add("a", Sighting("y", ("u", None)))
    seen.add("a", Sighting("z", None))  # past the bound
    assert seen.anonymous == {"a": {"x"}, "b": {"x"}} and seen.identified == {"y": ("u", None)}
    assert seen.dropped == 1
    back = Sightings.from_dict(seen.to_dict())
    assert back.anonymous == seen.anonymous and back.identified == seen.identified and back.dropped == 1
    total = Sightings()
    total.merge(back)
    total.merge(back)
    assert total.dropped == 2 and total.identified == {"y": ("u", None)}
