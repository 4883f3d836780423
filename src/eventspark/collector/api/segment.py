"""Segment-compatible endpoints (issue 17): `/api/v1/segment[/compat][/v1/batch]`."""

from __future__ import annotations

from eventspark.collector.api.common import Routes

ROUTES: Routes = {}
