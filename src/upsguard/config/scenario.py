"""Scenario files for ``upsguard simulate``: what happens to the power, and what misbehaves.

Loading a scenario also checks what the simulator needs of the site (each UPS's
``runtime_at``) and that the run stays bounded (polls within the horizon, flaps), so that
these are config errors naming ``file:line`` rather than failures deep in a run.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from upsguard.config.base import Model
from upsguard.config.checks import Problem
from upsguard.config.loading import validate
from upsguard.config.site import SiteConfig
from upsguard.config.source import (
    SourceText,
    Suggestions,
    format_path,
    load_yaml,
    parse_yaml,
)
from upsguard.config.types import (
    ByteRate,
    ByteSize,
    Duration,
    Interval,
    duration_phrase,
)
from upsguard.config.values import shorten
from upsguard.errors import ConfigError
from upsguard.models import CacheName, ResourceId, UpsName

#: A flapping entry changes the mains at most this often.
MAX_MAINS_CHANGES = 100_000
#: The simulator polls at most this often (the horizon over the site's poll_interval).
MAX_POLLS = 200_000


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
    every: Interval = timedelta(seconds=3)
    ups: list[UpsName] | None = None

    @model_validator(mode="after")
    def _order(self) -> Flapping:
        if self.stop <= self.start:
            raise ValueError("flapping needs start < stop")
        changes = (self.stop - self.start) / self.every
        if changes > MAX_MAINS_CHANGES:
            raise ValueError(
                f"{changes:,.0f} changes of mains: at most {MAX_MAINS_CHANGES:,}; "
                "make 'every' longer or the span shorter"
            )
        return self


class Window(Model):
    """Something that holds from ``at`` for ``duration`` (no duration: to the end)."""

    at: Duration
    duration: Duration | None = None
    ups: list[UpsName] | None = Field(None, description="the UPSes it happens to; none = all")


class Contact(Window):
    """A UPS that stops answering (``lost``: the driver or the network is gone) or answers
    with old values (``stale``: NUT's DATA-STALE), on line or on battery alike."""

    state: Literal["lost", "stale"] = "lost"


class UpsBehaviour(Model):
    start_charge: float = Field(100.0, ge=0, le=100)
    battery_health: float = Field(
        1.0, gt=0, le=1.0, description="fraction of the rated capacity an aged battery still has"
    )
    overstates_runtime: float = Field(
        1.0,
        ge=1.0,
        le=100.0,
        description="the UPS reports this many times the runtime its battery really has (a "
        "hot battery after a cooling loss drains faster than the UPS's own model)",
    )
    fails_at: Duration | None = Field(
        None,
        description="the UPS itself fails then: its output drops and it stops answering; what "
        "no other UPS supplies loses power",
    )


class PlatformBehaviour(Model):
    hang: Window | None = Field(
        None, description="every request to the platform goes unanswered in this window"
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
    site: str | None = Field(
        None, description="the site (its site file's 'site:') this scenario was written for"
    )
    outage: Outage | None = None
    power: list[PowerEvent] = Field(default_factory=list)
    flapping: list[Flapping] = Field(default_factory=list)
    contact: list[Contact] = Field(default_factory=list)
    self_test: list[Window] = Field(
        default_factory=list, description="a battery test (CAL): on battery on purpose"
    )
    fsd: list[Window] = Field(
        default_factory=list, description="a NUT primary sets forced shutdown (FSD)"
    )
    ups: dict[UpsName, UpsBehaviour] = Field(default_factory=dict)
    steps: dict[ResourceId, StepBehaviour] = Field(default_factory=dict)
    platforms: dict[str, PlatformBehaviour] = Field(default_factory=dict)
    caches: dict[CacheName, CacheBehaviour] = Field(default_factory=dict)
    recharge: Duration = Field(timedelta(hours=4), description="battery time from empty to full")
    horizon: Duration = Field(timedelta(hours=24), description="the simulation stops here")


DEFAULT_SCENARIO = Scenario(
    name="outage that does not end",
    description="mains fail after one minute and do not return",
    outage=Outage(),
)


def load_scenario(path: Path | str | None, site: SiteConfig) -> Scenario:
    """The scenario of ``path`` (the default outage without one), checked against the site;
    ``ConfigError`` names the file and line of each problem, in either file."""
    if path is None:
        _check(DEFAULT_SCENARIO, site, None)
        return DEFAULT_SCENARIO
    return _checked(load_yaml(Path(path)), site)


def parse_scenario(text: str, site: SiteConfig, name: str = "scenario") -> Scenario:
    return _checked(parse_yaml(text, name), site)


def _checked(source: SourceText, site: SiteConfig) -> Scenario:
    scenario = validate(Scenario, source)
    _check(scenario, site, source)
    return scenario


def _check(scenario: Scenario, site: SiteConfig, source: SourceText | None) -> None:
    problems = [
        site.problem(("ups", i, "runtime_at"), RUNTIME_AT_NEEDED)
        for i, ups in enumerate(site.ups)
        if ups.runtime_at is None
    ]
    own = _site(scenario, site) or _references(scenario, site)
    own += _polls(scenario, site) + _after_horizon(scenario)
    if source is not None:
        problems += [source.problem(loc, msg) for loc, msg in own]
    else:
        problems += [f"{format_path(loc)}: {msg}" for loc, msg in own]
    if problems:
        raise ConfigError(problems)


RUNTIME_AT_NEEDED = (
    "the simulator needs the battery's runtime at a load: add "
    "runtime_at: {minutes: 30, load_watts: 400} with this UPS's figures"
)


def runtime_at_missing(site: SiteConfig, index: int) -> str:
    """The problem of a UPS without ``runtime_at`` in a simulation, with file:line."""
    return site.problem(("ups", index, "runtime_at"), RUNTIME_AT_NEEDED)


def _polls(scenario: Scenario, site: SiteConfig) -> list[Problem]:
    """The simulator's loops poll until the horizon at worst (a cache that never drains):
    their count is bounded, so that a simulation ends in seconds, not days."""
    intervals = [(site.policies.poll_interval, "policies.poll_interval")]
    intervals += [
        (c.poll_interval, f"caches[{i}].poll_interval") for i, c in enumerate(site.caches)
    ]
    poll, field = min(intervals, key=lambda pair: pair[0])
    polls = scenario.horizon / poll
    if polls <= MAX_POLLS:
        return []
    return [
        (
            ("horizon",),
            f"{polls:,.0f} polls of {duration_phrase(poll)} (the site's {field}): the "
            f"simulator makes at most {MAX_POLLS:,}; shorten the horizon",
        )
    ]


def _starts(scenario: Scenario) -> list[tuple[tuple[str | int, ...], timedelta]]:
    """Where each thing the scenario makes happen starts, and when."""
    out: list[tuple[tuple[str | int, ...], timedelta]] = []
    if scenario.outage is not None:
        out.append((("outage", "at"), scenario.outage.at))
    out += [(("power", i, "at"), e.at) for i, e in enumerate(scenario.power)]
    out += [(("flapping", i, "start"), f.start) for i, f in enumerate(scenario.flapping)]
    for section in ("contact", "self_test", "fsd"):
        windows: list[Window] = getattr(scenario, section)
        out += [((section, i, "at"), w.at) for i, w in enumerate(windows)]
    out += [
        (("ups", name, "fails_at"), ups.fails_at)
        for name, ups in scenario.ups.items()
        if ups.fails_at is not None
    ]
    out += [
        (("platforms", name, "hang", "at"), p.hang.at)
        for name, p in scenario.platforms.items()
        if p.hang is not None
    ]
    return out


def _after_horizon(scenario: Scenario) -> list[Problem]:
    """Something set to happen at or after the horizon never happens: the simulation stops
    first, and a dry run of nothing would pass quietly. A mistake in the file, said as one."""
    horizon = scenario.horizon
    return [
        (
            loc,
            f"{duration_phrase(at)} is after the horizon ({duration_phrase(horizon)}), where "
            "the simulation stops: it would never happen; make it earlier or the horizon "
            "longer",
        )
        for loc, at in _starts(scenario)
        if at >= horizon
    ]


def _platform_names(site: SiteConfig) -> list[str]:
    """The platforms a dry run simulates: those the site file names and those its resources
    use by type alone (``ssh``, ``command``)."""
    used = {r.platform for r in site.resources if r.platform}
    used |= {r.power_on_via for r in site.resources if r.power_on_via}
    return sorted(set(site.platforms) | used)


def _site(scenario: Scenario, site: SiteConfig) -> list[Problem]:
    """A scenario names the site it was written for: against another site its UPS, resource
    and cache names mean nothing, and one line saying so beats a list of unknown names."""
    if scenario.site is None or scenario.site == site.site:
        return []
    return [
        (
            ("site",),
            f"this scenario is for site {shorten(scenario.site)!r}, not {shorten(site.site)!r}: "
            "simulate it with that site's file",
        )
    ]


def _references(scenario: Scenario, site: SiteConfig) -> list[Problem]:
    ups = [u.name for u in site.ups]
    ids = [r.id for r in site.resources]
    caches = [c.name for c in site.caches]
    ups_hint, ups_known = Suggestions(ups), set(ups)
    out: list[Problem] = []
    lists: list[tuple[tuple[str | int, ...], list[UpsName] | None]] = [
        (("outage", "ups"), scenario.outage.ups if scenario.outage else None),
        *((("power", i, "ups"), e.ups) for i, e in enumerate(scenario.power)),
        *((("flapping", i, "ups"), f.ups) for i, f in enumerate(scenario.flapping)),
        *((("contact", i, "ups"), c.ups) for i, c in enumerate(scenario.contact)),
        *((("self_test", i, "ups"), w.ups) for i, w in enumerate(scenario.self_test)),
        *((("fsd", i, "ups"), w.ups) for i, w in enumerate(scenario.fsd)),
    ]
    for loc, names in lists:
        for j, name in enumerate(names or []):
            if name not in ups_known:
                out.append(((*loc, j), f"unknown UPS {shorten(name)!r}{ups_hint(name)}"))
    for section, keys, known, what in (
        ("ups", scenario.ups, ups, "UPS"),
        ("steps", scenario.steps, ids, "resource"),
        ("caches", scenario.caches, caches, "cache"),
        ("platforms", scenario.platforms, _platform_names(site), "platform"),
    ):
        hint, names_known = Suggestions(known), set(known)
        for key in keys:
            if key not in names_known:
                out.append(((section, key), f"unknown {what} {shorten(key)!r}{hint(key)}"))
    return out
