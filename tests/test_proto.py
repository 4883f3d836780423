"""proto/pipeline.proto describes the JSON the project writes: compile it and parse the real forms."""

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from google.protobuf import json_format

from eventspark.destinations.dialect import get_dialect
from eventspark.logs.failed import event_error_line
from eventspark.logs.status import PairStatus, status_to_json
from eventspark.steps.diff import table_from_header
from eventspark.steps.flatten import flatten
from eventspark.steps.mapping import Mapper
from eventspark.steps.typing import BatchHeader, header_for
from tests.shared_data import eventnative_data

PROTO_DIR = Path(__file__).resolve().parents[1] / "proto"
TESTDATA = eventnative_data()


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    try:  # a dev dependency (pyproject.toml): missing means a broken install, not a test to skip
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as exc:
        pytest.fail(f"grpcio-tools, a dev dependency, is not installed ({exc}): pip install -e '.[dev]'")

    out = tmp_path_factory.mktemp("pb")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{well_known}", f"--python_out={out}", "pipeline.proto"]
    assert protoc.main(args) == 0
    spec = importlib.util.spec_from_file_location("eventspark_pipeline_pb2", out / "pipeline_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batch_header() -> BatchHeader:
    mapper = Mapper.build(True, [{"src": "/key2", "action": "cast", "type": "numeric(12,2)"}])
    header = BatchHeader("events")
    for name in ("fact_output_1.0.json", "fact_ua_output.json", "mobile_fact_output.json"):
        mapped, casts = mapper.apply(orjson.loads((TESTDATA / name).read_bytes()))
        header.merge(header_for("events", flatten(mapped), casts))
    return header


def test_batch_header_json_parses_and_round_trips(pb: ModuleType) -> None:
    form = batch_header().to_dict()
    assert any("sql_type" in field for field in form["fields"].values())
    message = json_format.ParseDict(form, pb.BatchHeader())
    assert json_format.MessageToDict(message, preserving_proto_field_name=True) == form
    camel = json_format.MessageToDict(message)  # what other protobuf users write
    assert BatchHeader.from_dict(camel) == batch_header()


def test_table_json_parses(pb: ModuleType) -> None:
    table = table_from_header(batch_header(), get_dialect("postgres").column_type, ["eventn_ctx_event_id"])
    message = json_format.ParseDict(table.to_dict(), pb.Table())
    assert json_format.MessageToDict(message, preserving_proto_field_name=True) == table.to_dict()


@pytest.mark.parametrize(
    "event",
    [
        {"eventn_ctx": {"event_id": "e1"}, "n": 1, "nested": {"list": [1, "a", None]}},
        "not json at all {",  # a broken incoming line is kept raw
    ],
)
def test_failed_event_lines_parse(pb: ModuleType, event: Any) -> None:
    line = event_error_line(event, "column mismatch")
    message = json_format.Parse(line, pb.EventError())
    assert message.error == "column mismatch"
    assert json_format.MessageToDict(message.event) == event


def test_eventnative_failed_file_parses(pb: ModuleType) -> None:
    lines = (TESTDATA / "fallback_fact_input.log").read_text().splitlines()
    for line in filter(None, lines):
        assert json_format.Parse(line, pb.EventError()).error.startswith("some error")


def wrap_status_file(data: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The documented mapping from a status file to the StatusFile message."""
    return {"destinations": {dest: {"tables": tables} for dest, tables in data.items()}}


def test_status_file_parses_once_wrapped(pb: ModuleType) -> None:
    status = {"pg": {"events": PairStatus(True), "users": PairStatus(False, "timeout")}, "ch": {}}
    data = status_to_json(status)
    message = json_format.ParseDict(wrap_status_file(data), pb.StatusFile())
    assert message.destinations["pg"].tables["users"].error == "timeout"
    assert message.destinations["pg"].tables["events"].uploaded
    assert set(message.destinations) == {"pg", "ch"}


@pytest.mark.parametrize(
    ("message_name", "form"),
    [
        ("BatchHeader", {"table_name": "t", "fields": {"a": {"type": "INTEGER"}}}),
        ("BatchHeader", {"table_name": "t", "fields": [{"a": "INT64"}]}),
        ("Table", {"name": "t", "columns": {"a": 5}}),
        ("EventError", {"event": {}, "error": "x", "eventid": "y"}),
        ("StatusFile", {"pg": {"events": {"uploaded": True, "error": ""}}}),  # not wrapped
        ("StatusFile", {"destinations": {"pg": {"tables": {"events": {"uploaded": "yes"}}}}}),
    ],
)
def test_wrong_forms_do_not_parse(pb: ModuleType, message_name: str, form: dict) -> None:
    with pytest.raises(json_format.ParseError):
        json_format.ParseDict(form, getattr(pb, message_name)())
