"""Configuration: pydantic models of the EventNative config format and the loader."""

from eventspark.config.loading import ConfigError, LoadedConfig, load_config
from eventspark.config.models import Config

__all__ = ["Config", "ConfigError", "LoadedConfig", "load_config"]
