"""The `facebook` destination's config: EventNative's `facebook:` block (`pixel_id`,
`access_token`), plus the HTTP family's keys and the Graph API version."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import SecretStr, field_validator

from eventspark.config.base import DestinationBase
from eventspark.destinations.http import HttpBlock


class FacebookConfig(HttpBlock):
    pixel_id: str
    """The pixel (dataset) the events belong to."""
    access_token: SecretStr
    """The Conversions API access token (sent in the query string, never logged)."""
    api_version: str = "v11.0"
    """Graph API version in the URL. EventNative's (v11.0) by default; Facebook retires versions
    about two years after release, so set a current one (`v21.0`...)."""

    @field_validator("pixel_id")
    @classmethod
    def _pixel(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9A-Za-z_-]+", value or ""):
            raise ValueError("pixel_id is required (digits)")
        return value

    @field_validator("access_token")
    @classmethod
    def _token(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value():
            raise ValueError("access_token is required")
        return value

    @field_validator("api_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not re.fullmatch(r"v[0-9]+\.[0-9]+", value):
            raise ValueError("api_version looks like v11.0")
        return value


class FacebookDestination(DestinationBase):
    """Events to the Facebook Conversions API (`POST /<version>/<pixel_id>/events`)."""

    type: Literal["facebook"]
    facebook: FacebookConfig
