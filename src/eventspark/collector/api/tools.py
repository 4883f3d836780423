"""Setting up a destination: dry-run, destination test, template evaluation."""

from __future__ import annotations

from eventspark.collector.api.common import Routes, not_implemented

ROUTES: Routes = {
    "/api/v1/events/dry-run": {"POST": not_implemented("Dry run", admin=False)},
    "/api/v1/destinations/test": {"POST": not_implemented("Destination testing", admin=True)},
}
