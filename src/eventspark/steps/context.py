"""ContextEnrichment: what the collector adds to an event when it receives it.

Rules, derived from the design document and every EventNative test vector in
`shared/testdata/eventnative/`:

* ``api_key`` (the token used) is always set, replacing whatever the body held.
* ``source_ip`` (see :func:`client_ip`) and ``_timestamp`` (receive time, UTC) are filled only
  when the body has no such key or holds null there, as EventNative 1.41 did: a backfill keeps
  its own time (and lands in its month's table). A kept ``_timestamp`` that is not an RFC 3339
  string fails the event at load, with the reason, in ``failed/`` (an object or array is kept
  as its JSON text for that: flattened, it would load the event without a time).
* An event is *nested* (EventNative 1.x format) when ``eventn_ctx`` is an object, otherwise
  *flat* (JS SDK 2.x, mobile SDKs, most server-to-server senders).
* JS endpoint: the ``User-Agent`` header goes to ``eventn_ctx.user_agent`` for nested events
  and to top-level ``user_agent`` for flat ones, replacing the SDK's copy (an absent or empty
  header changes nothing). ``src`` is left as sent.
* s2s endpoint: ``src`` becomes ``"api"`` when the body has none (EventNative 1.41); the body's
  ``user_agent`` is left alone.
* Both endpoints: ``hashed_anonymous_id`` is set in ``eventn_ctx.user`` when that is an object,
  else in a top-level ``user`` object (none is created): the md5 hex of the client address (the
  event's ``source_ip``) followed by the ``User-Agent`` header, EventNative 1.41's cookie-less
  id (``users_recognition`` falls back to it).
* Event id, nested events: a non-empty ``eventn_ctx.event_id`` is kept, else a UUID is set
  there. Flat events: a non-empty top-level ``eventn_ctx_event_id`` is kept; otherwise the
  SDK's ``event_id`` is moved there (an empty one is dropped and a UUID generated). Integer
  ids become strings; ids of any other type are replaced by a UUID.

The mobile vectors (``mobile_*``) carry ``api_key`` ``c2stoken`` and the header user agent at
top level while keeping ``src: "jitsu_ios"``: they are flat events posted to the JS endpoint
with the client token, which the rules above reproduce without a special case.

:func:`enrich_context` mutates the freshly parsed event in place (no copy: it runs on every
request); callers that need the original must copy it first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from hashlib import md5, sha256
from time import time_ns
from typing import Any
from uuid import UUID

import orjson

__all__ = [
    "client_ip",
    "enrich_context",
    "ensure_event_id",
    "format_timestamp",
    "hashed_anonymous_id",
    "merge_template",
    "new_event_id",
    "utc_timestamp",
]

_EVENTN_CTX = "eventn_ctx"
_FLAT_ID_KEY = "eventn_ctx_event_id"


_IDS_PER_BATCH = 64
_id_pool: list[str] = []


def new_event_id() -> str:
    """A random (version 4) UUID in canonical text form: the default event id generator.

    Same format and randomness source (``os.urandom``) as ``str(uuid.uuid4())``, made 64 at a
    time from one read of random bytes; the variant nibble is ``8``-``b`` as RFC 4122 requires.
    `list.pop` is atomic, so threads (bulk uploads) never share an id.
    """
    try:
        return _id_pool.pop()
    except IndexError:
        fresh = _random_ids(_IDS_PER_BATCH)
        first = fresh.pop()  # not from the shared pool: another thread may empty it meanwhile
        _id_pool.extend(fresh)
        return first


def _random_ids(count: int) -> list[str]:
    hexed = os.urandom(16 * count).hex()
    return [
        f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"
        for h in (hexed[i : i + 32] for i in range(0, 32 * count, 32))
    ]


# A forked worker must not hand out the ids its parent already holds.
os.register_at_fork(after_in_child=_id_pool.clear)


# The last datetime formatted and its text. The events of one request share one ``now``, so a
# batch formats it once (about 1 µs an event). Holding the datetime keeps its id from being
# reused, so identity is a safe test; replacing the tuple is atomic for threads.
_last_formatted: tuple[datetime | None, str] = (None, "")


def format_timestamp(dt: datetime) -> str:
    """``2006-01-02T15:04:05.000000Z`` in UTC; a naive ``dt`` is taken to be UTC already."""
    global _last_formatted
    last, text = _last_formatted
    if dt is last:
        return text
    utc = dt.astimezone(UTC) if dt.tzinfo is not None and dt.tzinfo is not UTC else dt
    # %-formatting beats strftime and isoformat here, and this runs for every request.
    text = "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (  # noqa: UP031
        utc.year,
        utc.month,
        utc.day,
        utc.hour,
        utc.minute,
        utc.second,
        utc.microsecond,
    )
    _last_formatted = (dt, text)
    return text


# The current second and its ``2006-01-02T15:04:05`` text: formatting the date and time costs
# more than the rest of ContextEnrichment, and every event of the same second shares it.
# Replacing the tuple is atomic for threads.
_second_text: tuple[int, str] = (-1, "")
_THREE_DIGITS = [f"{n:03d}" for n in range(1000)]
"""Milliseconds and microseconds by table look-up: cheaper than %-formatting them."""


def utc_timestamp(ns: int | None = None) -> str:
    """``now`` (or ``ns`` nanoseconds since the epoch) as ``format_timestamp`` writes it (UTC).

    The same clock as ``datetime.now``, truncated to microseconds like it, at a quarter of the cost.
    """
    global _second_text
    second, fraction = divmod(time_ns() if ns is None else ns, 1_000_000_000)
    cached, text = _second_text
    if second != cached:
        text = format_timestamp(datetime.fromtimestamp(second, UTC))[:19]
        _second_text = (second, text)
    return f"{text}.{_THREE_DIGITS[fraction // 1_000_000]}{_THREE_DIGITS[fraction // 1000 % 1000]}Z"


# Digests by address + agent: the events of a request share a client, and so do a client's
# requests; events that carry their own ``source_ip`` (replays, server batches) interleave
# thousands of clients. A dict hit costs a fraction of md5 + hex. Bounded: cleared when full,
# and a key longer than _MAX_HASHED_KEY (a huge User-Agent) is hashed but not kept. Single dict
# operations are atomic for threads; a lost entry after a concurrent clear is only recomputed.
_hashed: dict[str, str] = {}
_MAX_HASHED = 4096
_MAX_HASHED_KEY = 512


def hashed_anonymous_id(ip: str, user_agent: str) -> str:
    """EventNative 1.41's ``hashed_anonymous_id``: md5 hex of ``ip`` followed by ``user_agent``."""
    key = ip + user_agent
    return _hashed.get(key) or _hash_key(key)


