"""table_name_template: the Go text/template subset, clean-up into table names, errors and bounds."""

from __future__ import annotations

import pickle
import unicodedata
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspark.steps.template import (
    MAX_OUTPUT_CHARS,
    MAX_SOURCE_CHARS,
    TableNameTemplate,
    TemplateEvalError,
    TemplateSyntaxError,
    clean_table_name,
    compile_template,
)
from tests.shared_data import eventnative_data

FIXTURE = eventnative_data() / "fact_input_with_error_lines_1.0.log"
COMMON = '{{.event_type}}_{{._timestamp.Format "2006_01"}}'

EVENT: dict[str, Any] = {
    "event_type": "Page View",
    "_timestamp": "2020-08-02T18:23:56.291383Z",
    "n": 5,
    "f": 2.5,
    "flag": True,
    "nothing": None,
    "empty": "",
    "list": ["a", "b", 3],
    "eventn_ctx": {"user": {"id": "u1", "tags": ["x"]}, "event_id": "e-1"},
    "имя": "значение",
    "my-key": "dashed",
}


def raw(source: str, event: dict[str, Any] | None = None) -> str:
    return compile_template(source).render_raw(EVENT if event is None else event)


def name(source: str, event: dict[str, Any] | None = None) -> str:
    return compile_template(source).render(EVENT if event is None else event)


# -- fields ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{.event_type}}", "Page View"),
        ("{{.eventn_ctx.user.id}}", "u1"),
        ("{{$.eventn_ctx.event_id}}", "e-1"),
        ("{{.n}}/{{.f}}/{{.flag}}", "5/2.5/true"),
        ("{{.list}}", "[a b 3]"),
        ("{{.eventn_ctx.user}}", "map[id:u1 tags:[x]]"),
        ("{{.имя}}", "значение"),
        ('{{index . "my-key"}}', "dashed"),
        ('{{(index . "eventn_ctx").user.id}}', "u1"),
    ],
)
def test_fields_print_like_go(source: str, expected: str) -> None:
    assert raw(source) == expected


@pytest.mark.parametrize(
    "source",
    ["{{.missing}}", "{{.nothing}}", "{{.missing.deeper.still}}", "{{.nothing.x}}", "{{.__class__}}"],
)
def test_missing_keys_and_nulls_render_null(source: str) -> None:
    assert raw(source) == "null"


def test_dot_and_dollar_are_the_event() -> None:
    event = {"b": 1, "a": "x"}
    assert raw("{{.}}", event) == raw("{{$}}", event) == "map[a:x b:1]"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{.event_type.x}}", "can't evaluate field x in type string"),
        ("{{.list.x}}", "can't evaluate field x in type []interface {}"),
        ("{{.n.x}}", "can't evaluate field x in type int"),
    ],
)
def test_field_on_a_non_object_is_an_error_naming_the_action(source: str, message: str) -> None:
    with pytest.raises(TemplateEvalError) as caught:
        raw(source)
    assert message in str(caught.value)
    assert f"<{source[2:-2]}>" in str(caught.value)


def test_python_attributes_are_never_reached() -> None:
    for source in ("{{.__class__.__name__}}", "{{.event_type.__class__}}", "{{.list.__len__}}"):
        try:
            assert raw(source) == "null"
        except TemplateEvalError as exc:
            assert "can't evaluate field" in str(exc)


# -- text, trimming, comments ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("a  {{- .n}}", "a5"),
        ("{{.n -}}  \n b", "5b"),
        ("a \n{{- .n -}}\t b", "a5b"),
        ("x{{/* a comment */}}y", "xy"),
        ("x {{- /* trimmed */ -}} y", "xy"),
        ("{{-3}}", "-3"),
        ('{{`raw \\n`}}{{"\\t"}}', "raw \\n\t"),
        ("{{'a'}}", "97"),
        ("{{0x1F}} {{017}} {{1_000}} {{1.5e3}}", "31 15 1000 1500"),
    ],
)
def test_text_trim_markers_comments_and_literals(source: str, expected: str) -> None:
    assert raw(source) == expected


def test_template_without_actions_is_a_constant() -> None:
    template = compile_template("  My Events ")
    assert template.constant_name == "my_events"
    assert template.render({}) == "my_events"
    assert compile_template("{{.a}}").constant_name is None
    assert compile_template('{{"lit"}}eral').constant_name == "literal"


# -- if / else ---------------------------------------------------------------------------------

FALSY = [False, 0, 0.0, "", [], {}, None]
TRUTHY = [True, 1, -1, 0.5, "x", "0", [0], {"a": None}]


