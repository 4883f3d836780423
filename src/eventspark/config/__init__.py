"""Configuration: pydantic models of the EventNative config format and the loader.

The names below are imported on first use (PEP 562): destination packages import
`eventspark.config.base`, and the config models import the destination registry, so importing
this package must not load the models eagerly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventspark.config.loading import ConfigError, LoadedConfig, load_config
    from eventspark.config.models import Config

__all__ = ["Config", "ConfigError", "LoadedConfig", "load_config"]
_HOMES = {"Config": "models", "ConfigError": "loading", "LoadedConfig": "loading", "load_config": "loading"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
