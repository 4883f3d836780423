import copy
from datetime import UTC, date, datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from eventspark.steps.mapping import Mapper, MappingError

REFERENCE_RULES = [
    {"src": "/key1/key3", "dst": "/key4", "action": "move", "type": "varchar(256)"},
    {"src": "/secret", "action": "remove"},
    {"src": "/amount", "action": "cast", "type": "numeric(12,2)"},
    {"dst": "/app", "action": "constant", "value": "shop"},
]


def js_event() -> dict:
    return {
        "_timestamp": "2020-06-16T23:00:00.000000Z",
        "eventn_ctx": {"utc_time": "2020-08-07T14:43:14.333Z", "event_id": "e1"},
        "key1": {"key3": "moved", "other": 1},
        "secret": "s3cr3t",
        "amount": 12.5,
    }


def test_reference_rules_keep_unmapped() -> None:
    event = js_event()
    mapped, casts = Mapper.build(True, REFERENCE_RULES).apply(event)
    assert mapped == {
        "_timestamp": "2020-06-16T23:00:00.000000Z",
        "eventn_ctx": {"utc_time": "2020-08-07T14:43:14.333Z", "event_id": "e1"},
        "key1": {"other": 1},
        "amount": 12.5,
        "key4": "moved",
        "app": "shop",
    }
    assert casts == {
        "_timestamp": "TIMESTAMP",
        "eventn_ctx_utc_time": "TIMESTAMP",
        "key4": "varchar(256)",
        "amount": "numeric(12,2)",
    }
    assert event == js_event()  # the input is untouched


def test_keep_unmapped_false_keeps_only_mapped_fields() -> None:
    mapped, _ = Mapper.build(False, REFERENCE_RULES).apply(js_event())
    assert mapped == {"key4": "moved", "amount": 12.5, "app": "shop"}


def test_one_src_moves_to_several_dsts() -> None:
    rules = [
        {"src": "/user/id", "dst": "/uid", "action": "move"},
        {"src": "/user/id", "dst": "/copy/of/uid", "action": "move"},
    ]
    mapped, _ = Mapper.build(True, rules).apply({"user": {"id": 7, "name": "n"}})
    assert mapped == {"user": {"name": "n"}, "uid": 7, "copy": {"of": {"uid": 7}}}


def test_move_of_a_missing_src_does_nothing() -> None:
    rules = [{"src": "/nope", "dst": "/x", "action": "move"}]
    assert Mapper.build(True, rules).apply({"a": 1})[0] == {"a": 1}


def test_set_never_replaces_a_scalar_parent() -> None:
    rules = [{"dst": "/a/b", "action": "constant", "value": 1}]
    assert Mapper.build(True, rules).apply({"a": "text"})[0] == {"a": "text"}


def test_remove_inside_a_moved_subtree_leaves_the_input_alone() -> None:
    rules = [
        {"src": "/user", "dst": "/person", "action": "move"},
        {"src": "/person/email", "action": "remove"},
    ]
    event = {"user": {"email": "a@b.c", "name": "n"}}
    mapped, _ = Mapper.build(False, rules).apply(event)
    assert mapped == {"person": {"name": "n"}}
    assert event == {"user": {"email": "a@b.c", "name": "n"}}


def test_constant_objects_are_not_changed_by_later_rules() -> None:
    rules = [
        {"dst": "/meta", "action": "constant", "value": {"app": "shop"}},
        {"dst": "/meta/version", "action": "constant", "value": 2},
    ]
    mapper = Mapper.build(True, rules)
    assert mapper.apply({})[0] == {"meta": {"app": "shop", "version": 2}}
    assert mapper.apply({})[0] == {"meta": {"app": "shop", "version": 2}}
    assert mapper.rules[0].value == {"app": "shop"}


def test_yaml_dates_become_json_strings() -> None:
    rules = [
        {"dst": "/at", "action": "constant", "value": datetime(2021, 1, 2, 3, 4, 5)},
        {"dst": "/day", "action": "constant", "value": date(2021, 1, 2)},
        {"dst": "/aware", "action": "constant", "value": datetime(2021, 1, 2, tzinfo=UTC)},
    ]
    mapped, _ = Mapper.build(True, rules).apply({})
    assert mapped == {
        "at": "2021-01-02T03:04:05.000000Z",
        "day": "2021-01-02",
        "aware": "2021-01-02T00:00:00.000000Z",
    }


