"""Which peers may name the client's address in `X-Real-IP` / `X-Forwarded-For`.

EventNative believes these headers from anyone, so any client can claim any `source_ip` (and the
geo data looked up from it). With `server.trusted_proxies` set (addresses or CIDR networks of the
load balancers in front of the collector), the headers count only when the peer is one of them,
and `X-Forwarded-For` is read from the right: the last address that is not a trusted proxy is the
client (entries to its left were written by the client itself and prove nothing). `X-Real-IP`
counts only when a trusted peer sends no `X-Forwarded-For`. Unset, the
EventNative rules apply (`steps.context.client_ip`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from eventspark.steps.context import client_ip

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_CACHE_LIMIT = 4096


class TrustedProxies:
    """The client address of a request from its peer and proxy headers (module docstring)."""

    def __init__(self, entries: Iterable[str] | None) -> None:
        # Entries were checked with the config (`ServerConfig.trusted_proxies`).
        self.networks = None if entries is None else [ipaddress.ip_network(e.strip(), strict=False) for e in entries]
        self._trusted: dict[str, bool] = {}

    def client_ip(self, peer: str, headers: dict[bytes, bytes]) -> str:
        real_ip = headers.get(b"x-real-ip", b"").decode("latin-1")
        forwarded = headers.get(b"x-forwarded-for", b"").decode("latin-1")
        if self.networks is None:
            return client_ip({"x-real-ip": real_ip, "x-forwarded-for": forwarded}, peer)
        if not self.trusts(peer):
            return peer
        # X-Forwarded-For first: proxies that only append to it (AWS ALB, HAProxy) pass a client's
        # own X-Real-IP through unchanged, so X-Real-IP counts only when it is the one header set.
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop
        if hops:
            return hops[0]  # every hop is a proxy of ours: the first one is closest to the client
        return real_ip.split(",", 1)[0].strip() or peer

    def trusts(self, address: str) -> bool:
        known = self._trusted.get(address)
        if known is None:
            known = self._check(address)
            if len(self._trusted) >= _CACHE_LIMIT:  # addresses come from the internet: bound the cache
                self._trusted.clear()
            self._trusted[address] = known
        return known

    def _check(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])  # no IPv6 zone index
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a dual-stack listener shows IPv4 peers as ::ffff:a.b.c.d
        return any(ip in network for network in self.networks or ())
