"""The Segment endpoints and EventNative's aliases through a running `eventspark serve`.

One server for the module: a batch Postgres destination keyed on the event id and a stream one,
each in a schema of its own (127.0.0.1:5432, db `test`), tables named after the event type. The
real `segment-analytics-python` client (PyPI, pinned in pyproject.toml) sends the events; the
uploader period is an hour, so batch loads come from `POST /api/v1/batch/run`.
"""

from __future__ import annotations

import base64
import gzip
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from segment.analytics.client import Client

from eventspark.collector.api.segment import ACCEPT_STEP
from tests.collector.conftest import Server, start_server
from tests.conftest import PG_DB, PG_HOST, PG_PORT, PG_USER, pg_conninfo

RUN = uuid.uuid4().hex[:10]
CLIENT_SECRET, SERVER_SECRET, ADMIN = f"seg-js-{RUN}", f"seg-s2s-{RUN}", f"seg-admin-{RUN}"
LONELY_SECRET = f"seg-lonely-{RUN}"
SCHEMAS = {"pg_batch": f"seg_b_{RUN}", "pg_stream": f"seg_s_{RUN}"}


def server_config() -> dict[str, Any]:
    def destination(dest_id: str, mode: str, **layout: Any) -> dict[str, Any]:
        datasource = {"host": PG_HOST, "port": PG_PORT, "db": PG_DB, "schema": SCHEMAS[dest_id], "username": PG_USER}
        return {
            "type": "postgres",
            "mode": mode,
            "only_tokens": ["seg"],
            "datasource": datasource,
            "data_layout": {"table_name_template": "{{.event_type}}", **layout},
        }

    return {
        "server": {"admin_token": ADMIN},
        "api_keys": [
            {"id": "seg", "client_secret": CLIENT_SECRET, "server_secret": SERVER_SECRET},
            {"id": "lonely", "client_secret": f"{LONELY_SECRET}-js", "server_secret": LONELY_SECRET},
        ],
        "log": {"uploader_period_sec": 3600, "rotation_min": 60},
        "destinations": {
            "pg_batch": destination("pg_batch", "batch", primary_key_fields=["eventn_ctx_event_id"]),
            "pg_stream": destination("pg_stream", "stream"),
        },
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("segment"), server_config())
    try:
        yield running
    finally:
        try:
            running.stop()
        except subprocess.TimeoutExpired:
            running.stop(signal.SIGKILL)
        finally:
            with psycopg.connect(pg_conninfo(), autocommit=True) as conn:
                for schema in SCHEMAS.values():
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def client(server: Server, path: str = "/api/v1/segment", **options: Any) -> tuple[Client, list[Exception]]:
    """analytics-python pointed at eventspark: `host` is the endpoint, the client adds `/v1/batch`.

    Synchronous unless `sync_mode=False` is given (then its consumer thread batches; `flush`).
    """
    errors: list[Exception] = []
    segment = Client(
        write_key=SERVER_SECRET,
        host=f"{server.url}{path}",
        sync_mode=options.pop("sync_mode", True),
        max_retries=0,
        on_error=lambda error, _batch: errors.append(error),
        **options,
    )
    return segment, errors


