"""Failed events and replay: `GET /api/v1/fallback`, `POST /api/v1/replay`."""

from __future__ import annotations

from eventspark.collector.api.common import Routes, not_implemented

ROUTES: Routes = {
    "/api/v1/fallback": {"GET": not_implemented("Listing failed events", admin=True)},
    "/api/v1/replay": {"POST": not_implemented("Replaying failed events", admin=True)},
}
