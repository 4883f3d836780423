"""The tracking script in headless Chromium: a page on another origin (its own local HTTP server)
embeds eventspark's `/s/lib.js` or the `/t/inline.js` snippet, and its events land in a stream
Postgres destination of the `eventspark serve` that served the script.

The script is the real `@jitsu/sdk-js` web build, fetched (and checksum-verified) into the default
SDK directory when it is not there yet; a failed download fails the test with its reason.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver

from eventspark.sdk import fetch_sdk, sdk_root
from tests.collector.conftest import Server
from tests.conftest import pg_conninfo
from tests.static.conftest import CLIENT_SECRET, serve_config, start_with_sdk

TABLE = "web_events"
DELIVERY_TIMEOUT = 30  # the page loads, lib.js posts, the stream worker creates the table


@pytest.fixture(scope="module")
def sdk() -> Path:
    """The real SDK's root directory (fetched from the npm registry when missing)."""
    fetch_sdk()
    return sdk_root()


@pytest.fixture
def collector(tmp_path: Path, sdk: Path, pg_datasource: dict[str, Any]) -> Iterator[Server]:
    """`eventspark serve` with the real SDK and a stream Postgres destination for the page's token."""
    config = {
        **serve_config(),
        "destinations": {
            "pg": {
                "type": "postgres",
                "mode": "stream",
                "datasource": pg_datasource,
                "data_layout": {"table_name_template": TABLE},
            }
        },
    }
    server = start_with_sdk(tmp_path, config, sdk)
    yield server
    server.stop(signal.SIGTERM)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Another origin: a plain local HTTP server of a directory; yields (directory, base URL)."""
    root = tmp_path / "site"
    root.mkdir()
    handler = partial(_QuietFiles, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def stored_events(schema: str, marker: str) -> list[dict[str, Any]]:
    """The rows of the destination's table whose page URL carries `marker`."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(pg_conninfo(), autocommit=True, row_factory=dict_row) as conn:
        exists = conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s", (schema, TABLE)
        ).fetchone()
        if not exists:
            return []
        return conn.execute(f'SELECT * FROM "{schema}"."{TABLE}" WHERE url LIKE %s', (f"%{marker}%",)).fetchall()


def wait_for_events(schema: str, marker: str, server: Server) -> list[dict[str, Any]]:
    deadline = time.monotonic() + DELIVERY_TIMEOUT
    while time.monotonic() < deadline:
        rows = stored_events(schema, marker)
        if rows:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"no event of the page arrived in {DELIVERY_TIMEOUT} s; serve said:\n{server.text()[-3000:]}")


def test_a_page_on_another_origin_sends_its_page_view_through_lib_js(
    browser: webdriver.Chrome, collector: Server, site: tuple[Path, str], pg_schema: str
) -> None:
    root, origin = site
    (root / "page.html").write_text(
        "<!doctype html><html><head><title>lib.js page</title>"
        f'<script src="{collector.url}/s/lib.js" data-key="{CLIENT_SECRET}"></script>'
        "</head><body>hello</body></html>"
    )
    marker = uuid.uuid4().hex
    browser.get(f"{origin}/page.html?run={marker}")
    rows = wait_for_events(pg_schema, marker, collector)
    assert [row["event_type"] for row in rows] == ["pageview"]
    row = rows[0]
    assert row["url"] == f"{origin}/page.html?run={marker}"
    assert row["page_title"] == "lib.js page"
    assert row["src"] == "jitsu"
    assert row["api_key"] == CLIENT_SECRET


def test_the_inline_snippet_loads_lib_js_and_sends_the_queried_events(
    browser: webdriver.Chrome, collector: Server, site: tuple[Path, str], pg_schema: str
) -> None:
    root, origin = site
    (root / "inline.html").write_text(
        "<!doctype html><html><head><title>inline page</title>"
        f'<script async src="{collector.url}/t/inline.js?key={CLIENT_SECRET}&event=signup"></script>'
        "</head><body>hello</body></html>"
    )
    marker = uuid.uuid4().hex
    browser.get(f"{origin}/inline.html?run={marker}")
    rows = wait_for_events(pg_schema, marker, collector)
    time.sleep(1)  # a page view would come with the signup: give it the time to arrive too
    rows = stored_events(pg_schema, marker)
    assert [row["event_type"] for row in rows] == ["signup"]  # only the query's events (init-only)
    assert rows[0]["page_title"] == "inline page"
