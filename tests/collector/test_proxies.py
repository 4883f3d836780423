"""Trusted proxies: who may name the client's address."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from eventspark.collector.proxies import TrustedProxies
from eventspark.config.models import ServerConfig
from tests.collector.conftest import Server


def headers(real_ip: str | None = None, forwarded: str | None = None) -> dict[bytes, bytes]:
    found = {b"x-real-ip": real_ip, b"x-forwarded-for": forwarded}
    return {name: value.encode() for name, value in found.items() if value is not None}


def test_unset_believes_everyone_as_eventnative_did() -> None:
    proxies = TrustedProxies(None)
    assert proxies.client_ip("203.0.113.5", headers(forwarded="1.2.3.4, 10.0.0.1")) == "1.2.3.4"
    assert proxies.client_ip("203.0.113.5", headers("9.9.9.9", "1.2.3.4")) == "9.9.9.9"


def test_headers_count_only_from_a_trusted_peer() -> None:
    proxies = TrustedProxies(["10.0.0.0/8", "::1"])
    assert proxies.client_ip("203.0.113.5", headers("1.1.1.1", "2.2.2.2")) == "203.0.113.5"
    # A proxy that only appends to X-Forwarded-For passes the client's own X-Real-IP through.
    assert proxies.client_ip("10.1.2.3", headers("1.1.1.1", "2.2.2.2")) == "2.2.2.2"
    assert proxies.client_ip("10.1.2.3", headers("1.1.1.1")) == "1.1.1.1"  # set by the proxy itself
    assert proxies.client_ip("::1", headers(forwarded="2.2.2.2")) == "2.2.2.2"
    assert proxies.client_ip("::ffff:10.0.0.9", headers(forwarded="2.2.2.2")) == "2.2.2.2"  # dual-stack peer


def test_forwarded_for_is_read_from_the_right() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    # The client wrote "6.6.6.6" itself; 198.51.100.7 reached our first proxy 10.0.0.2.
    chain = "6.6.6.6, 198.51.100.7, 10.0.0.2"
    assert proxies.client_ip("10.0.0.1", headers(forwarded=chain)) == "198.51.100.7"
    assert proxies.client_ip("10.0.0.1", headers(forwarded="10.0.0.3, 10.0.0.2")) == "10.0.0.3"
    assert proxies.client_ip("10.0.0.1", headers(forwarded=" , not-an-ip")) == "not-an-ip"
    assert proxies.client_ip("10.0.0.1", headers(forwarded="")) == "10.0.0.1"


def test_bad_entries_are_config_errors() -> None:
    assert ServerConfig.model_validate({"trusted_proxies": ["10.0.0.0/8", "fd00::/8", "127.0.0.1"]})
    with pytest.raises(ValidationError, match=re.escape("'10.0.0.0/33' is not an IP address or CIDR network")):
        ServerConfig.model_validate({"trusted_proxies": ["10.0.0.0/33"]})


@pytest.mark.parametrize(("trusted", "expected"), [(["127.0.0.0/8"], "198.51.100.7"), (["10.0.0.0/8"], "127.0.0.1")])
def test_served_source_ip(run_server: Any, trusted: list[str], expected: str) -> None:
    config = {
        "server": {"trusted_proxies": trusted},
        "api_keys": [{"id": "tok", "client_secret": "js", "server_secret": "s2s"}],
        "destinations": {"dw": {"type": "duckdb"}},
    }
    server: Server = run_server(config)
    spoofed = {"X-Forwarded-For": "6.6.6.6, 198.51.100.7"}
    for path in ("/api/v1/event?token=js", "/api/v1/s2s/event?token=s2s"):
        assert httpx.post(server.url + path, content=b'{"a":1}', headers=spoofed).status_code == 200
    assert [event["source_ip"] for event in server.new_events()] == [expected, expected]
