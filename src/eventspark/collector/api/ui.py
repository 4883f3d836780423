"""The live events page: `GET /ui`."""

from __future__ import annotations

from eventspark.collector.api.common import Routes

ROUTES: Routes = {}
