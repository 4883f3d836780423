"""`/s/<file>` and `/t/<file>` through a real `eventspark serve`: headers, gzip, 304, where files
come from, the 404 message, traversal attempts, inline.js from the query."""

from __future__ import annotations

import gzip
import http.client
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from eventspark.sdk import web_dir
from tests.collector.conftest import Server
from tests.static.conftest import CLIENT_SECRET, fake_sdk, serve_config, start_with_sdk

SDK_LIB = b"/* the fetched lib.js */\n" + b"var padding = 'x';\n" * 400
CUSTOM = b"console.log('custom');\n"
TEMPLATE = b"(function (cfg) { window.cfg = cfg; })(eventnConfig);\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """A server with an SDK (lib.js) and a static_files_dir (custom.js, both.js, inline.js, a map,
    a link out of the directory); yields it and its static_files_dir."""
    base = tmp_path_factory.mktemp("static")
    fake_sdk(base / "sdk", SDK_LIB)
    (web_dir(base / "sdk") / "both.js").write_bytes(b"from the sdk")
    static = base / "web"
    static.mkdir()
    (static / "custom.js").write_bytes(CUSTOM)
    (static / "both.js").write_bytes(b"from static_files_dir")
    (static / "custom.js.map").write_bytes(b'{"version": 3}')
    (static / "inline.js").write_bytes(TEMPLATE)
    (static / "notes.txt").write_bytes(b"not served")
    (static / ".hidden.js").write_bytes(b"outside")
    (base / "secret.js").write_bytes(b"outside")
    os.symlink(base / "secret.js", static / "link.js")
    config = serve_config(static_files_dir=str(static), public_url="https://collector.example.com")
    server = start_with_sdk(base, config, base / "sdk")
    yield server, static
    server.stop(signal.SIGTERM)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with no SDK installed and no static_files_dir."""
    base = tmp_path_factory.mktemp("bare")
    (base / "empty-sdk").mkdir()
    server = start_with_sdk(base, serve_config(), base / "empty-sdk")
    yield server
    server.stop(signal.SIGTERM)


