"""The tracking pixel: its image and its data parameter."""

from __future__ import annotations

import base64
import struct

import pytest

from eventspark.collector.http import HTTPError
from eventspark.collector.pixel import GIF, decode_data, token_in_data


def test_gif_is_a_transparent_one_by_one_gif89a() -> None:
    assert GIF[:6] == b"GIF89a"
    assert struct.unpack("<HH", GIF[6:10]) == (1, 1)
    graphic_control = GIF.index(b"\x21\xf9\x04")
    assert GIF[graphic_control + 3] & 1  # transparency flag
    assert GIF[-1:] == b";"


@pytest.mark.parametrize(
    "data",
    [
        base64.b64encode(b'{"a": "~~~?>"}').decode(),
        base64.urlsafe_b64encode(b'{"a": "~~~?>"}').decode().rstrip("="),
        base64.b64encode(b'{"a": "~~~?>"}').decode().replace("+", " "),
    ],
)
def test_data_in_any_base64_flavour(data: str) -> None:
    assert decode_data(data, 1024) == {"a": "~~~?>"}


@pytest.mark.parametrize("data", [None, "", "@@@@", base64.b64encode(b"[1").decode(), "A" * 5000])
def test_bad_data(data: str | None) -> None:
    with pytest.raises(HTTPError, match="Failed to parse body"):
        decode_data(data, 1024)


def test_token_in_data() -> None:
    assert token_in_data([{"api_key": "k"}]) == "k"
    assert token_in_data([{"token": "t"}]) == "t"
    assert token_in_data([{"api_key": 5}]) is None
    assert token_in_data([]) is None
