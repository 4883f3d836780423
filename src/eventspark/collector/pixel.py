"""`GET /api/v1/p.gif?data=<base64 JSON>`: tracking pixel for pages and emails without JavaScript."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from eventspark.collector.body import parse_failed, parse_json
from eventspark.collector.http import Headers

# A transparent 1×1 GIF89a: header, screen descriptor with a 2-colour table, graphic control
# extension (colour 0 transparent), one image with LZW data [clear, 0, end], trailer.
GIF = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00"
    b"\x00\x00\x00\xff\xff\xff"
    b"\x21\xf9\x04\x01\x00\x00\x00\x00"
    b"\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00"
    b"\x02\x02\x44\x01\x00"
    b"\x3b"
)
GIF_HEADERS: Headers = [
    (b"content-type", b"image/gif"),
    (b"cache-control", b"no-cache, no-store, must-revalidate"),
]
TOKEN_KEYS = ("api_key", "token")
"""Where a pixel's data may carry the token when the URL does not."""


def decode_data(data: str | None, max_event_size: int) -> Any:
    """The JSON value in `data`: base64 (standard or URL-safe, padding optional)."""
    if not data:
        raise parse_failed("the data query parameter is missing")
    if len(data) > (max_event_size * 4) // 3 + 4:
        raise parse_failed(f"data is larger than {max_event_size} bytes (server.max_event_size)")
    # A '+' left unescaped in a URL arrives as a space.
    text = data.strip().replace(" ", "+").replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise parse_failed(f"data is not base64: {exc}") from None
    return parse_json(raw)


def token_in_data(events: list[dict[str, Any]]) -> str | None:
    for key in TOKEN_KEYS:
        value = events[0].get(key) if events else None
        if isinstance(value, str) and value:
            return value
    return None
