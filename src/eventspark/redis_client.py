"""One way to build a Redis client from a `RedisConfig` (coordination, events cache, recognition index)."""

from __future__ import annotations

from typing import Any

import redis

from eventspark.config.models import RedisConfig


def redis_client(config: RedisConfig, timeout: float, **options: Any) -> redis.Redis:
    """A client that connects on its first command (no I/O here); `timeout` bounds the connection
    and every command, so an unreachable Redis slows a caller down by at most that much."""
    return redis.Redis(
        host=config.host,
        port=config.port,
        password=config.password,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        **options,
    )
