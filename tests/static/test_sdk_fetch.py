"""Fetching the tracking script's SDK: the pinned checksum is enforced, only the web build is unpacked.

The tarballs are built here and served by a real local HTTP server (no registry involved).
"""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from eventspark.sdk import SDK_VERSION, FetchError, fetch_sdk, web_dir

EVENTSPARK = Path(sys.executable).parent / "eventspark"
LIB = b"/* fake lib.js */ window.fake = 1;\n"


def tarball(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


GOOD = tarball(
    {
        "package/package.json": b"{}",
        "package/dist/npm/jitsu.es.js": b"npm build",
        "package/dist/web/lib.js": LIB,
        "package/dist/web/sub/deep.js": b"not directly in web/",
        "package/dist/web/../../escape.js": b"traversal",
        "package/dist/web/.hidden.js": b"hidden",
    },
    links={"package/dist/web/link.js": "/etc/passwd"},
)


class Files(BaseHTTPRequestHandler):
    """Serves `FILES` by path; counts the requests."""

    files: ClassVar[dict[str, bytes]] = {}
    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.requests.append(self.path)
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[str]:
    """A local HTTP server; yields its base URL."""
    Files.files = {"/good.tgz": GOOD, "/tampered.tgz": GOOD[:-8] + b"tampered", "/nolib.tgz": tarball({})}
    Files.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_verified_tarball_is_unpacked_with_only_its_web_files(registry: str, tmp_path: Path) -> None:
    target = fetch_sdk(tmp_path, f"{registry}/good.tgz", integrity(GOOD))
    assert target == web_dir(tmp_path) and target.name == f"sdk-js-{SDK_VERSION}"
    assert sorted(p.name for p in target.iterdir()) == ["lib.js"]
    assert (target / "lib.js").read_bytes() == LIB
    assert not (tmp_path.parent / "escape.js").exists()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no staging directory left


def test_fetching_again_reuses_the_installed_copy(registry: str, tmp_path: Path) -> None:
    fetch_sdk(tmp_path, f"{registry}/good.tgz", integrity(GOOD))
    fetch_sdk(tmp_path, f"{registry}/good.tgz", integrity(GOOD))
    assert Files.requests == ["/good.tgz"]


def test_a_tampered_tarball_is_refused(registry: str, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_sdk(tmp_path, f"{registry}/tampered.tgz", integrity(GOOD))
    assert not web_dir(tmp_path).exists()


def test_the_right_file_with_another_pin_is_refused(registry: str, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_sdk(tmp_path, f"{registry}/good.tgz", integrity(b"something else"))
    with pytest.raises(FetchError, match="unsupported integrity"):
        fetch_sdk(tmp_path, f"{registry}/good.tgz", "sha1-" + integrity(GOOD)[7:])


def test_a_tarball_without_lib_js_is_refused(registry: str, tmp_path: Path) -> None:
    data = Files.files["/nolib.tgz"]
    with pytest.raises(FetchError, match=r"has no package/dist/web/lib\.js"):
        fetch_sdk(tmp_path, f"{registry}/nolib.tgz", integrity(data))


def test_http_and_network_errors_say_what_failed(registry: str, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="404"):
        fetch_sdk(tmp_path, f"{registry}/missing.tgz", integrity(GOOD))
    with pytest.raises(FetchError, match="not an http"):
        fetch_sdk(tmp_path, "file:///etc/passwd", integrity(GOOD))


def test_the_command_exits_1_with_the_reason(registry: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(EVENTSPARK), "tracking-script", "fetch", "--dir", str(tmp_path), "--url", f"{registry}/tampered.tgz"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "checksum mismatch" in done.stderr
    assert not web_dir(tmp_path).exists()
