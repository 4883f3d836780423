"""The `google_analytics` destination's config: EventNative's `google_analytics:` block
(`tracking_id`: Universal Analytics' collect protocol) or a GA4 Measurement Protocol stream
(`measurement_id` and `api_secret`), plus the HTTP family's keys."""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, model_validator

from eventspark.config.base import DestinationBase
from eventspark.destinations.http import HttpBlock


class GoogleAnalyticsConfig(HttpBlock):
    tracking_id: str | None = None
    """Universal Analytics property (`UA-XXXX-Y`): EventNative's protocol."""
    measurement_id: str | None = None
    """GA4 data stream (`G-XXXXXXX`), with `api_secret`."""
    api_secret: SecretStr | None = None
    """GA4 Measurement Protocol API secret (sent in the query string, never logged)."""

    @model_validator(mode="after")
    def _one_protocol(self) -> GoogleAnalyticsConfig:
        ua = bool(self.tracking_id)
        ga4 = bool(self.measurement_id) or self.api_secret is not None
        if ua == ga4:
            raise ValueError("give either tracking_id (Universal Analytics) or measurement_id and api_secret (GA4)")
        if ga4 and not (self.measurement_id and self.api_secret and self.api_secret.get_secret_value()):
            raise ValueError("GA4 needs both measurement_id and api_secret")
        return self


class GoogleAnalyticsDestination(DestinationBase):
    """Events to Google Analytics (Universal Analytics collect, or GA4 Measurement Protocol)."""

    type: Literal["google_analytics"]
    google_analytics: GoogleAnalyticsConfig
