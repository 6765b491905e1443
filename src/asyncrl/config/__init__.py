"""Configuration: one pydantic model per role, loading from files and the command line."""

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config

__all__ = ["ConfigError", "load_config"]
