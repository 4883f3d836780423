"""The `mysql` destination's config (MySQL and MariaDB): EventNative's `datasource` block."""

from __future__ import annotations

from typing import Literal

from eventspark.config.base import DataSource, DestinationBase


class MySQLDestination(DestinationBase):
    type: Literal["mysql"]
    datasource: DataSource
    """host, port (3306), db (created when missing), username (root), password, parameters
    (connect_timeout, read_timeout, write_timeout, ssl_ca, ssl_cert, ssl_key)."""