@pytest.mark.parametrize("value", FALSY)
def test_go_falsy_values(value: Any) -> None:
    assert raw("{{if .v}}yes{{else}}no{{end}}", {"v": value}) == "no"


@pytest.mark.parametrize("value", TRUTHY)
def test_go_truthy_values(value: Any) -> None:
    assert raw("{{if .v}}yes{{else}}no{{end}}", {"v": value}) == "yes"


def test_missing_key_is_false() -> None:
    assert raw("{{if .v}}yes{{else}}no{{end}}", {}) == "no"


@pytest.mark.parametrize(("kind", "expected"), [("a", "first"), ("b", "second"), ("c", "third"), ("z", "other")])
def test_else_if_chain(kind: str, expected: str) -> None:
    source = '{{if eq .k "a"}}first{{else if eq .k "b"}}second{{else if eq .k "c"}}third{{else}}other{{end}}'
    assert raw(source, {"k": kind}) == expected


def test_nested_if_without_else_renders_nothing() -> None:
    source = "<{{if .a}}{{if .b}}both{{end}}{{end}}>"
    assert raw(source, {"a": 1, "b": 1}) == "<both>"
    assert raw(source, {"a": 1}) == "<>"
    assert raw(source, {}) == "<>"


# -- functions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('{{eq .k "a"}}', "true"),
        ('{{eq .k "x" "y" "a"}}', "true"),
        ('{{eq .k "x" "y"}}', "false"),
        ('{{ne .k "a"}}', "false"),
        ("{{eq .n 5}} {{eq .n 5.0}} {{eq .f 2.5}}", "true true true"),
        ("{{lt .n 6}} {{le .n 5}} {{gt .n 5}} {{ge .n 5.0}} {{lt .f 3}}", "true true false true true"),
        ('{{lt "abc" "abd"}} {{gt "b" "a"}}', "true true"),
        ("{{eq .missing nil}} {{eq .nothing nil}} {{eq .k nil}} {{ne .n nil}}", "true true false true"),
        ('{{eq .missing "a"}}', "false"),
        ("{{not .k}} {{not .missing}} {{not 0}}", "false true true"),
    ],
)
def test_comparisons(source: str, expected: str) -> None:
    event = {"k": "a", "n": 5, "f": 2.5, "nothing": None}
    assert raw(source, event) == expected


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('{{eq .n "5"}}', "incompatible types for comparison"),
        ("{{eq .flag 1}}", "incompatible types for comparison"),
        ('{{lt .n "a"}}', "incompatible types for comparison"),
        ("{{lt .flag true}}", "invalid type for comparison"),
        ("{{lt .missing 1}}", "invalid type for comparison"),
        ("{{eq .list .list}}", "non-comparable type"),
    ],
)
def test_comparing_incompatible_types_is_an_error(source: str, message: str) -> None:
    with pytest.raises(TemplateEvalError, match=message):
        raw(source)


def test_eq_stops_at_the_first_match_like_go() -> None:
    assert raw('{{eq .n 5 "not compared"}}') == "true"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{and .a .b}}", "B"),
        ("{{and .a .zero .b}}", "0"),
        ("{{or .zero .empty .a}}", "A"),
        ("{{or .zero .empty}}", ""),
        ("{{and .missing .a}}", "null"),
        ("{{if and .a (not .zero)}}y{{end}}", "y"),
    ],
)
def test_and_or_return_the_deciding_argument(source: str, expected: str) -> None:
    event = {"a": "A", "b": "B", "zero": 0, "empty": ""}
    assert raw(source, event) == expected


def test_and_or_short_circuit() -> None:
    event = {"list": [1]}
    assert raw("{{and false (index .list 5)}}", event) == "false"
    assert raw("{{or true (index .list 5)}}", event) == "true"
    with pytest.raises(TemplateEvalError, match="index out of range: 5"):
        raw("{{and true (index .list 5)}}", event)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('{{index . "n"}}', "5"),
        ('{{index .eventn_ctx "user" "id"}}', "u1"),
        ("{{index .list 1}}", "b"),
        ('{{index .eventn_ctx "user" "tags" 0}}', "x"),
        ('{{index . "absent"}}', "null"),
        ('{{index "hé" 1}}', "195"),
        ("{{index .list}}", "[a b 3]"),
    ],
)
def test_index(source: str, expected: str) -> None:
    assert raw(source) == expected


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{index .list 3}}", "index out of range: 3"),
        ("{{index .list -1}}", "index out of range: -1"),
        ('{{index .list "0"}}', "cannot index slice/array with type string"),
        ("{{index . 1}}", "value has type int; should be string"),
        ("{{index .missing 0}}", "index of untyped nil"),
        ("{{index .n 0}}", "can't index item of type int"),
    ],
)
def test_index_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateEvalError, match=message):
        raw(source)


