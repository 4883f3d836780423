"""The page's rendering of every field of the events cache's answer, in headless Chromium.

Against `StubServer` (tests/ui/stub.py): the real page files with a scripted answer, so that hostile
text can be put in every field, including those the real endpoint fills itself (ids, table name,
types). test_live.py runs the page against `eventspark serve`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select

from tests.ui.page import cells, event_row, expand, injected_elements, message, stored_fields, wait_for
from tests.ui.stub import StubServer

ADMIN = "stub-admin"
PROBE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
CONFIG = {
    "server_name": "stub",
    "destinations": [
        {"id": "pg", "type": "postgres", "mode": "stream", "tokens": ["web"]},
        {"id": "dw", "type": "duckdb", "mode": "batch", "tokens": ["web", "app"]},
    ],
    "tokens": ["web", "app"],
    "cache": {"enabled": True, "size": 100},
    "poll_interval_ms": 300,
}


def cached(event_id: str, destination: str, status: str, **fields: Any) -> dict[str, Any]:
    return {
        "destination_id": destination,
        "token_id": "web",
        "event_id": event_id,
        "timestamp": "2026-11-24T14:00:00.123456Z",
        "status": status,
        "original": {"eventn_ctx_event_id": event_id, "event_type": "pageview"},
        "success": None,
        "error": "",
        **fields,
    }


def status_of(browser: webdriver.Chrome, event_id: str, destination: str) -> str | None:
    row = event_row(browser, event_id, destination)
    return None if row is None else cells(row)["status"]


def expand_state(browser: webdriver.Chrome, event_id: str, destination: str) -> str:
    """The text of an event's details, which must be open already."""
    row = event_row(browser, event_id, destination)
    assert row is not None
    return str(row.find_element(By.XPATH, "following-sibling::tr[1][contains(@class, 'detail')]").text)


def hostile_event() -> dict[str, Any]:
    return cached(
        PROBE,
        "pg",
        "success",
        token_id=PROBE,
        timestamp=PROBE,
        original={PROBE: PROBE, "nested": {"html": PROBE}},
        success={"table": PROBE, "record": [{"field": PROBE, "type": PROBE, "value": PROBE}]},
        error=PROBE,
    )


@pytest.fixture
def stub() -> Iterator[StubServer]:
    events = [
        cached(
            "e-ok",
            "pg",
            "success",
            success={
                "table": "events",
                "record": [
                    {"field": "event_type", "type": "text", "value": "pageview"},
                    {"field": "qty", "type": "bigint", "value": 3},
                ],
            },
        ),
        cached("e-bad", "pg", "failed", error="column 'qty': value 'abc' does not fit a INT64 column"),
        cached("e-wait", "dw", "pending", token_id="app"),
        cached("e-skip", "dw", "skipped"),
    ]
    with StubServer(ADMIN, CONFIG, events) as server:
        yield server


def test_rows_statuses_and_details(browser: webdriver.Chrome, stub: StubServer) -> None:
    browser.get(f"{stub.url}/ui?token={ADMIN}")
    row = wait_for(browser, lambda: event_row(browser, "e-bad", "pg"))
    assert cells(row)["status"] == "failed"
    assert cells(row)["summary"] == "column 'qty': value 'abc' does not fit a INT64 column"
    assert cells(event_row(browser, "e-wait", "dw"))["token"] == "app"  # type: ignore[arg-type]
    assert "token=" not in browser.current_url  # taken from the address bar once

    detail = expand(browser, "e-ok", "pg")
    assert detail.find_element(By.CSS_SELECTOR, ".table-name").text == "events"
    assert stored_fields(detail) == {"event_type": ("text", "pageview"), "qty": ("bigint", "3")}
    assert '"event_type": "pageview"' in detail.find_element(By.CSS_SELECTOR, "section.original pre").text
    error = expand(browser, "e-bad", "pg").find_element(By.CSS_SELECTOR, "section.error pre").text
    assert "does not fit" in error

    # The summary cards count the events per destination and status.
    summary = browser.find_element(By.ID, "summary").text
    assert "1 success" in summary and "1 failed" in summary and "1 pending" in summary


