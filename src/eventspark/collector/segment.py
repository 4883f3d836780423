"""Segment messages → EventNative events: the field mapping of `/api/v1/segment[/compat]`.

Pure (no I/O). EventNative 1.41 mapped each Segment message with a list of old-style mapping
rules (`/src -> /dst`, `/src ->` removes; its `compatibility.segment.endpoint` and
`compatibility.segment_compat.endpoint` defaults), applied in order to the message itself:

* a move copies the value at `src` to `dst` (creating the objects on the way) and marks `src`
  for removal; a removal only marks it; the marked paths are removed after the last rule, in
  order. Objects are moved by reference, so removing `/context/page/title` after
  `/context/page -> /doc` also takes `title` out of `doc`, as in EventNative;
* `dst` `/` merges an object's keys into the event (`/properties -> /`, `/context -> /`): the
  remaining `context` keys (`library`, `app`, `timezone`, `screen`, ...) become top-level fields
  and the rules' removals (`/page`, `/traits`, `/os`, ...) drop the ones already mapped.

Then, as EventNative's Segment parser did: `timezone` (IANA name) becomes `local_tz_offset`
(minutes east of UTC, now), `screen` `{width, height}` becomes `screen_resolution` `"WxH"`,
`messageId` becomes the event id (so a client's retry upserts the same row where the table has
a primary key), and `src` is `segment_api`.

The plain variant produces the flat (JS SDK 2.x) layout: `user`, `ids`, `doc`, `utm`,
`parsed_ua` at the top. The compat variant produces EventNative 1.x's nested layout under
`eventn_ctx` (JS SDK `compat_mode: true`). Segment's own names stay for what no rule maps
(`event`, `timestamp`, `name`, `properties`' keys, `groupId`, `previousId`, ...).

Two deliberate differences: where EventNative failed the whole request (a `properties` or
`context` that is not an object, a destination path running into a non-object), the rule is
skipped and the value stays where it was, so nothing is lost; and a `messageId` that is not a
string or a number is left as a field instead of being printed Go-style into the id.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

__all__ = ["COMPAT_RULES", "PLAIN_RULES", "SRC", "map_message", "map_messages"]

SRC = "segment_api"
"""The `src` of every event from the Segment endpoints (EventNative's value)."""

Path = tuple[str, ...]
Rule = tuple[Path, Path | None]
"""(source path, destination path); None removes the source; () is the event itself."""

MAX_TIMEZONE_LENGTH = 64
_ROOT: Path = ()


def _rules(table: str, prefix: str) -> list[Rule]:
    """The rules of a table of `src -> dst` lines; `~` in a destination stands for `prefix`."""
    rules: list[Rule] = []
    for line in filter(None, (raw.strip() for raw in table.splitlines())):
        src, _, dst = (part.strip() for part in line.partition("->"))
        source = tuple(src.strip("/").split("/"))
        if not dst:
            rules.append((source, None))
        else:
            dst = dst.replace("~", prefix)
            rules.append((source, tuple(p for p in dst.strip("/").split("/") if p)))
    return rules


# EventNative 1.41's defaults, in its order. `~` is `` (plain) or `/eventn_ctx` (compat).
_TABLE = """
/context/page/title -> ~/page_title
/context/page -> ~/doc
/context/page/referrer -> ~/referer
/page ->
/traits -> ~/user
/context/traits -> ~/user
/traits ->
/context/userAgent -> ~/user_agent
/userAgent ->
/anonymousId -> ~/ids/ajs_anonymous_id
/anonymousId -> ~/user/anonymous_id
/userId -> ~/ids/ajs_user_id
/userId -> ~/user/internal_id
{user_id}
/context/campaign -> ~/utm
/context/campaign/name -> ~/utm/campaign
/campaign ->
/context/location -> ~/location
{location}
/context/referrer/url -> ~/referer
/context/os/name -> ~/parsed_ua/os_family
/context/os/version -> ~/parsed_ua/os_version
/os ->
/context/device/manufacturer -> ~/parsed_ua/device_brand
/context/device/model -> ~/parsed_ua/device_model
/context/device/version -> ~/parsed_ua/ua_version
/context/device/advertisingId -> ~/parsed_ua/device_advertising_id
/context/device/id -> ~/parsed_ua/device_id
/context/device/name -> ~/parsed_ua/device_name
/context/device/type -> ~/parsed_ua/device_type
/device ->
/context/locale -> ~/user_language
/type -> /event_type
/context/ip -> /source_ip
/ip ->
/locale ->
/context/user_agent -> ~/user_agent
/properties -> /
/context -> /
"""

PLAIN_RULES: list[Rule] = _rules(_TABLE.format(user_id="/userId -> ~/user/id", location=""), "")
"""`/api/v1/segment`: EventNative's `compatibility.segment.endpoint`."""
COMPAT_RULES: list[Rule] = _rules(_TABLE.format(user_id="", location="/location ->"), "/eventn_ctx")
"""`/api/v1/segment/compat`: EventNative's `compatibility.segment_compat.endpoint` (no
`user.id`: 1.x events identify users by `internal_id`)."""


def map_messages(messages: list[dict[str, Any]], compat: bool) -> list[dict[str, Any]]:
    """`map_message` for each message of a request (in place)."""
    rules = COMPAT_RULES if compat else PLAIN_RULES
    return [map_message(message, rules) for message in messages]


def map_message(message: dict[str, Any], rules: list[Rule]) -> dict[str, Any]:
    """One Segment message as an EventNative event (the message is changed in place)."""
    _apply(message, rules)
    _timezone_offset(message)
    _screen_resolution(message)
    _event_id(message)
    message["src"] = SRC
    return message


# --- the rules ------------------------------------------------------------------------------------


def _apply(event: dict[str, Any], rules: list[Rule]) -> None:
    removals: list[Path] = []
    for source, destination in rules:
        if destination is None:
            removals.append(source)
            continue
        found, value = _get(event, source)
        if found and _set(event, destination, value):
            removals.append(source)
    for source in removals:
        _remove(event, source)


def _get(event: dict[str, Any], path: Path) -> tuple[bool, Any]:
    node: Any = event
    for key in path:
        if node.__class__ is not dict or key not in node:
            return False, None
        node = node[key]
    return True, node


def _set(event: dict[str, Any], path: Path, value: Any) -> bool:
    """Sets `value` at `path` (`()`: merges an object into the event); False when it cannot."""
    if path == _ROOT:
        if value.__class__ is not dict:
            return False
        event.update(value)
        return True
    node = event
    for key in path[:-1]:
        child = node.get(key)
        if child is None and key not in node:
            child = node[key] = {}
        if child.__class__ is not dict:
            return False
        node = child
    node[path[-1]] = value
    return True


def _remove(event: dict[str, Any], path: Path) -> None:
    found, parent = _get(event, path[:-1])
    if found and parent.__class__ is dict:
        parent.pop(path[-1], None)


# --- after the rules ------------------------------------------------------------------------------


def _timezone_offset(event: dict[str, Any]) -> None:
    if "timezone" not in event:
        return
    name = event.pop("timezone")
    offset = _offset_minutes(name) if name.__class__ is str and len(name) <= MAX_TIMEZONE_LENGTH else None
    if offset is not None:
        event["local_tz_offset"] = offset


def _offset_minutes(name: str) -> float | None:
    try:
        offset = datetime.now(ZoneInfo(name)).utcoffset()
    except (ValueError, OSError, LookupError):  # unknown or malformed name (ZoneInfoNotFoundError: KeyError)
        return None
    return None if offset is None else offset.total_seconds() / 60


def _screen_resolution(event: dict[str, Any]) -> None:
    if "screen" not in event:
        return
    screen = event.pop("screen")
    if screen.__class__ is dict and "width" in screen and "height" in screen:
        event["screen_resolution"] = f"{_text(screen['width'])}x{_text(screen['height'])}"


def _text(value: Any) -> str:
    if value is None:
        return "<nil>"  # Go's %v of a JSON null, as EventNative wrote it
    if value.__class__ is bool:
        return "true" if value else "false"
    return str(value)


def _event_id(event: dict[str, Any]) -> None:
    """`messageId` → `eventn_ctx.event_id` (nested events) or `eventn_ctx_event_id` (flat ones)."""
    message_id = event.get("messageId")
    if message_id.__class__ not in (str, int, float):
        return
    del event["messageId"]
    ctx = event.get("eventn_ctx")
    if ctx.__class__ is dict:
        ctx["event_id"] = str(message_id)
    else:
        event["eventn_ctx_event_id"] = str(message_id)
