import pickle

import orjson

from eventspark.destinations.duckdb.configuration import DuckDBDestination
from eventspark.steps.chain import DestinationChain, Failure, HeaderBuilder, Row
from eventspark.steps.lookup import UserAgentParser
from eventspark.steps.typing import DataType
from tests.shared_data import eventnative_data

TESTDATA = eventnative_data()


def chain_for(layout: dict, enrichment: list | None = None) -> DestinationChain:
    config = DuckDBDestination.model_validate({"type": "duckdb", "data_layout": layout, "enrichment": enrichment or []})
    return DestinationChain.build("d", config, None, None)


def fixture_events() -> list[dict]:
    text = (TESTDATA / "fact_input_with_error_lines_1.0.log").read_bytes()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def test_fixture_log_tables_skips_and_failures() -> None:
    chain = chain_for(
        {
            "table_name_template": '{{if ne .event_type "skipped"}}'
            '{{.event_type}}_{{._timestamp.Format "2006_01"}}{{end}}'
        }
    )
    results = [chain.process(e) for e in fixture_events()]
    tables = [r.table if isinstance(r, Row) else r for r in results]
    assert tables[0] == "user_2020_08"
    assert tables[1] == "notification_2020_08"
    assert isinstance(tables[3], Failure) and "_timestamp" in tables[3].error  # no _timestamp to format
    assert tables[4] == "null_2020_08"  # a missing key renders as null, like EventNative
    assert tables[6] == "user_2020_07"
    assert tables[7] is None  # the template rendered empty: skipped


def test_header_promotes_types_across_rows() -> None:
    chain = chain_for({"table_name_template": "events"})
    headers = HeaderBuilder()
    for event in fixture_events():
        result = chain.process(event)
        assert isinstance(result, Row)
        headers.add(result)
    fields = headers.headers["events"].fields
    # key1 is an object (key1_key2), a string "10", and numbers 9999999.0 and 120.0
    assert fields["key1"].type is DataType.STRING
    assert fields["key1_key2"].type is DataType.STRING
    assert fields["key10_sib1_1"].type is DataType.STRING  # "k" and 50.0
    assert fields["_geo_data_zip"].type is DataType.INT64
    assert fields["_geo_data_latitude"].type is DataType.FLOAT64
    assert fields["_timestamp"].type is DataType.TIMESTAMP
    assert fields["key5"].type is DataType.STRING  # arrays are JSON strings


def test_mapping_and_lookup_run_in_order() -> None:
    chain = chain_for(
        {
            "table_name_template": "{{.event_type}}",
            "mappings": {
                "keep_unmapped": True,
                "fields": [
                    {"src": "/secret", "action": "remove"},
                    {"src": "/ua", "dst": "/agent/raw", "action": "move"},
                    {"src": "/amount", "action": "cast", "type": "numeric(12,2)"},
                ],
            },
        },
    )
    chain.lookup = type(chain.lookup)([("user_agent_parse", "/ua", "/parsed")], None, UserAgentParser())
    event = {
        "event_type": "Buy",
        "secret": "x",
        "amount": 3,
        "src": "api",
        "ua": "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
    }
    result = chain.process(event)
    assert isinstance(result, Row)
    assert result.table == "buy"
    assert "secret" not in result.values
    assert result.values["agent_raw"].startswith("Mozilla")
    assert result.values["parsed_ua_family"] == "Firefox"
    assert result.casts["amount"] == "numeric(12,2)"
    headers = HeaderBuilder()
    headers.add(result)
    assert headers.headers["buy"].fields["amount"].sql_type == "numeric(12,2)"


def test_header_builders_merge_like_one() -> None:
    chain = chain_for({"table_name_template": "t"})
    rows = [chain.process(e) for e in fixture_events()]
    one, left, right = HeaderBuilder(), HeaderBuilder(), HeaderBuilder()
    for i, row in enumerate(rows):
        assert isinstance(row, Row)
        one.add(row)
        (left if i % 2 else right).add(row)
    left.merge(right)
    assert left.headers["t"].to_dict() == one.headers["t"].to_dict()


def test_chain_pickles_for_spark_executors() -> None:
    chain = chain_for(
        {"table_name_template": "{{.event_type}}", "mappings": {"fields": [{"src": "/a", "action": "remove"}]}}
    )
    copy = pickle.loads(pickle.dumps(chain))
    assert copy.process({"event_type": "x", "a": 1, "b": 2}) == chain.process({"event_type": "x", "a": 1, "b": 2})
