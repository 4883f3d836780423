"""The live events page against `eventspark serve`, in headless Chromium: events sent over HTTP
appear within 2 s with their status, a failed one shows its reason, details show what was stored,
a wrong token shows the server's message, hostile event contents stay text.

The server (conftest `ui_server`) has a stream Postgres destination `pg` (table `ui_events` in a
schema of its own) and a batch DuckDB one `dw`, both for token `web`; the batch one rotates hourly,
so its events stay `pending` here.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.collector.conftest import Server, start_server
from tests.ui.conftest import ADMIN, CLIENT_SECRET, STREAM_TABLE, serve_config
from tests.ui.page import cells, event_row, expand, injected_elements, message, stored_fields, wait_for

PROBE = '<img src=x onerror="window.__xss=1"><b>bold</b>'
DELIVERY_TIMEOUT = 20  # the stream worker's first insert creates the table


def open_page(browser: webdriver.Chrome, server: Server) -> None:
    browser.get(f"{server.url}/ui?token={ADMIN}")
    wait_for(browser, lambda: browser.find_element(By.ID, "main").is_displayed(), what="the page")
    wait_for(browser, lambda: "live" in browser.find_element(By.ID, "state").text, what="a first answer")


def send(server: Server, **fields: Any) -> str:
    """Posts one event to the JS endpoint, as curl would; returns its event id."""
    event_id = f"ui-{uuid.uuid4().hex}"
    body = orjson.dumps({"eventn_ctx_event_id": event_id, **fields})
    answer = httpx.post(f"{server.url}/api/v1/event?token={CLIENT_SECRET}", content=body, timeout=10)
    assert answer.status_code == 200, answer.text
    return event_id


def status_of(browser: webdriver.Chrome, event_id: str, destination: str) -> str | None:
    row = event_row(browser, event_id, destination)
    return None if row is None else cells(row)["status"]


def test_sent_event_appears_within_two_seconds(browser: webdriver.Chrome, ui_server: Server) -> None:
    open_page(browser, ui_server)
    assert "token=" not in browser.current_url
    marker = uuid.uuid4().hex
    event_id = send(ui_server, event_type="pageview", marker=marker, qty=7)
    sent = time.monotonic()
    wait_for(browser, lambda: event_row(browser, event_id, "pg") and event_row(browser, event_id, "dw"), timeout=2)
    appeared = time.monotonic() - sent
    assert appeared < 2
    assert status_of(browser, event_id, "dw") == "pending"  # batch: loaded at the next rotation

    wait_for(browser, lambda: status_of(browser, event_id, "pg") == "success", timeout=DELIVERY_TIMEOUT)
    detail = expand(browser, event_id, "pg")
    assert detail.find_element(By.CSS_SELECTOR, ".table-name").text == STREAM_TABLE
    fields = stored_fields(detail)
    assert fields["marker"][1] == marker
    assert fields["qty"][1] == "7"
    assert fields["eventn_ctx_event_id"][1] == event_id
    original = orjson.loads(detail.find_element(By.CSS_SELECTOR, "section.original pre").text)
    assert original["marker"] == marker and original["eventn_ctx_event_id"] == event_id
    assert not detail.find_elements(By.CSS_SELECTOR, "section.error")


def test_failed_event_shows_its_reason(browser: webdriver.Chrome, ui_server: Server) -> None:
    open_page(browser, ui_server)
    good = send(ui_server, event_type="order", amount=5)
    wait_for(browser, lambda: status_of(browser, good, "pg") == "success", timeout=DELIVERY_TIMEOUT)
    bad = send(ui_server, event_type="order", amount="not a number")  # `amount` is a bigint column now
    wait_for(browser, lambda: status_of(browser, bad, "pg") == "failed", timeout=DELIVERY_TIMEOUT)
    row = event_row(browser, bad, "pg")
    assert row is not None
    reason = cells(row)["summary"]
    assert "amount" in reason and "not a number" in reason
    detail = expand(browser, bad, "pg")
    assert detail.find_element(By.CSS_SELECTOR, "section.error pre").text == reason
    assert orjson.loads(detail.find_element(By.CSS_SELECTOR, "section.original pre").text)["amount"] == "not a number"


def test_wrong_token_shows_the_servers_message(browser: webdriver.Chrome, ui_server: Server) -> None:
    browser.get(f"{ui_server.url}/ui?token=not-the-admin-token")
    wait_for(browser, lambda: message(browser), what="an error message")
    assert message(browser).startswith("401 Admin token does not match")
    assert browser.find_element(By.ID, "token-input").is_displayed()
    assert not browser.find_element(By.ID, "main").is_displayed()


def test_hostile_event_renders_as_text(browser: webdriver.Chrome, ui_server: Server) -> None:
    open_page(browser, ui_server)
    event_id = send(ui_server, event_type=PROBE, note=PROBE, nested={PROBE: PROBE})
    wait_for(browser, lambda: status_of(browser, event_id, "pg") == "success", timeout=DELIVERY_TIMEOUT)
    detail = expand(browser, event_id, "pg")
    original = orjson.loads(detail.find_element(By.CSS_SELECTOR, "section.original pre").text)
    assert original["note"] == PROBE and original["nested"] == {PROBE: PROBE}
    assert stored_fields(detail)["note"][1] == PROBE
    assert injected_elements(browser) == 0
    assert not browser.find_elements(By.CSS_SELECTOR, "#events b")


def test_events_of_every_worker_process_appear(browser: webdriver.Chrome, tmp_path: Path, pg_schema: str) -> None:
    """With `server.workers: 2` each collector worker is a process of its own, and the stream
    workers run in the parent: the page still shows every event and its result."""
    config = serve_config(pg_schema)
    config["server"]["workers"] = 2
    server = start_server(tmp_path, config)
    try:
        open_page(browser, server)
        sent = [send(server, event_type="pageview", n=n) for n in range(8)]  # a new connection each
        for event_id in sent:
            wait_for(browser, lambda e=event_id: status_of(browser, e, "pg") == "success", timeout=DELIVERY_TIMEOUT)
            assert status_of(browser, event_id, "dw") == "pending"
    finally:
        server.stop(signal.SIGTERM)
