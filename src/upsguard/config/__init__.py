"""The site file: pydantic models, and loading that names the field and line of every problem.

The names below are imported from their modules on first use (PEP 562's module
``__getattr__``), so that importing one small module of this package, such as ``api_socket``
for ``upsguard status``, does not build every model of the site file first: that took
~150 ms of a command meant to answer at once (``bench/cli_start.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from upsguard.config.caches import CacheConfig
    from upsguard.config.conditions import Condition, parse_condition
    from upsguard.config.loading import load_site, validate
    from upsguard.config.platforms import PlatformConfig
    from upsguard.config.policies import PoliciesConfig
    from upsguard.config.resources import HealthCheck, ResourceConfig, Selector
    from upsguard.config.site import FeedConfig, SiteConfig
    from upsguard.config.source import SourceText, load_yaml, parse_yaml
    from upsguard.config.types import (
        format_bytes,
        format_duration,
        parse_bytes,
        parse_duration,
        resolve_secret,
    )
    from upsguard.config.ups import UpsConfig

#: The module each public name comes from.
_HOMES = {
    "CacheConfig": "caches",
    "Condition": "conditions",
    "FeedConfig": "site",
    "HealthCheck": "resources",
    "PlatformConfig": "platforms",
    "PoliciesConfig": "policies",
    "ResourceConfig": "resources",
    "Selector": "resources",
    "SiteConfig": "site",
    "SourceText": "source",
    "UpsConfig": "ups",
    "format_bytes": "types",
    "format_duration": "types",
    "load_site": "loading",
    "load_yaml": "source",
    "parse_bytes": "types",
    "parse_condition": "conditions",
    "parse_duration": "types",
    "parse_yaml": "source",
    "resolve_secret": "types",
    "validate": "loading",
}

__all__ = [
    "CacheConfig",
    "Condition",
    "FeedConfig",
    "HealthCheck",
    "PlatformConfig",
    "PoliciesConfig",
    "ResourceConfig",
    "Selector",
    "SiteConfig",
    "SourceText",
    "UpsConfig",
    "format_bytes",
    "format_duration",
    "load_site",
    "load_yaml",
    "parse_bytes",
    "parse_condition",
    "parse_duration",
    "parse_yaml",
    "resolve_secret",
    "validate",
]


def __getattr__(name: str) -> object:
    """A public name, from its module (imported the first time one of its names is asked for)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
