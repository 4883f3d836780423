"""The page's files and its config endpoint over real HTTP on `eventspark serve`: types, caching,
gzip, security headers, no inline code, admin token, no secrets."""

from __future__ import annotations

import gzip
from html.parser import HTMLParser
from importlib import resources

import httpx
import pytest

from tests.collector.conftest import Server
from tests.ui.conftest import ADMIN, CLIENT_SECRET, PG_PASSWORD, SERVER_SECRET

FILES = {
    "/ui": "text/html; charset=utf-8",
    "/ui/app.js": "text/javascript; charset=utf-8",
    "/ui/style.css": "text/css; charset=utf-8",
}


def package_file(name: str) -> bytes:
    return resources.files("eventspark.collector").joinpath("ui", name).read_bytes()


@pytest.mark.parametrize("path", FILES)
def test_files_have_type_security_headers_and_revalidate(ui_server: Server, path: str) -> None:
    answer = httpx.get(ui_server.url + path, headers={"Accept-Encoding": "identity"})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == FILES[path]
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"
    policy = answer.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assert "unsafe" not in policy
    assert answer.headers["cache-control"] == "no-cache"
    assert "content-encoding" not in answer.headers
    again = httpx.get(ui_server.url + path, headers={"If-None-Match": answer.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_gzip_when_accepted(ui_server: Server) -> None:
    plain = httpx.get(ui_server.url + "/ui/app.js", headers={"Accept-Encoding": "identity"}).content
    assert plain == package_file("app.js")
    with httpx.Client() as client:
        request = client.build_request("GET", ui_server.url + "/ui/app.js", headers={"Accept-Encoding": "gzip"})
        answer = client.send(request, stream=True)
        raw = b"".join(answer.iter_raw())  # the bytes as sent, not decoded by httpx
        answer.close()
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.headers["vary"] == "Accept-Encoding"
    assert int(answer.headers["content-length"]) == len(raw) < len(plain)
    assert gzip.decompress(raw) == plain


def test_trailing_slash_head_and_unknown_files(ui_server: Server) -> None:
    assert httpx.get(ui_server.url + "/ui/").headers["content-type"] == FILES["/ui"]
    assert httpx.head(ui_server.url + "/ui").status_code == 200
    for path in ("/ui/index.html", "/ui/../pyproject.toml", "/ui/%2e%2e/api/ui.py", "/ui/app.js.map"):
        assert httpx.get(ui_server.url + path).status_code == 404, path
    refused = httpx.post(ui_server.url + "/ui", content=b"x")
    assert refused.status_code == 405


class _Markup(HTMLParser):
    """Collects what a strict CSP would block: inline scripts, styles and event handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self.scripts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script":
            if not names.get("src"):
                self.inline.append("<script> without src")
            else:
                self.scripts.append(str(names["src"]))
        if tag == "style" or "style" in names:
            self.inline.append(f"style on <{tag}>")
        self.inline.extend(f"{name} on <{tag}>" for name in names if name.startswith("on"))


def test_page_has_no_inline_code() -> None:
    markup = _Markup()
    markup.feed(package_file("index.html").decode())
    assert markup.inline == []
    assert markup.scripts == ["/ui/app.js"]
    # The script renders event data as text only (DOM nodes and textContent).
    script = package_file("app.js").decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink


def test_config_endpoint_needs_the_admin_token(ui_server: Server) -> None:
    url = ui_server.url + "/api/v1/ui/config"
    missing = httpx.get(url)
    assert missing.status_code == 401
    wrong = httpx.get(url, headers={"X-Admin-Token": "nope"})
    assert wrong.status_code == 401 and wrong.json()["message"] == "Admin token does not match"
    answer = httpx.get(url, headers={"X-Admin-Token": ADMIN})
    assert answer.status_code == 200
    assert answer.headers["cache-control"] == "no-store"
    data = answer.json()
    assert data["server_name"] == "ui-node"
    assert data["tokens"] == ["web", "other"]
    assert data["destinations"] == [
        {"id": "pg", "type": "postgres", "mode": "stream", "tokens": ["web"]},
        {"id": "dw", "type": "duckdb", "mode": "batch", "tokens": ["web", "other"]},
    ]
    for secret in (ADMIN, CLIENT_SECRET, SERVER_SECRET, PG_PASSWORD, "ui-other-js"):
        assert secret not in answer.text