@pytest.mark.parametrize(
    ("source", "expected"),
    [("{{len .list}}", "3"), ("{{len .eventn_ctx}}", "2"), ('{{len "abc"}}', "3"), ('{{len "héé"}}', "5")],
)
def test_len_counts_items_and_utf8_bytes(source: str, expected: str) -> None:
    assert raw(source) == expected


@pytest.mark.parametrize(("source", "message"), [("{{len .n}}", "len of type int"), ("{{len .x}}", "len of nil")])
def test_len_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateEvalError, match=message):
        raw(source)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('{{printf "%s_%d" .event_type .n}}', "Page View_5"),
        ('{{printf "%v|%v|%v|%v" .n .f .flag .missing}}', "5|2.5|true|<nil>"),
        ('{{printf "%.2f|%5.1f|%-4d|%04d" .f .f .n .n}}', "2.50|  2.5|5   |0005"),
        ('{{printf "%q %x %X %t %%" "a\\"b" 255 "hi" true}}', '"a\\"b" ff 6869 true %'),
        ('{{printf "%d" .event_type}}', "%!d(string=Page View)"),
        ('{{printf "%s %s" .n}}', "%!s(int=5) %!s(MISSING)"),
        ('{{print .n .f "x" .missing}}', "5 2.5x<nil>"),
        ("{{print}}", ""),
    ],
)
def test_printf_and_print(source: str, expected: str) -> None:
    assert raw(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('{{.event_type | printf "%s_x"}}', "Page View_x"),
        ('{{.n | printf "%d-%d" 1}}', "1-5"),
        ("{{.n | eq 5}}", "true"),
        ('{{(len .list) | printf "%03d"}}', "003"),
        ('{{"2006" | ._timestamp.Format}}', "2020"),
        ('{{._timestamp.Format "2006" | printf "y%s" | printf "%s!"}}', "y2020!"),
        ("{{if (eq (len .list) 3)}}three{{end}}", "three"),
    ],
)
def test_pipes_and_parentheses(source: str, expected: str) -> None:
    assert raw(source) == expected


# -- .Format ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("2006_01", "2020_08"),
        ("Jan 2, 2006 at 3:04pm (MST)", "Aug 2, 2020 at 6:23pm (UTC)"),
        ("2006-01-02T15:04:05.000Z07:00", "2020-08-02T18:23:56.291Z"),
        ("Monday 02/01/06", "Sunday 02/08/20"),
    ],
)
def test_format_on_the_timestamp_string(layout: str, expected: str) -> None:
    assert raw(f'{{{{._timestamp.Format "{layout}"}}}}') == expected


def test_format_keeps_the_offset_of_the_string() -> None:
    event = {"t": "2020-08-02T01:02:03+02:00"}
    assert raw('{{.t.Format "2006-01-02 15h -0700 MST"}}', event) == "2020-08-02 01h +0200 +0200"


def test_format_on_datetime_values() -> None:
    aware = datetime(2021, 1, 31, 23, 5, tzinfo=timezone(timedelta(hours=-8), "PST"))
    naive = datetime(2021, 1, 31, 23, 5)
    assert raw('{{.t.Format "Jan 2, 2006 at 3:04pm (MST)"}}', {"t": aware}) == "Jan 31, 2021 at 11:05pm (PST)"
    assert raw('{{.t.Format "2006-01-02T15:04Z07:00"}}', {"t": naive}) == "2021-01-31T23:05Z"
    assert raw("{{.t}}", {"t": datetime(2021, 1, 31, tzinfo=UTC)}) == "2021-01-31 00:00:00 +0000 UTC"


def test_format_with_a_layout_from_the_event() -> None:
    assert raw("{{._timestamp.Format .layout}}", dict(EVENT, layout="01/2006")) == "08/2020"
    with pytest.raises(TemplateEvalError, match="expected string; got int"):
        raw("{{._timestamp.Format .n}}")


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({}, "missing or null"),
        ({"_timestamp": None}, "missing or null"),
        ({"_timestamp": "yesterday"}, "not an RFC 3339 timestamp"),
        ({"_timestamp": "2020-08-02"}, "not an RFC 3339 timestamp"),
        ({"_timestamp": 1596392636}, "can't evaluate field Format in type int"),
        ({"_timestamp": {"Format": "x"}}, "Format is not a method but has arguments"),
    ],
)
def test_format_on_anything_else_is_an_error(event: dict[str, Any], message: str) -> None:
    with pytest.raises(TemplateEvalError, match=message):
        raw('{{._timestamp.Format "2006"}}', event)


