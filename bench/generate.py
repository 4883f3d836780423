"""A deterministic generator of realistic web events for the benchmarks.

Each event looks like what the Jitsu JS SDK (compat mode) sends after ContextEnrichment: nested
objects, about 40 leaves, a browser user agent, a public IP, RFC 3339 timestamps and an array.
The same seed gives the same events.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

USER_AGENTS = [
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/120.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/119.0.0.0 Safari/537.36 Edg/119.0.0.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
    "Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/120.0.6099.43 Mobile Safari/537.36",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
]
EVENT_TYPES = ["pageview", "click", "signup", "purchase", "scroll", "identify"]
PAGES = ["/", "/pricing", "/docs/start", "/blog/spark-at-scale", "/checkout", "/account/settings"]
COUNTRIES = ["US", "DE", "FR", "GB", "IN", "BR", "JP"]
START = datetime(2026, 11, 1, tzinfo=UTC)


def generate_events(n: int, seed: int = 42, users: int = 5000, ips: int = 2000) -> Iterator[dict[str, Any]]:
    """Yields `n` events; `users` and `ips` bound how many distinct visitors and addresses appear."""
    rng = random.Random(seed)
    ip_pool = [_public_ip(rng) for _ in range(ips)]
    for i in range(n):
        yield _event(rng, i, ip_pool, users)


def _public_ip(rng: random.Random) -> str:
    first = rng.choice([8, 24, 31, 46, 62, 77, 81, 93, 95, 104, 142, 151, 176, 185, 203, 212])
    return f"{first}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"


def _event(rng: random.Random, i: int, ip_pool: list[str], users: int) -> dict[str, Any]:
    ts = START + timedelta(seconds=i * 0.05 + rng.random())
    user = rng.randrange(users)
    page = rng.choice(PAGES)
    event_type = rng.choice(EVENT_TYPES)
    return {
        "_timestamp": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "api_key": "bench-token",
        "source_ip": rng.choice(ip_pool),
        "event_type": event_type,
        "eventn_ctx": {
            "event_id": f"{rng.getrandbits(32):08x}-{i:012x}",
            "user": {"anonymous_id": f"anon{user:08d}", "internal_id": f"u{user}" if user % 3 else None},
            "user_agent": rng.choice(USER_AGENTS),
            "utc_time": (ts - timedelta(milliseconds=rng.randint(5, 900))).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "local_tz_offset": rng.choice([-480, -300, 0, 60, 120, 330, 540]),
            "referer": rng.choice(["", "https://www.google.com/", "https://news.ycombinator.com/"]),
            "url": f"https://shop.example.com{page}?utm_source=newsletter&i={i}",
            "page_title": f"Example shop — {page.strip('/') or 'home'}",
            "doc_path": page,
            "doc_host": "shop.example.com",
            "doc_search": "?utm_source=newsletter",
            "screen_resolution": rng.choice(["1920x1080", "1440x900", "390x844"]),
            "vp_size": rng.choice(["1920x969", "1440x789", "390x664"]),
            "user_language": rng.choice(["en-US", "de-DE", "fr-FR", "ja-JP"]),
            "doc_encoding": "UTF-8",
            "utm": {"source": "newsletter", "medium": "email", "campaign": f"c{i % 17}"},
            "click_id": {"gclid": f"g{i % 101}"} if i % 4 == 0 else {},
        },
        "src": "eventn",
        "event_data": {
            "product": {
                "sku": f"SKU-{rng.randrange(10000):05d}",
                "price": round(rng.uniform(1, 500), 2),
                "quantity": rng.randint(1, 5),
                "in_stock": rng.random() > 0.1,
            },
            "cart_size": rng.randint(0, 12),
            "tags": rng.sample(["sale", "new", "gift", "eco", "b2b"], k=rng.randint(0, 3)),
            "experiment": {"name": "checkout_v2", "variant": rng.choice(["a", "b"])},
            "country_hint": rng.choice(COUNTRIES),
            "scroll_depth": round(rng.random(), 3),
            "consent": {"analytics": True, "ads": rng.random() > 0.5},
            "position": {"x": rng.randint(0, 1920), "y": rng.randint(0, 4000)},
        },
    }


def count_leaves(value: Any) -> int:
    if isinstance(value, dict):
        return sum(count_leaves(v) for v in value.values())
    return 1
