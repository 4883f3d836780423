"""Events and checks shared by the recognition tests."""

from __future__ import annotations

import time
from typing import Any

from tests.destinations.conftest import ClickHouseServer

KEY = "eventn_ctx_event_id"


def page(n: int, anonymous_id: str, event_type: str = "pageview", **user: Any) -> dict[str, Any]:
    """A JS SDK 2.x (flat) event of `anonymous_id`; `user` adds id / email (an identified event)."""
    return {
        "_timestamp": "2026-11-01T10:00:00.000000Z",
        "event_type": event_type,
        "eventn_ctx": {"event_id": f"e{n:04d}"},
        "user": {"anonymous_id": anonymous_id, **user},
        "n": n,
    }


ANONYMOUS = [page(1, "a1"), page(2, "a1"), page(3, "a2"), page(4, "a1", "click")]
"""Anonymous events of two visitors in two tables (pageview, click)."""
IDENTIFY = [page(5, "a1", "identify", id="u1", email="u1@example.com")]
"""a1 logs in: a row in a third table (identify)."""
EXPECTED = {
    "pageview": {"e0001": "u1", "e0002": "u1", "e0003": None},
    "click": {"e0004": "u1"},
    "identify": {"e0005": "u1"},
}
"""The user id of every row once recognition ran: a2 stays anonymous."""
RECOGNITION = {"users_recognition": {"enabled": True}}


def wait_for_mutations(server: ClickHouseServer, db: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    sql = f"SELECT count() FROM system.mutations WHERE database = '{db}' AND is_done = 0"
    while int(server.query(sql)[0][0]):
        assert time.monotonic() < deadline, "ClickHouse mutations did not finish"
        time.sleep(0.1)