def raw_get(server: Server, path: str) -> tuple[int, bytes]:
    """GET with the path sent byte for byte (httpx would normalise `..`)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_lib_js_comes_from_the_sdk_with_script_headers(served: tuple[Server, Path]) -> None:
    server, _ = served
    answer = httpx.get(f"{server.url}/s/lib.js", headers={"Accept-Encoding": "identity"})
    assert answer.status_code == 200
    assert answer.content == SDK_LIB
    assert answer.headers["content-type"] == "application/javascript; charset=utf-8"
    assert answer.headers["cache-control"] == "public, max-age=3600"
    assert answer.headers["access-control-allow-origin"] == "*"
    assert answer.headers["cross-origin-resource-policy"] == "cross-origin"
    assert answer.headers["vary"] == "Accept-Encoding"
    assert "content-encoding" not in answer.headers
    assert answer.headers["etag"].startswith('"')


def test_gzip_when_accepted(served: tuple[Server, Path]) -> None:
    server, _ = served
    with httpx.stream("GET", f"{server.url}/s/lib.js", headers={"Accept-Encoding": "gzip, br"}) as answer:
        raw = b"".join(answer.iter_raw())
    assert answer.headers["content-encoding"] == "gzip"
    assert gzip.decompress(raw) == SDK_LIB
    assert len(raw) < len(SDK_LIB) / 5


def test_304_when_the_etag_matches(served: tuple[Server, Path]) -> None:
    server, _ = served
    tag = httpx.get(f"{server.url}/s/lib.js").headers["etag"]
    for sent in (tag, f"W/{tag}", f'"other", {tag}'):
        again = httpx.get(f"{server.url}/s/lib.js", headers={"If-None-Match": sent})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == tag
    assert httpx.get(f"{server.url}/s/lib.js", headers={"If-None-Match": '"stale"'}).status_code == 200


def test_head_and_other_methods(served: tuple[Server, Path]) -> None:
    server, _ = served
    head = httpx.head(f"{server.url}/s/lib.js", headers={"Accept-Encoding": "identity"})
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(SDK_LIB))
    post = httpx.post(f"{server.url}/s/lib.js", content=b"x")
    assert post.status_code == 405


def test_static_files_dir_comes_first_and_both_prefixes_serve_it(served: tuple[Server, Path]) -> None:
    server, _ = served
    assert httpx.get(f"{server.url}/s/both.js").content == b"from static_files_dir"
    assert httpx.get(f"{server.url}/t/custom.js").content == CUSTOM
    assert httpx.get(f"{server.url}/t/lib.js").content == SDK_LIB
    source_map = httpx.get(f"{server.url}/s/custom.js.map")
    assert source_map.status_code == 200
    assert source_map.headers["content-type"] == "application/json; charset=utf-8"


def test_a_changed_file_is_served_without_restart(served: tuple[Server, Path]) -> None:
    server, static = served
    path = static / "changing.js"
    path.write_bytes(b"one")
    first = httpx.get(f"{server.url}/s/changing.js")
    path.write_bytes(b"second version")
    second = httpx.get(f"{server.url}/s/changing.js")
    assert (first.content, second.content) == (b"one", b"second version")
    assert first.headers["etag"] != second.headers["etag"]


@pytest.mark.parametrize(
    "path",
    [
        "/s/../secret.js",
        "/s/%2e%2e/secret.js",
        "/s/..%2fsecret.js",
        "/s/..%2f..%2f..%2fetc%2fpasswd",
        "/s/link.js",  # a symbolic link out of the directory
        "/s/.hidden.js",
        "/s/notes.txt",
        "/s/sub/custom.js",
        "/s//custom.js",
        "/t/%00.js",
        "/s/" + "a" * 5000 + ".js",
    ],
)
def test_nothing_outside_the_known_files_is_served(served: tuple[Server, Path], path: str) -> None:
    server, _ = served
    status, body = raw_get(server, path)
    assert status == 404, body
    assert b"outside" not in body and b"root:" not in body


def test_inline_js_from_the_static_files_dir_template(served: tuple[Server, Path]) -> None:
    server, _ = served
    answer = httpx.get(f"{server.url}/t/inline.js", params={"key": CLIENT_SECRET, "event": "pageview"})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/javascript; charset=utf-8"
    assert answer.headers["cache-control"] == "public, max-age=300"
    body = answer.content
    config = orjson.loads(body.split(b"window.cfg = cfg; })(")[1].split(b");\n")[0])
    assert config["key"] == CLIENT_SECRET
    assert config["tracking_host"] == "https://collector.example.com"  # server.public_url
    assert body.endswith(b'eventN.track("pageview"); ')
    again = httpx.get(str(answer.url), headers={"If-None-Match": answer.headers["etag"]})
    assert again.status_code == 304


def test_without_sdk_lib_js_is_a_404_that_says_how_to_get_it(bare: Server) -> None:
    answer = httpx.get(f"{bare.url}/s/lib.js")
    assert answer.status_code == 404
    message = answer.json()["message"]
    assert "lib.js not found" in message
    assert "eventspark tracking-script fetch" in message and "static_files_dir" in message
    assert "empty-sdk" not in message and "/tmp" not in message  # no server path in a public answer


def test_without_template_inline_js_is_the_built_in_loader(bare: Server) -> None:
    answer = httpx.get(f"{bare.url}/t/inline.js", params={"key": CLIENT_SECRET})
    assert answer.status_code == 200
    host = bare.url.removeprefix("http://")
    assert f'"tracking_host": "{host}"'.encode() in answer.content  # the request's Host
    assert b"/s/lib.js" in answer.content


def test_inline_js_without_key_is_a_400(bare: Server) -> None:
    answer = httpx.get(f"{bare.url}/t/inline.js", params={"tracking_host": "x"})
    assert answer.status_code == 400
    assert answer.json()["message"] == "Mandatory key parameter is missing"
