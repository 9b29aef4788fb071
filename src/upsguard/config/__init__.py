"""The site file: pydantic models, and loading that names the field and line of every problem."""

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
