"""The OpenAPI document of the whole HTTP API: `GET /api/v1/openapi.json`."""

from __future__ import annotations

from eventspark.collector.api.common import Routes

ROUTES: Routes = {}
