"""Scenario files for ``upsguard simulate``: what happens to the power, and what misbehaves."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from upsguard.config.base import Model
from upsguard.config.checks import Problem
from upsguard.config.loading import validate
from upsguard.config.site import SiteConfig
from upsguard.config.source import load_yaml, parse_yaml, suggest
from upsguard.config.types import ByteRate, ByteSize, Duration
from upsguard.errors import ConfigError
from upsguard.models import CacheName, ResourceId, UpsName


class Outage(Model):
    at: Duration = timedelta(minutes=1)
    duration: Duration | None = Field(None, description="power returns after this; none = never")
    ups: list[UpsName] | None = Field(None, description="the UPSes that lose mains; none = all")


class PowerEvent(Model):
    at: Duration
    state: Literal["battery", "online"]
    ups: list[UpsName] | None = None


class Flapping(Model):
    """Mains going off and on every ``every`` between ``start`` and ``stop``."""

    start: Duration
    stop: Duration
    every: Duration = timedelta(seconds=3)
    ups: list[UpsName] | None = None

    @model_validator(mode="after")
    def _order(self) -> Flapping:
        if self.stop <= self.start or self.every.total_seconds() <= 0:
            raise ValueError("flapping needs start < stop and every > 0")
        return self


class UpsBehaviour(Model):
    start_charge: float = Field(100.0, ge=0, le=100)
    battery_health: float = Field(
        1.0, gt=0, le=1.0, description="fraction of the rated capacity an aged battery still has"
    )


class StepBehaviour(Model):
    stop: Duration | None = Field(None, description="how long its graceful stop takes")
    start: Duration | None = None
    hang: bool = Field(False, description="the guest never finishes a graceful shutdown")
    fail: Literal["stop", "start"] | None = None
    no_tools: bool = False


class CacheBehaviour(Model):
    dirty: ByteSize | None = None
    rate: ByteRate | None = None


class Scenario(Model):
    name: str = "outage"
    description: str = ""
    outage: Outage | None = None
    power: list[PowerEvent] = Field(default_factory=list)
    flapping: list[Flapping] = Field(default_factory=list)
    ups: dict[UpsName, UpsBehaviour] = Field(default_factory=dict)
    steps: dict[ResourceId, StepBehaviour] = Field(default_factory=dict)
    caches: dict[CacheName, CacheBehaviour] = Field(default_factory=dict)
    recharge: Duration = Field(timedelta(hours=4), description="battery time from empty to full")
    horizon: Duration = Field(timedelta(hours=24), description="the simulation stops here")


DEFAULT_SCENARIO = Scenario(
    name="outage that does not end",
    description="mains fail after one minute and do not return",
    outage=Outage(),
)


def load_scenario(path: Path | str | None, site: SiteConfig) -> Scenario:
    if path is None:
        return DEFAULT_SCENARIO
    source = load_yaml(Path(path))
    scenario = validate(Scenario, source)
    problems = list(_references(scenario, site))
    if problems:
        raise ConfigError([source.problem(loc, msg) for loc, msg in problems])
    return scenario


def parse_scenario(text: str, site: SiteConfig, name: str = "scenario") -> Scenario:
    source = parse_yaml(text, name)
    scenario = validate(Scenario, source)
    problems = list(_references(scenario, site))
    if problems:
        raise ConfigError([source.problem(loc, msg) for loc, msg in problems])
    return scenario


def _references(scenario: Scenario, site: SiteConfig) -> list[Problem]:
    ups = [u.name for u in site.ups]
    ids = [r.id for r in site.resources]
    caches = [c.name for c in site.caches]
    out: list[Problem] = []
    lists: list[tuple[tuple[str | int, ...], list[UpsName] | None]] = [
        (("outage", "ups"), scenario.outage.ups if scenario.outage else None),
        *((("power", i, "ups"), e.ups) for i, e in enumerate(scenario.power)),
        *((("flapping", i, "ups"), f.ups) for i, f in enumerate(scenario.flapping)),
    ]
    for loc, names in lists:
        for j, name in enumerate(names or []):
            if name not in ups:
                out.append(((*loc, j), f"unknown UPS '{name}'{suggest(name, ups)}"))
    for section, keys, known, what in (
        ("ups", scenario.ups, ups, "UPS"),
        ("steps", scenario.steps, ids, "resource"),
        ("caches", scenario.caches, caches, "cache"),
    ):
        for key in keys:
            if key not in known:
                out.append(((section, key), f"unknown {what} '{key}'{suggest(key, known)}"))
    return out