def batch_run(server: Server) -> dict[str, Any]:
    answer = httpx.post(
        f"{server.url}/api/v1/batch/run", params={"wait": 500}, headers={"X-Admin-Token": ADMIN}, timeout=600
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["status"] == "ok", body
    return body


def rows(dest_id: str, table: str, where: str = "TRUE") -> list[dict[str, Any]]:
    query = f'SELECT * FROM "{SCHEMAS[dest_id]}"."{table}" WHERE {where} ORDER BY _timestamp'
    with psycopg.connect(pg_conninfo(), autocommit=True) as conn, conn.cursor() as cursor:
        exists = conn.execute("SELECT to_regclass(%s)", (f'"{SCHEMAS[dest_id]}"."{table}"',)).fetchone()
        if exists is None or exists[0] is None:
            return []
        cursor.execute(query)  # type: ignore[arg-type]
        names = [column.name for column in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def wait_for(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return result


def by_id(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["eventn_ctx_event_id"]: row for row in found}


# --- the real client ------------------------------------------------------------------------------


def test_python_client_track_identify_page_land_as_eventnative_stored_them(server: Server) -> None:
    segment, errors = client(server)
    run = uuid.uuid4().hex[:8]
    segment.identify(
        f"u-{run}", {"email": "ann@example.com", "plan": "pro"}, anonymous_id=f"a-{run}", message_id=f"i-{run}"
    )
    segment.track(
        f"u-{run}", "Signed Up", {"amount": 12, "coupon": "X1"}, anonymous_id=f"a-{run}", message_id=f"t-{run}"
    )
    page_context = {
        "page": {"url": "https://shop.example/docs", "title": "Install", "referrer": "https://search.example/"},
        "timezone": "UTC",
        "screen": {"width": 1280, "height": 720},
        "userAgent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0",
    }
    segment.page(f"u-{run}", "Docs", "Install", {"section": "setup"}, context=page_context, message_id=f"p-{run}")
    assert errors == []

    loaded = batch_run(server)
    assert {(p["table"], p["rows"], p["failed"]) for p in loaded["pairs"]} >= {
        ("identify", 1, 0),
        ("track", 1, 0),
        ("page", 1, 0),
    }
    for dest_id in ("pg_batch", "pg_stream"):
        identify = wait_for(lambda d=dest_id: by_id(rows(d, "identify")).get(f"i-{run}"))
        assert identify["user_email"] == "ann@example.com" and identify["user_plan"] == "pro"
        assert identify["user_id"] == identify["user_internal_id"] == identify["ids_ajs_user_id"] == f"u-{run}"
        assert identify["user_anonymous_id"] == identify["ids_ajs_anonymous_id"] == f"a-{run}"
        assert identify["event_type"] == "identify" and identify["src"] == "segment_api"
        assert identify["library_name"] == "analytics-python" and identify["api_key"] == SERVER_SECRET
        assert len(identify["user_hashed_anonymous_id"]) == 32

        track = wait_for(lambda d=dest_id: by_id(rows(d, "track")).get(f"t-{run}"))
        assert (track["event"], track["amount"], track["coupon"]) == ("Signed Up", 12, "X1")
        assert track["timestamp"] is not None and track["source_ip"] == "127.0.0.1"
        assert not {"properties", "context_library_name", "messageid", "type", "userid"} & track.keys()

        page = wait_for(lambda d=dest_id: by_id(rows(d, "page")).get(f"p-{run}"))
        assert (page["name"], page["category"], page["section"]) == ("Install", "Docs", "setup")
        assert (page["page_title"], page["doc_url"]) == ("Install", "https://shop.example/docs")
        assert page["referer"] == "https://search.example/"
        assert (page["screen_resolution"], float(page["local_tz_offset"])) == ("1280x720", 0.0)
        # the default lookup rules ran on the event's own user agent (src is not "api")
        assert page["user_agent"].startswith("Mozilla/5.0") and page["parsed_ua_ua_family"] == "Firefox"


def test_a_retry_with_the_same_message_id_upserts_where_the_table_has_a_key(server: Server) -> None:
    segment, errors = client(server)
    message_id = f"retry-{uuid.uuid4().hex[:8]}"
    for attempt in (1, 2):  # what a client's retry after a lost answer sends again
        segment.track("u-retry", "Retried", {"attempt": attempt}, message_id=message_id)
    assert errors == []
    batch_run(server)
    keyed = [row for row in rows("pg_batch", "track") if row["eventn_ctx_event_id"] == message_id]
    assert len(keyed) == 1, keyed
    appended = wait_for(lambda: [row for row in rows("pg_stream", "track") if row["eventn_ctx_event_id"] == message_id])
    assert appended and all(row["event"] == "Retried" for row in appended)


def test_compat_endpoint_nests_the_context_under_eventn_ctx(server: Server) -> None:
    # the client's usual set-up: a consumer thread batching, gzip on
    segment, errors = client(server, "/api/v1/segment/compat", sync_mode=False, gzip=True)
    message_id = f"c-{uuid.uuid4().hex[:8]}"
    segment.track("u-compat", "Compat", {"k": "v"}, anonymous_id="a-compat", message_id=message_id)
    segment.flush()
    segment.shutdown()
    assert errors == []
    row = wait_for(lambda: by_id(rows("pg_stream", "track")).get(message_id))
    assert row["eventn_ctx_user_internal_id"] == "u-compat"
    assert row["eventn_ctx_user_anonymous_id"] == row["eventn_ctx_ids_ajs_anonymous_id"] == "a-compat"
    assert row["event"] == "Compat" and row["k"] == "v"


# --- tokens, bodies -------------------------------------------------------------------------------


def basic(secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{secret}:".encode()).decode()}


def segment_batch(*events: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"batch": [{"type": "track", "event": "e", "messageId": uuid.uuid4().hex, **e} for e in events], **extra}


@pytest.mark.parametrize(
    ("how", "kwargs"),
    [
        ("basic", {"headers": basic(SERVER_SECRET)}),
        ("writeKey", {"json": segment_batch({}, writeKey=SERVER_SECRET)}),
        ("query", {"params": {"token": SERVER_SECRET}}),
        ("header", {"headers": {"X-Auth-Token": SERVER_SECRET}}),
        ("basic-with-password", {"headers": basic(SERVER_SECRET + ":ignored")}),
    ],
)
def test_the_write_key_is_read_where_segment_clients_put_it(server: Server, how: str, kwargs: dict[str, Any]) -> None:
    server.mark()
    kwargs.setdefault("json", segment_batch({}))
    answer = httpx.post(f"{server.url}/api/v1/segment/v1/batch", timeout=10, **kwargs)
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}, (how, answer.text)
    (event,) = server.new_events()
    assert event["api_key"] == SERVER_SECRET and event["src"] == "segment_api"
    assert event["eventn_ctx_event_id"] == kwargs["json"]["batch"][0]["messageId"]


@pytest.mark.parametrize(
    ("headers", "body", "status", "message"),
    [
        (basic("wrong"), segment_batch({}), 401, "The token is not found"),
        (
            basic(CLIENT_SECRET),
            segment_batch({}),
            401,
            "The token isn't a server token. Please use s2s integration token",
        ),
        ({}, segment_batch({}, writeKey=CLIENT_SECRET), 401, "The token isn't a server token"),
        ({}, segment_batch({}), 401, "The token is not found"),
        ({"Authorization": "Basic %%%"}, segment_batch({}), 401, "The token is not found"),
        (basic(LONELY_SECRET), segment_batch({}), 422, "No destination is configured for token 'lonely'"),
        (basic(SERVER_SECRET), {"batch": [1]}, 400, "Failed to parse body"),
        (basic(SERVER_SECRET), {"batch": {"type": "track"}}, 400, "Failed to parse body"),
        (basic(SERVER_SECRET), [{"type": "track"}], 400, "Failed to parse body"),
    ],
)
def test_refusals(server: Server, headers: dict[str, str], body: Any, status: int, message: str) -> None:
    server.mark()
    answer = httpx.post(f"{server.url}/api/v1/segment", headers=headers, json=body, timeout=10)
    assert answer.status_code == status, answer.text
    assert answer.json()["message"].startswith(message)
    assert server.new_events() == []


def test_single_message_gzip_and_limits(server: Server) -> None:
    server.mark()
    url = f"{server.url}/api/v1/segment/compat"
    single = {"type": "identify", "userId": "u-single", "messageId": "single-1", "traits": {"email": "s@x.io"}}
    assert httpx.post(url, headers=basic(SERVER_SECRET), json=single, timeout=10).status_code == 200
    packed = gzip.compress(httpx.Request("POST", url, json=segment_batch({"userId": "u-gz"})).content)
    zipped = httpx.post(url, headers={**basic(SERVER_SECRET), "Content-Encoding": "gzip"}, content=packed, timeout=10)
    assert zipped.status_code == 200, zipped.text
    identify, track = server.new_events()
    assert identify["eventn_ctx"]["user"]["email"] == "s@x.io" and identify["eventn_ctx"]["event_id"] == "single-1"
    assert track["eventn_ctx"]["user"]["internal_id"] == "u-gz"

    server.mark()
    bomb = gzip.compress(b" " * (8 * 1024 * 1024))  # inflates past the 4 MiB limit
    answer = httpx.post(url, headers={**basic(SERVER_SECRET), "Content-Encoding": "gzip"}, content=bomb, timeout=30)
    assert answer.status_code == 413, answer.text
    broken = httpx.post(url, headers={**basic(SERVER_SECRET), "Content-Encoding": "gzip"}, content=b"xx", timeout=10)
    assert broken.status_code == 400, broken.text
    deep = {"type": "track", "properties": {}}
    node = deep["properties"]
    for _ in range(70):
        node["a"] = node = {}
    assert httpx.post(url, headers=basic(SERVER_SECRET), json={"batch": [deep]}, timeout=10).status_code == 400
    assert server.new_events() == []


def test_truncated_gzip_is_refused(server: Server) -> None:
    server.mark()
    packed = gzip.compress(b'{"batch": [{"type": "track", "event": "cut"}]}')
    headers = {**basic(SERVER_SECRET), "Content-Encoding": "gzip"}
    answer = httpx.post(f"{server.url}/api/v1/segment", headers=headers, content=packed[:-12], timeout=10)
    assert answer.status_code == 400 and "truncated" in answer.json()["error"], answer.text
    assert server.new_events() == []


def test_a_body_holding_the_only_write_key_is_read_up_to_1_mib(server: Server) -> None:
    """Read before the key is known, such a body is bounded tighter than an authenticated one."""
    server.mark()
    big = segment_batch(*({"properties": {"pad": "x" * 1000}} for _ in range(1100)), writeKey=SERVER_SECRET)
    url = f"{server.url}/api/v1/segment/v1/batch"
    refused = httpx.post(url, json=big, timeout=30)
    assert refused.status_code == 413, refused.text
    assert server.new_events() == []
    accepted = httpx.post(url, json=big, headers=basic(SERVER_SECRET), timeout=30)
    assert accepted.status_code == 200, accepted.text
    assert len(server.new_events()) == 1100


def test_an_authenticated_body_is_bounded_at_4_mib(server: Server) -> None:
    """A batch is parsed whole (about 35 times its size in memory): far below the bulk limit."""
    server.mark()
    body = segment_batch(*({"properties": {"pad": "x" * 1000}} for _ in range(4500)))  # ~4.6 MB
    url = f"{server.url}/api/v1/segment/v1/batch"
    answer = httpx.post(url, headers=basic(SERVER_SECRET), json=body, timeout=30)
    assert answer.status_code == 413 and "4 MiB" in answer.json()["error"], answer.text
    assert server.new_events() == []


def test_a_large_batch_is_accepted_whole(server: Server) -> None:
    server.mark()
    body = segment_batch(*({"properties": {"n": n, "pad": "x" * 900}} for n in range(500)))  # ~0.5 MB
    answer = httpx.post(f"{server.url}/api/v1/segment/v1/batch", headers=basic(SERVER_SECRET), json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert sorted(event["n"] for event in server.new_events()) == list(range(500))


def test_a_batch_of_many_small_messages_is_stored_whole_in_steps(server: Server) -> None:
    """More messages than one `ACCEPT_STEP`: every one is stored, in order, once."""
    server.mark()
    body = segment_batch(*({"properties": {"n": n}} for n in range(ACCEPT_STEP * 2 + 7)))
    answer = httpx.post(f"{server.url}/api/v1/segment/v1/batch", headers=basic(SERVER_SECRET), json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert [event["n"] for event in server.new_events()] == list(range(ACCEPT_STEP * 2 + 7))


# --- EventNative's aliases ------------------------------------------------------------------------


def test_js_alias_events(server: Server) -> None:
    server.mark()
    origin = {"Origin": "https://shop.example"}
    url = f"{server.url}/api/v1/events"
    answer = httpx.post(url, params={"token": CLIENT_SECRET}, headers=origin, json=[{"a": 1}, {"a": 2}], timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == "https://shop.example"
    preflight = httpx.options(url, headers={**origin, "Access-Control-Request-Method": "POST"}, timeout=10)
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "https://shop.example"
    assert httpx.post(url, params={"token": SERVER_SECRET}, json={"a": 3}, timeout=10).status_code == 401
    assert [event["a"] for event in server.new_events()] == [1, 2]


def test_s2s_alias_events(server: Server) -> None:
    server.mark()
    url = f"{server.url}/api/v1/s2s/events"
    assert httpx.post(url, headers={"X-Auth-Token": SERVER_SECRET}, json={"b": 1}, timeout=10).status_code == 200
    refused = httpx.post(url, params={"token": CLIENT_SECRET}, json={"b": 2}, timeout=10)
    assert refused.status_code == 401 and refused.json()["message"].startswith("The token isn't a server token")
    (event,) = server.new_events()
    assert event["b"] == 1 and event["src"] == "api"


# --- @segment/analytics-node ----------------------------------------------------------------------

NODE_SCRIPT = """
const { Analytics } = require('@segment/analytics-node')
const [host, writeKey, run] = process.argv.slice(2)
const analytics = new Analytics({ writeKey, host, path: '/api/v1/segment/v1/batch', flushAt: 4, maxRetries: 0 })
analytics.on('error', (err) => { console.error('segment error', err); process.exitCode = 1 })
const userId = 'node-' + run
const traits = { email: 'node@example.com' }
analytics.identify({ userId, anonymousId: 'anon-' + run, traits, messageId: 'ni-' + run })
analytics.track({ userId, event: 'Node Signed Up', properties: { plan: 'team' }, messageId: 'nt-' + run })
analytics.page({ userId, name: 'Pricing', properties: { url: 'https://shop.example/pricing' }, messageId: 'np-' + run })
analytics.screen({ userId, name: 'Cart', messageId: 'ns-' + run })
analytics.group({ userId, groupId: 'g-' + run, traits: { size: 5 }, messageId: 'ng-' + run })
analytics.alias({ userId, previousId: 'anon-' + run, messageId: 'na-' + run })
analytics.closeAndFlush({ timeout: 20000 }).then(() => console.log('flushed'))
"""


@pytest.fixture(scope="module")
def analytics_node() -> str:
    """The node_modules directory of @segment/analytics-node (installed from npm by the script, whose
    lock file pins the whole tree; the script gives up after 2 minutes with a message)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "segment-node.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, f"scripts/segment-node.sh failed: {done.stderr}"
    return str(Path(done.stdout.strip()) / "node_modules")


def test_node_client_sends_every_call_type(server: Server, analytics_node: str, tmp_path: Path) -> None:
    server.mark()
    run = uuid.uuid4().hex[:8]
    script = tmp_path / "send.js"
    script.write_text(NODE_SCRIPT)
    done = subprocess.run(
        ["node", str(script), server.url, SERVER_SECRET, run],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODE_PATH": analytics_node},
        check=False,
    )
    assert done.returncode == 0 and "flushed" in done.stdout, done.stdout + done.stderr
    events = {event["eventn_ctx_event_id"]: event for event in server.new_events()}
    assert sorted(events) == sorted(f"n{kind}-{run}" for kind in "itpsga")
    identify, track = events[f"ni-{run}"], events[f"nt-{run}"]
    assert identify["user"]["email"] == "node@example.com" and identify["user"]["anonymous_id"] == f"anon-{run}"
    assert track["event"] == "Node Signed Up" and track["plan"] == "team" and track["user"]["id"] == f"node-{run}"
    assert track["library"]["name"] == "@segment/analytics-node" and "_metadata" in track
    assert events[f"ng-{run}"]["groupId"] == f"g-{run}" and events[f"na-{run}"]["previousId"] == f"anon-{run}"
    assert {event["event_type"] for event in events.values()} == {
        "identify",
        "track",
        "page",
        "screen",
        "group",
        "alias",
    }
    row = wait_for(lambda: by_id(rows("pg_stream", "track")).get(f"nt-{run}"))
    assert (row["event"], row["plan"], row["user_id"]) == ("Node Signed Up", "team", f"node-{run}")
