"""The events cache: `GET /api/v1/events/cache`."""

from __future__ import annotations

from eventspark.collector.api.common import Routes, not_implemented

ROUTES: Routes = {
    "/api/v1/events/cache": {"GET": not_implemented("The events cache", admin=True)},
}