def test_new_events_and_changed_status_appear(browser: webdriver.Chrome, stub: StubServer) -> None:
    browser.get(f"{stub.url}/ui?token={ADMIN}")
    wait_for(browser, lambda: event_row(browser, "e-ok", "pg"))
    expand(browser, "e-wait", "dw")
    stub.events = [cached("e-new", "pg", "pending"), *stub.events]
    wait_for(browser, lambda: event_row(browser, "e-new", "pg"), timeout=3)
    stub.events = [dict(e, status="success") if e["event_id"] == "e-wait" else e for e in stub.events]
    wait_for(browser, lambda: status_of(browser, "e-wait", "dw") == "success")
    # The details stay open across refreshes, and show the new state.
    assert "waiting" not in expand_state(browser, "e-wait", "dw")


def test_filters_ask_the_server_and_filter_statuses(browser: webdriver.Chrome, stub: StubServer) -> None:
    browser.get(f"{stub.url}/ui?token={ADMIN}")
    wait_for(browser, lambda: event_row(browser, "e-ok", "pg"))
    Select(browser.find_element(By.ID, "filter-destination")).select_by_value("dw")
    wait_for(browser, lambda: event_row(browser, "e-ok", "pg") is None)
    assert event_row(browser, "e-wait", "dw") is not None
    assert {"dw"} == set(stub.cache_queries[-1]["destination_ids"])
    Select(browser.find_element(By.ID, "filter-token")).select_by_value("app")
    wait_for(browser, lambda: event_row(browser, "e-skip", "dw") is None)
    assert stub.cache_queries[-1]["token_ids"] == ["app"]
    Select(browser.find_element(By.ID, "filter-destination")).select_by_value("")
    Select(browser.find_element(By.ID, "filter-token")).select_by_value("")
    Select(browser.find_element(By.ID, "filter-status")).select_by_value("failed")
    wait_for(browser, lambda: event_row(browser, "e-ok", "pg") is None and event_row(browser, "e-bad", "pg"))


def test_hostile_text_is_shown_as_text(browser: webdriver.Chrome, stub: StubServer) -> None:
    stub.events = [hostile_event()]
    stub.config = {**CONFIG, "server_name": PROBE, "destinations": [{**CONFIG["destinations"][0], "id": PROBE}]}
    browser.get(f"{stub.url}/ui?token={ADMIN}")
    row = wait_for(browser, lambda: event_row(browser, PROBE, "pg"))
    detail = expand(browser, PROBE, "pg")
    assert cells(row)["token"] == PROBE
    assert cells(row)["summary"] == PROBE
    assert stored_fields(detail) == {PROBE: (PROBE, PROBE)}
    assert detail.find_element(By.CSS_SELECTOR, ".table-name").text == PROBE
    original = detail.find_element(By.CSS_SELECTOR, "section.original pre").text
    assert orjson.loads(original) == hostile_event()["original"]
    assert browser.find_element(By.ID, "server-name").text == PROBE
    assert injected_elements(browser) == 0


def test_without_token_the_page_asks_and_a_wrong_one_is_refused(browser: webdriver.Chrome, stub: StubServer) -> None:
    browser.get(f"{stub.url}/ui")
    field = wait_for(
        browser,
        lambda: (
            browser.find_element(By.ID, "token-input").is_displayed() and browser.find_element(By.ID, "token-input")
        ),
    )
    field.send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait_for(browser, lambda: "401 Admin token does not match" in message(browser))
    field = browser.find_element(By.ID, "token-input")
    assert field.is_displayed()
    field.send_keys(ADMIN)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait_for(browser, lambda: event_row(browser, "e-ok", "pg"))
    assert message(browser) == ""
    # The token is kept for this tab: a reload opens the page again.
    browser.refresh()
    wait_for(browser, lambda: event_row(browser, "e-ok", "pg"))


def test_cache_errors_are_shown_and_polling_goes_on(browser: webdriver.Chrome, stub: StubServer) -> None:
    stub.cache_error = (404, {"message": "The events cache is disabled", "error": "set server.cache.enabled: true"})
    browser.get(f"{stub.url}/ui?token={ADMIN}")
    wait_for(browser, lambda: "404 The events cache is disabled" in message(browser))
    assert browser.find_element(By.ID, "main").is_displayed()
    stub.cache_error = None
    wait_for(browser, lambda: event_row(browser, "e-ok", "pg"), timeout=5)  # the first back-off is 1 s
    assert message(browser) == ""