def test_format_without_arguments_is_a_plain_key_lookup() -> None:
    assert raw("{{.t.Format}}", {"t": {"Format": "plain"}}) == "plain"


# -- fixture log -----------------------------------------------------------------------------


def fixture_events() -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in FIXTURE.read_bytes().splitlines() if line.strip()]


def test_fixture_log_with_the_common_template() -> None:
    template = compile_template(COMMON)
    events = fixture_events()
    failures = 0
    for event in events:
        if "_timestamp" not in event:
            with pytest.raises(TemplateEvalError, match="missing or null"):
                template.render(event)
            failures += 1
            continue
        stamp = event["_timestamp"]
        expected = f"{event.get('event_type', 'null')}_{stamp[:4]}_{stamp[5:7]}"
        assert template.render(event) == expected
    assert failures == 1
    assert template.render(events[0]) == "user_2020_08"


def test_fixture_log_skips_events_the_template_empties() -> None:
    template = compile_template('{{if ne .event_type "skipped"}}{{.event_type}}{{end}}')
    names = [template.render(event) for event in fixture_events()]
    skipped = [event.get("event_type") == "skipped" for event in fixture_events()]
    assert [name == "" for name in names] == skipped
    assert any(skipped)


# -- clean-up into table names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Page View  ", "page_view"),
        ("a()$[]{}@!#%&,.;:^-z", "a__________________z"),
        ("it's/a\\b`c\"d", "it_s_a_b_c_d"),
        ("tab\there\nline", "tab_here_line"),
        ("nul\x00bell\x07del\x7f", "nulbelldel"),
        ("rtl\u202eover\u200bzw", "rtloverzw"),
        ("Покупка", "покупка"),
        ("cafe\u0301", "café"),
        ("emoji😀x", "emoji_x"),
        ("   ", ""),
        ("\x00", ""),
        ("", ""),
    ],
)
def test_clean_table_name(text: str, expected: str) -> None:
    assert clean_table_name(text) == expected


def test_render_cleans_and_render_raw_does_not() -> None:
    template = compile_template("{{.event_type}}.{{.n}}")
    assert template.render_raw(EVENT) == "Page View.5"
    assert template.render(EVENT) == "page_view_5"


def test_empty_output_means_skip() -> None:
    template = compile_template("{{if .keep}}{{.event_type}}{{end}}")
    assert template.render({"event_type": "x", "keep": True}) == "x"
    assert template.render({"event_type": "x"}) == ""
    assert compile_template("{{.v}}").render({"v": "  \t "}) == ""


def _allowed(ch: str) -> bool:
    if ch.isascii():
        return ch.isdigit() or ch == "_" or "a" <= ch <= "z"
    return ch.isalpha() or ch.isdecimal()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, prefix=st.text(max_size=10))
def test_rendered_names_only_hold_safe_characters(value: Any, prefix: str) -> None:
    source = prefix.replace("{", "") + "{{.v}}"
    name = compile_template(source).render({"v": value})
    assert all(_allowed(ch) for ch in name), name
    assert name == unicodedata.normalize("NFC", name)


# -- syntax errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{.a", "unclosed action"),
        ("{{.a}}{{", "unclosed action"),
        ("{{foo .a}}", "function 'foo' not defined"),
        ("{{lower .a}}", "function 'lower' not defined"),
        ("{{slice .a 1}}", "function 'slice' is not supported"),
        ("{{end}}", "unexpected {{end}}"),
        ("{{else}}", "unexpected {{else}}"),
        ("{{if .a}}x", "unclosed {{if}}"),
        ("{{if .a}}x{{else}}y{{else}}z{{end}}", "expected {{end}} after {{else}}"),
        ("{{if}}{{end}}", "missing value for if"),
        ("{{}}", "missing value for command"),
        ("{{range .a}}{{end}}", "{{range}} is not supported"),
        ("{{with .a}}{{end}}", "{{with}} is not supported"),
        ('{{define "x"}}{{end}}', "{{define}} is not supported"),
        ('{{template "x"}}', "{{template}} is not supported"),
        ("{{$x := 1}}", "variable declarations are not supported"),
        ("{{$x}}", "undefined variable"),
        ("{{nil}}", "nil is not a command"),
        ('{{.a | "x"}}', "can't give argument to non-function"),
        ("{{.a.b 1}}", "b is not a method but has arguments"),
        ("{{.t.Format}}{{.t.Format 1 2}}", "wrong number of args for Format: want 1 got 2"),
        ("{{not 1 2}}", "wrong number of args for not: want 1 got 2"),
        ("{{eq 1}}", "wrong number of args for eq: want at least 2 got 1"),
        ("{{len}}", "wrong number of args for len: want 1 got 0"),
        ('{{printf "%*d" 1 2}}', "not supported"),
        ('{{printf "%2000d" 1}}', "over 1024"),
        ("{{(.a}}", "unclosed left paren"),
        ('{{"abc}}', "unterminated quoted string"),
        ('{{"\\q"}}', "invalid escape"),
        ("{{1x}}", "bad number syntax"),
        ("{{.a-b}}", "bad character '-'"),
        ('{{"x".y}}', "unexpected . after term"),
        ("{{/* open }}", "unclosed comment"),
        ("{{.a # }}", "unexpected '#'"),
    ],
)
def test_syntax_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateSyntaxError) as caught:
        compile_template(source)
    assert message in str(caught.value)