def test_constants_keep_json_numbers_of_any_size() -> None:
    rules = [{"dst": "/big", "action": "constant", "value": [2**70, {1: -(2**64)}]}]
    assert Mapper.build(True, rules).apply({})[0] == {"big": [2**70, {"1": -(2**64)}]}


def test_casts_are_keyed_by_flattened_sanitised_names() -> None:
    rules = [
        {"src": "/User Info/Age", "action": "cast", "type": "integer"},
        {"src": "/a", "dst": "/Deep/Er", "action": "move", "type": "LowCardinality(String)"},
    ]
    _, casts = Mapper.build(True, rules).apply({"src": "api"})
    assert casts == {
        "_timestamp": "TIMESTAMP",
        "user_info_age": "integer",
        "deep_er": "LowCardinality(String)",
    }


def test_implicit_casts_depend_on_the_source_and_yield_to_configured_ones() -> None:
    empty = Mapper.build()
    assert empty.apply({"src": "api"})[1] == {"_timestamp": "TIMESTAMP"}
    assert empty.apply({"src": "jitsu"})[1] == {"_timestamp": "TIMESTAMP", "eventn_ctx_utc_time": "TIMESTAMP"}
    configured = Mapper.build(True, [{"src": "/eventn_ctx/utc_time", "action": "cast", "type": "text"}])
    assert configured.apply({})[1]["eventn_ctx_utc_time"] == "text"


def test_empty_mapper_returns_the_event_itself() -> None:
    event = {"a": 1}
    mapped, _ = Mapper.build(True, []).apply(event)
    assert mapped is event


def test_action_is_case_insensitive() -> None:
    mapped, _ = Mapper.build(True, [{"src": "/a", "action": "REMOVE"}]).apply({"a": 1, "b": 2})
    assert mapped == {"b": 2}


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"src": "/a", "action": "move"}, "move needs dst"),
        ({"dst": "/a", "action": "move"}, "move needs src"),
        ({"src": "/a", "action": "cast"}, "cast needs a type"),
        ({"action": "cast", "type": "text"}, "cast needs src"),
        ({"value": 1, "action": "constant"}, "constant needs dst"),
        ({"dst": "/a", "action": "constant"}, "constant needs a value"),
        ({"action": "remove"}, "remove needs src"),
        ({"src": "/a", "action": "rename"}, "action must be one of"),
        ({"src": "/a"}, "action must be one of"),
        ({"src": "/", "action": "remove"}, "names the whole event"),
        ({"src": "/a//b", "action": "remove"}, "empty key"),
        ({"src": 5, "action": "remove"}, "must be a path"),
        ({"src": "/a", "action": "remove", "scr": "/b"}, "unknown key"),
        ({"src": "/a", "action": "cast", "type": "text; DROP TABLE users"}, "does not look like an SQL type"),
        ({"src": "/a", "action": "cast", "type": "text -- comment"}, "does not look like an SQL type"),
        ({"src": "/a", "action": "cast", "type": 'text"'}, "does not look like an SQL type"),
        ({"src": "/a", "action": "cast", "type": "numeric(12,2"}, "does not look like an SQL type"),
        ({"src": "/a", "action": "cast", "type": "  "}, "type must be"),
        ({"dst": "/a", "action": "constant", "value": object()}, "not JSON data"),
        ({"dst": "/a", "action": "constant", "value": [float("nan")]}, "not a JSON number"),
        ("remove /a", "must be an object"),
    ],
)
def test_validation_errors_name_the_rule(rule: object, problem: str) -> None:
    rules = [{"src": "/ok", "action": "remove"}, rule]
    with pytest.raises(MappingError, match=r"mappings\.fields\[1\]: .*" + problem):
        Mapper.build(True, rules)


def test_unbalanced_type_hints_at_yaml_flow_mappings() -> None:
    # YAML reads {src: /amount, action: cast, type: numeric(12,2)} as type "numeric(12" and a key "2)"
    rules = [{"src": "/amount", "action": "cast", "type": "numeric(12"}]
    with pytest.raises(MappingError, match="quote it"):
        Mapper.build(True, rules)


