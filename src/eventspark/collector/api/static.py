"""The tracking script as EventNative served it (issue 17): `/s/lib.js`, `/t/inline.js`."""

from __future__ import annotations

from eventspark.collector.api.common import Routes

ROUTES: Routes = {}