def test_syntax_error_names_line_and_column() -> None:
    with pytest.raises(TemplateSyntaxError) as caught:
        compile_template("events_\n{{.a}}_{{bogus .b}}")
    assert (caught.value.line, caught.value.column) == (2, 10)
    assert "line 2, column 10" in str(caught.value)


# -- bounds and hostile input -----------------------------------------------------------------


def test_huge_templates_are_rejected() -> None:
    with pytest.raises(TemplateSyntaxError, match="longer than"):
        compile_template("x" * (MAX_SOURCE_CHARS + 1))
    assert compile_template("x" * MAX_SOURCE_CHARS).render({}) == "x" * MAX_SOURCE_CHARS


def test_deep_nesting_is_rejected() -> None:
    with pytest.raises(TemplateSyntaxError, match="nesting deeper"):
        compile_template("{{if 1}}" * 40 + "{{end}}" * 40)
    with pytest.raises(TemplateSyntaxError, match="nesting deeper"):
        compile_template("{{" + "(" * 40 + "1" + ")" * 40 + "}}")
    assert raw("{{" + "(" * 20 + "1" + ")" * 20 + "}}") == "1"


def test_output_is_bounded() -> None:
    template = compile_template("{{.v}}")
    assert template.render({"v": "a" * MAX_OUTPUT_CHARS}) == "a" * MAX_OUTPUT_CHARS
    with pytest.raises(TemplateEvalError, match="longer than"):
        template.render({"v": "a" * (MAX_OUTPUT_CHARS + 1)})
    with pytest.raises(TemplateEvalError, match="over 1024"):
        raw("{{printf .f 1}}", {"f": "%99999999d"})
    with pytest.raises(TemplateEvalError, match="printf format longer than"):
        raw("{{printf .f}}", {"f": "x" * 5000})


def test_deeply_nested_values_do_not_overflow_the_stack() -> None:
    value: Any = "leaf"
    for _ in range(5000):
        value = [value]
    for source in ("{{.v}}", '{{printf "%v" .v}}', "{{print .v}}"):
        with pytest.raises(TemplateEvalError, match="nested too deeply"):
            raw(source, {"v": value})


def test_root_that_is_not_an_object() -> None:
    with pytest.raises(TemplateEvalError, match="can't evaluate field a in type"):
        compile_template("{{.a}}").render(["not", "a", "dict"])  # type: ignore[arg-type]


template_chars = st.sampled_from([*"{}.$|()\"'` -_aeifnd0123456789%", "{{", "}}", "if ", "end", "else "])


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(template_chars, max_size=30))
def test_any_source_compiles_or_fails_cleanly(pieces: list[str]) -> None:
    source = "".join(pieces)
    try:
        template = compile_template(source)
    except TemplateSyntaxError:
        return
    try:
        name = template.render(EVENT)
    except TemplateEvalError:
        return
    assert all(_allowed(ch) for ch in name)


# -- the object ------------------------------------------------------------------------------


def test_templates_pickle_as_their_source() -> None:
    template = compile_template(COMMON)
    copy = pickle.loads(pickle.dumps(template))
    assert isinstance(copy, TableNameTemplate)
    assert copy.source == COMMON
    assert copy.render(EVENT) == template.render(EVENT) == "page_view_2020_08"


def test_compiling_twice_reuses_the_compiled_template() -> None:
    assert compile_template(COMMON) is compile_template(COMMON)
    assert repr(compile_template(COMMON)) == f"TableNameTemplate({COMMON!r})"


def test_eval_error_is_a_value_error_and_names_the_action() -> None:
    with pytest.raises(ValueError, match=r"executing table_name_template at <index \.list 9>"):
        raw("ok {{index .list 9}}")
