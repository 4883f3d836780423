"""The `amplitude` destination's config: EventNative's `amplitude:` block (`api_key`, `endpoint`),
plus the HTTP family's keys. `endpoint` is EventNative's full URL of the HTTP API
(`https://api.eu.amplitude.com/2/httpapi`) or a base URL, to which `/2/httpapi` is added."""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, field_validator

from eventspark.config.base import DestinationBase
from eventspark.destinations.http import HttpBlock


class AmplitudeConfig(HttpBlock):
    api_key: SecretStr
    """The project's API key (sent in each request's body)."""

    @field_validator("api_key")
    @classmethod
    def _required(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value():
            raise ValueError("api_key is required")
        return value


class AmplitudeDestination(DestinationBase):
    """Events to Amplitude's HTTP API v2, up to 100 per request."""

    type: Literal["amplitude"]
    amplitude: AmplitudeConfig