def test_mapping_error_is_a_value_error_and_checks_the_section() -> None:
    assert issubclass(MappingError, ValueError)
    with pytest.raises(MappingError, match="keep_unmapped"):
        Mapper.build("yes", [])  # type: ignore[arg-type]
    with pytest.raises(MappingError, match="list of rules"):
        Mapper.build(True, "src: /a")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sql_type",
    [
        "LowCardinality(String)",
        "numeric(12,2)",
        "DateTime64(3, 'UTC')",
        "Enum8('a' = 1, 'b' = -2)",
        "timestamp with time zone",
        "character varying(256)",
        "Nullable(Float64)",
    ],
)
def test_real_sql_types_are_accepted(sql_type: str) -> None:
    mapper = Mapper.build(True, [{"src": "/a", "action": "cast", "type": sql_type}])
    assert mapper.apply({})[1]["a"] == sql_type


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=12,
)
paths = st.lists(st.sampled_from("abc"), min_size=1, max_size=3).map(lambda keys: "/" + "/".join(keys))
rules = st.one_of(
    st.fixed_dictionaries({"action": st.just("move"), "src": paths, "dst": paths}),
    st.fixed_dictionaries({"action": st.just("remove"), "src": paths}),
    st.fixed_dictionaries({"action": st.just("cast"), "src": paths, "type": st.just("text")}),
    st.fixed_dictionaries({"action": st.just("constant"), "dst": paths, "value": json_values}),
)


@given(
    st.dictionaries(st.sampled_from("abc"), json_values, max_size=3),
    st.booleans(),
    st.lists(rules, max_size=6),
)
def test_apply_never_changes_its_input(event: dict, keep_unmapped: bool, rule_list: list[dict]) -> None:
    before = copy.deepcopy(event)
    mapper = Mapper.build(keep_unmapped, rule_list)
    first, _ = mapper.apply(event)
    assert event == before
    assert mapper.apply(event)[0] == first  # and a rerun gives the same result


SHARED_VALUE_RULES = [  # /a's object ends up at /b and /c: removing inside /b must not change /c
    {"action": "move", "src": "/a", "dst": "/b"},
    {"action": "move", "src": "/a", "dst": "/c"},
    {"action": "remove", "src": "/b/x"},
]


@given(
    st.dictionaries(st.sampled_from("abc"), json_values, max_size=3),
    st.booleans(),
    st.lists(rules, max_size=6),
)
@example({"a": {"x": 1, "y": 2}}, True, SHARED_VALUE_RULES)
@example({}, True, [{"action": "constant", "dst": "/a", "value": {"b": 1}}, {"action": "remove", "src": "/a/b"}])
def test_in_place_gives_what_copy_on_write_gives(event: dict, keep_unmapped: bool, rule_list: list[dict]) -> None:
    mapper = Mapper.build(keep_unmapped, rule_list)
    expected, casts = mapper.apply(event)
    expected = copy.deepcopy(expected)  # it shares subtrees with the event copy below
    mapped, in_place_casts = mapper.apply(copy.deepcopy(event), in_place=True)
    assert repr(mapped) == repr(expected)  # repr: key order too, which becomes column order
    assert in_place_casts == casts
    assert mapper.rules == Mapper.build(keep_unmapped, rule_list).rules  # constants unchanged


BENCH_RULES = [
    {"src": "/event_data/consent", "action": "remove"},
    {"src": "/event_data/product/price", "action": "cast", "type": "double"},
    {"src": "/eventn_ctx/user/anonymous_id", "dst": "/anonymous_id", "action": "move"},
]


@pytest.mark.parametrize("keep_unmapped", [True, False])
@pytest.mark.parametrize(
    ("rule_list", "in_place"),
    [
        (BENCH_RULES, True),
        (REFERENCE_RULES, True),
        ([{"src": "/a", "action": "remove"}, {"src": "/a", "dst": "/b", "action": "move"}], False),
        ([{"src": "/a", "dst": "/b", "action": "move"}, {"src": "/a", "action": "remove"}], True),
        ([{"src": "/a", "dst": "/b", "action": "move"}, {"src": "/b/c", "action": "remove"}], False),
        ([{"src": "/a", "dst": "/b", "action": "move"}, {"src": "/a/c", "action": "remove"}], False),
        ([{"dst": "/m", "action": "constant", "value": {}}, {"dst": "/m/v", "action": "constant", "value": 1}], False),
    ],
)
def test_rules_run_in_place_unless_they_overlap(rule_list: list[dict], in_place: bool, keep_unmapped: bool) -> None:
    event = {"a": {"c": 1}, "b": {"c": 2}, "event_data": {"consent": {"ads": True}}}
    mapped, _ = Mapper.build(keep_unmapped, rule_list).apply(event, in_place=True)
    assert (mapped is event) is (in_place and keep_unmapped)
    untouched = {"a": {"c": 1}, "b": {"c": 2}, "event_data": {"consent": {"ads": True}}}
    assert (event == untouched) is (not in_place or not keep_unmapped)
