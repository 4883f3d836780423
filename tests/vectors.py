"""What EventNative 1.41 adds to the recorded vectors in `../shared/testdata/eventnative/`.

The vectors come from EventNative 1.3x, before `hashed_anonymous_id` (1.41, issue 17): the md5 hex
of the client address followed by the User-Agent header, set in the user object the event already
has (`eventn_ctx.user`, else a top-level `user`; none is created). Computed here with hashlib, not
with the code under test.
"""

from __future__ import annotations

import hashlib
from typing import Any

VECTOR_IP = "95.82.232.185"
VECTOR_USER_AGENT = "Go-http-client/1.1"
"""The address and User-Agent the vectors' README enriches with."""


def hashed_id(ip: str, user_agent: str) -> str:
    """EventNative 1.41's `hashed_anonymous_id` of a request from `ip` with `user_agent`."""
    return hashlib.md5((ip + user_agent).encode()).hexdigest()


HASHED_ID = hashed_id(VECTOR_IP, VECTOR_USER_AGENT)


def with_hashed_id(expected: dict[str, Any], hashed: str = HASHED_ID) -> dict[str, Any]:
    """`expected` (changed in place and returned) with `hashed_anonymous_id` where 1.41 puts it."""
    ctx = expected.get("eventn_ctx")
    user = ctx.get("user") if isinstance(ctx, dict) else None
    user = user if isinstance(user, dict) else expected.get("user")
    if isinstance(user, dict):
        user["hashed_anonymous_id"] = hashed
    return expected