def _hash_key(key: str) -> str:
    # surrogatepass: a lone surrogate (from a lenient JSON parser) must not fail the request.
    digest = md5(key.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()
    if len(key) <= _MAX_HASHED_KEY:
        if len(_hashed) >= _MAX_HASHED:
            _hashed.clear()
        _hashed[key] = digest
    return digest


def client_ip(headers: Mapping[str, str], peer: str | None) -> str:
    """The client address: ``X-Real-IP``, else the first ``X-Forwarded-For`` entry, else ``peer``.

    ``headers`` may be case-insensitive (Starlette) or a plain dict with lower-case (ASGI) or
    canonical names. ``peer`` is the bare peer host, without a port. A header value that is a
    comma list (nginx appending ``remote_addr``) yields its first entry, as in EventNative.
    Returns ``""`` when nothing is known.
    """
    for name, canonical in (("x-real-ip", "X-Real-IP"), ("x-forwarded-for", "X-Forwarded-For")):
        value = headers.get(name) or headers.get(canonical)
        if value:
            first = value.split(",", 1)[0].strip()
            if first:
                return first
    return peer or ""


def enrich_context(
    event: dict[str, Any],
    *,
    token: str,
    source_ip: str,
    user_agent: str | None,
    server_side: bool,
    now: datetime | None = None,
    new_id: Callable[[], str] = new_event_id,
    timestamp: str | None = None,
) -> dict[str, Any]:
    """Apply ContextEnrichment to ``event`` in place and return it (rules: module docstring).

    ``server_side`` is True for the s2s endpoint, False for the JS endpoints; ``user_agent`` is
    the request's ``User-Agent`` header on both (only JS events store it). A missing
    ``_timestamp`` is ``timestamp`` when given (text from `utc_timestamp`, shared by the events
    of a request), else ``now`` formatted, else the current time. ``new_id`` defaults to a
    random UUID; ``now`` and ``new_id`` are injectable for tests.
    """
    sent_ip = event.get("source_ip")
    if sent_ip is None:
        event["source_ip"] = source_ip
    sent_timestamp = event.get("_timestamp")
    if sent_timestamp is None:
        if timestamp is None:
            timestamp = utc_timestamp() if now is None else format_timestamp(now)
        event["_timestamp"] = timestamp
    elif sent_timestamp.__class__ is dict or sent_timestamp.__class__ is list:
        # A subtree would flatten into `_timestamp_*` columns and load the event without a time;
        # as JSON text it fails at load (or in a template) with the reason, like any bad value.
        event["_timestamp"] = orjson.dumps(sent_timestamp).decode()
    event["api_key"] = token
    ctx = event.get(_EVENTN_CTX)
    nested = isinstance(ctx, dict)
    if server_side:
        if event.get("src") is None:
            event["src"] = "api"
    elif user_agent:
        (ctx if nested else event)["user_agent"] = user_agent
    user = (ctx if nested else event).get("user")
    if nested and user.__class__ is not dict:
        user = event.get("user")
    if user.__class__ is dict:
        # hashed_anonymous_id inlined: a call costs more than the cache hit of a request's events
        key = (sent_ip if sent_ip.__class__ is str else source_ip) + (user_agent or "")
        user["hashed_anonymous_id"] = _hashed.get(key) or _hash_key(key)
    if nested:
        event_id = ctx.get("event_id")
        if event_id.__class__ is not str or not event_id:  # the usual non-empty string stays as it is
            ctx["event_id"] = _usable_id(event_id) or new_id()
    else:
        flat_id = event.get(_FLAT_ID_KEY)
        if flat_id.__class__ is not str or not flat_id:  # a non-empty string stays as it is
            _set_flat_id(event, flat_id, new_id)
    return event


def _usable_id(value: Any) -> str | None:
    if value.__class__ is str:
        return value or None
    if value.__class__ is int:
        return str(value)
    return None


def _set_flat_id(event: dict[str, Any], flat_id: Any, new_id: Callable[[], str]) -> None:
    """A flat event's id: its own integer one, else the SDK's `event_id` (moved), else a new one."""
    if flat_id.__class__ is int:
        event[_FLAT_ID_KEY] = str(flat_id)
        return
    event[_FLAT_ID_KEY] = _usable_id(event.pop("event_id", None)) or new_id()


def ensure_event_id(event: dict[str, Any], line: bytes) -> None:
    """Give a loaded line that has no event id one, where ContextEnrichment would have put it.

    Lines the collector wrote always have one; lines from elsewhere (EventNative's logs, hand-made
    replays) may not. EventNative gave them a random id at load; this one is derived from the line
    (`line_event_id`), so a rerun or a retried pass loads the same id and upserts stay idempotent.
    """
    ctx = event.get(_EVENTN_CTX)
    if ctx.__class__ is dict:
        current = ctx.get("event_id")
        if current.__class__ is not str or not current:
            ctx["event_id"] = _usable_id(current) or line_event_id(line)
        return
    current = event.get(_FLAT_ID_KEY)
    if current.__class__ is not str or not current:
        _set_flat_id(event, current, lambda: line_event_id(line))


def line_event_id(line: bytes) -> str:
    """A UUID derived from the line (surrounding whitespace ignored): the first 122 bits of its
    SHA-256 in a version 8 (RFC 9562, custom) UUID. Different lines get different ids (no
    collision can be found or made, unlike with md5); byte-identical lines are taken as the same
    event delivered twice, as a retried pass or rerun loads it."""
    value = int.from_bytes(sha256(line.strip()).digest()[:16])
    value = (value & ~(0xF << 76) & ~(0x3 << 62)) | (0x8 << 76) | (0x2 << 62)  # version 8, RFC variant
    return str(UUID(int=value))


def merge_template(template: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """Fill ``event`` with the template's top-level keys it lacks; mutates and returns ``event``.

    For ``{"template": {...}, "events": [...]}`` bodies. The event wins on a shared key and the
    merge is shallow (a template object never merges into the event's object of the same
    name); the recorded vectors share no key, so neither choice is pinned by them (EventNative
    itself let the template win). Template objects and arrays are copied for every event, so
    later in-place steps on one event never show in another.
    """
    for key, value in template.items():
        if key not in event:
            event[key] = _copy_json(value)
    return event


def _copy_json(value: Any) -> Any:
    """Deep copy of a parsed JSON value, iterative so hostile nesting depth cannot overflow."""
    if not isinstance(value, dict | list):
        return value
    root = value.copy()
    pending: list[dict[Any, Any] | list[Any]] = [root]
    while pending:
        node = pending.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, dict | list):
                # Replacing a value under an existing key does not resize the dict being iterated.
                node[key] = copied = child.copy()
                pending.append(copied)
    return root
