"""The capabilities every HTTP destination shares."""

from __future__ import annotations

from eventspark.destinations.base import Capabilities


def http_capabilities() -> Capabilities:
    """Stream mode only; the worker hands events, not rows (`delivery="events"`). The fields about
    tables (upsert, stage, transactions, DDL) are required by `Capabilities` and not read for
    `delivery="events"`: they are given their most inert values."""
    return Capabilities(
        modes=frozenset({"stream"}),
        delivery="events",
        upsert="none",
        stage="files",
        transactions=False,
        ddl_in_transactions=False,
        add_column_if_not_exists=False,
    )
