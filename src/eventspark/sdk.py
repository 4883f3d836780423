"""The tracking script's default source: the web build of `@jitsu/sdk-js`, fetched at install time.

EventNative shipped the SDK's `lib.js` in its image and served it under `/s/`. eventspark does not
commit a copy: `scripts/bootstrap.sh` (and `eventspark tracking-script fetch`) download the pinned
version's tarball from the npm registry with the standard library, check it against the registry's
sha512 `integrity` pinned below, and unpack only the files of `package/dist/web/` into a directory of
the installation (`<venv>/share/eventspark/sdk/sdk-js-<version>/`), never into the repository.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

SDK_PACKAGE = "@jitsu/sdk-js"
SDK_VERSION = "3.1.5"
"""The pinned version; to change it, set the three values from `npm view @jitsu/sdk-js@<v> dist`."""
SDK_TARBALL = f"https://registry.npmjs.org/@jitsu/sdk-js/-/sdk-js-{SDK_VERSION}.tgz"
SDK_INTEGRITY = "sha512-e7P8uvGBNwWCC864MItcYSv0IT2+nwYiX8QXZ0lfyG8hutEXXX9Yt2/+MynXuGxMIoIrJ+j0bWVu20k9rrhxSg=="
"""The registry's Subresource-Integrity string of the tarball (`dist.integrity`)."""

SDK_DIR_ENV = "EVENTSPARK_SDK_DIR"
"""Overrides where the SDK is unpacked and looked for (default: `<sys.prefix>/share/eventspark/sdk`)."""
WEB_PREFIX = "package/dist/web/"
MAX_TARBALL_BYTES = 8 * 1024 * 1024
MAX_FILE_BYTES = 4 * 1024 * 1024
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
"""A file name the collector may serve: no slash, no leading dot (so no `..`), bounded."""


class FetchError(Exception):
    """The SDK could not be fetched, verified or unpacked; the message says why."""


def sdk_root() -> Path:
    """The directory that holds one sub-directory per fetched SDK version."""
    configured = os.environ.get(SDK_DIR_ENV)
    return Path(configured) if configured else Path(sys.prefix) / "share" / "eventspark" / "sdk"


def web_dir(root: Path | None = None) -> Path:
    """Where the pinned version's web build is (or would be) unpacked."""
    return (root or sdk_root()) / f"sdk-js-{SDK_VERSION}"


def fetch_sdk(
    root: Path | None = None, url: str = SDK_TARBALL, integrity: str = SDK_INTEGRITY, timeout: float = 30
) -> Path:
    """Downloads, verifies and unpacks the web build; returns its directory. Idempotent."""
    target = web_dir(root)
    if (target / "lib.js").is_file():
        return target
    data = download(url, timeout)
    verify(data, integrity)
    files = web_files(data)
    if "lib.js" not in files:
        raise FetchError(f"{url} has no {WEB_PREFIX}lib.js")
    install(files, target)
    return target


def download(url: str, timeout: float) -> bytes:
    """The tarball's bytes (bounded); network and HTTP errors become `FetchError`."""
    if not url.startswith(("https://", "http://")):
        raise FetchError(f"not an http(s) URL: {url}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # the scheme is checked above
            data: bytes = answer.read(MAX_TARBALL_BYTES + 1)
    except OSError as exc:  # URLError, HTTPError and timeouts are OSErrors
        raise FetchError(f"cannot download {url}: {exc}") from exc
    if len(data) > MAX_TARBALL_BYTES:
        raise FetchError(f"{url} is larger than {MAX_TARBALL_BYTES} bytes")
    return data


def verify(data: bytes, integrity: str) -> None:
    """Refuses bytes whose sha512 is not the pinned `sha512-<base64>` integrity string."""
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512" or not expected:
        raise FetchError(f"unsupported integrity string {integrity!r} (expected sha512-<base64>)")
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if not hmac.compare_digest(actual, expected):
        raise FetchError(f"checksum mismatch: the tarball's sha512 is {actual}, the pinned one {expected}")


def web_files(data: bytes) -> dict[str, bytes]:
    """The regular files directly under `package/dist/web/` with a servable name, by name."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive.getmembers():
                name = member.name.removeprefix(WEB_PREFIX)
                if name == member.name or not member.isreg() or not FILE_NAME.fullmatch(name):
                    continue
                if member.size > MAX_FILE_BYTES:
                    raise FetchError(f"{member.name} is larger than {MAX_FILE_BYTES} bytes")
                extracted = archive.extractfile(member)
                if extracted is not None:
                    files[name] = extracted.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FetchError(f"not a readable npm tarball: {exc}") from exc
    return files


def install(files: dict[str, bytes], target: Path) -> None:
    """Writes the files into a fresh directory beside `target`, then renames it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide it from a server running as another user
    try:
        for name, body in files.items():
            (staging / name).write_bytes(body)
        if target.exists():  # an incomplete earlier attempt (no lib.js)
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
