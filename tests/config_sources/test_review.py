"""Review of the config sources: secrets on disk and in the SQL debug log, redirects, slow servers."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from eventspark.config.sources import SourceError, fetch, publish, sources_file


def test_the_published_config_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    # it holds the tokens' secrets and the destinations' passwords
    stale = sources_file(tmp_path).with_name(f".sources.json.{os.getpid()}.tmp")
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"left by a crash")
    stale.chmod(0o644)
    publish(tmp_path, {"api_keys": [{"id": "t", "server_secret": "s"}]})
    assert stat.S_IMODE(sources_file(tmp_path).stat().st_mode) == 0o600


def test_sql_debug_log_masks_keys_written_into_statements() -> None:
    from eventspark.destinations.redshift.s3 import Credentials, copy_statement
    from eventspark.destinations.sql.debug_log import statement_line

    redshift = copy_statement('"s"', "s3://b/m", Credentials("AKIAKEYID", "se'cret/+key", "session-tok"), "eu")
    line = statement_line("rs", redshift)
    assert "cret/+key" not in line and "session-tok" not in line
    assert "SECRET_ACCESS_KEY '***' SESSION_TOKEN '***' REGION 'eu'" in line
    snowflake = "COPY INTO t FROM 's3://b' CREDENTIALS = (AWS_KEY_ID = 'AK' AWS_SECRET_KEY = 'x''y' AWS_TOKEN = 'z')"
    assert statement_line("sf", snowflake).endswith(
        "CREDENTIALS = (AWS_KEY_ID = 'AK' AWS_SECRET_KEY = '***' AWS_TOKEN = '***')"
    )
    assert "hunter2" not in statement_line("pg", "ALTER USER loader WITH PASSWORD 'hunter2'")


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str | None]
    target: str = ""
    trickle: bool = False

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        if self.target:
            self.send_response(302)
            self.send_header("Location", self.target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"tokens": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) if not self.trickle else 100_000))
        self.end_headers()
        if not self.trickle:
            self.wfile.write(body)
            return
        for _ in range(100):  # a byte every 0.2 s: never a socket timeout
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.2)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def serve_handler() -> Iterator[Any]:
    servers = []

    def start(**attributes: Any) -> tuple[str, list[str | None]]:
        seen: list[str | None] = []
        handler = type("Handler", (_Recorder,), {"seen": seen, **attributes})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"127.0.0.1:{httpd.server_address[1]}", seen

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def test_basic_auth_does_not_follow_a_redirect_to_another_host(serve_handler: Any) -> None:
    other, other_seen = serve_handler()
    first, first_seen = serve_handler(target=f"http://{other}/keys")
    assert fetch(f"http://user:pw@{first}/keys") == b'{"tokens": []}'
    assert first_seen[0] is not None and first_seen[0].startswith("Basic ")
    assert other_seen == [None]


def test_a_redirect_to_another_scheme_is_refused(serve_handler: Any) -> None:
    first, _ = serve_handler(target="ftp://127.0.0.1/keys")
    with pytest.raises(SourceError, match="HTTP 302"):
        fetch(f"http://{first}/keys")


def test_a_server_that_trickles_its_body_times_out(serve_handler: Any) -> None:
    slow, _ = serve_handler(trickle=True)
    started = time.monotonic()
    with pytest.raises(SourceError, match="not read within"):
        fetch(f"http://{slow}/keys", timeout=1.0)
    assert time.monotonic() - started < 3


def test_a_collector_that_could_not_use_a_published_config_gets_it_again(tmp_path: Path) -> None:
    from eventspark.config.sources import SourcesWatch

    publish(tmp_path, {"api_keys": ["first"]})
    watch = SourcesWatch.open(tmp_path)
    assert watch is not None and watch.changed() is None  # the one it started with
    publish(tmp_path, {"api_keys": ["second"]})
    assert watch.changed() == {"api_keys": ["second"]}
    assert watch.changed() is None
    watch.retry()  # e.g. its build failed in this process
    assert watch.changed() == {"api_keys": ["second"]}
    assert watch.changed() is None
