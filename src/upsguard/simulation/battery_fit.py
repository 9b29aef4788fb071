"""The battery model against what the UPS really did on battery.

The model (``battery.py``) says how long a full battery lasts at a load, from the site
file's ``runtime_at`` reference point and Peukert exponent. The journal holds what each UPS
reported on battery: charge, runtime, load in percent. To put them side by side the load is
turned into watts with the site's own figures: at the first reading of an outage everything
runs, so the load percent then stands for the site's modelled load (the ``watts`` of what
the UPS feeds, plus its ``other_load_watts``).

Two measures, the first preferred:

- the discharge: how far the charge fell over the outage, against how far the model says it
  should have fallen at the loads seen (needs a fall of ``MIN_DROP_PCT``: charge is read in
  whole percent);
- the UPS's own runtime figure against the model's, reading by reading.

When the UPS lasts measurably less than the model (below ``AGED``), a corrected reference
point is suggested: the same load, fewer minutes.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace

from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.config.ups import UpsConfig
from upsguard.models import UpsName
from upsguard.reports.story import BatteryFit, BatterySample
from upsguard.simulation.battery import Battery

MIN_DROP_PCT = 10.0
"""Charge is read in whole percent: over a 10 % fall the reading error stays near 10 %."""
MIN_READINGS = 3
AGED = 0.9
"""Lasting less than 90 % of the model is more than reading noise: the battery has aged."""
GAP_S = 600.0
"""Readings further apart than this belong to different outages."""


def modelled_load_w(site: SiteConfig, ups: UpsName) -> float:
    """The site's modelled load on ``ups`` with everything running, as the simulator counts
    it: each resource's watts shared equally among the UPSes of its feeds (or of its hosts'
    feeds), plus the UPS's ``other_load_watts``."""
    config = next(u for u in site.ups if u.name == ups)
    total = config.other_load_watts
    everyone = tuple(u.name for u in site.ups)
    for res in site.resources:
        feeds = site.feeds_of(res.id)
        if not feeds and res.runs_on:
            feeds = [f for host in res.runs_on for f in site.feeds_of(host)]
        names = tuple(u for f in feeds for u in f.ups) or everyone
        total += res.watts * names.count(ups) / len(names)
    return total


def fit(
    site: SiteConfig, samples: Sequence[BatterySample]
) -> tuple[list[BatterySample], list[BatteryFit]]:
    """Every sample with the model's runtime where it can be worked out, and one fit per UPS
    that was on battery."""
    out: list[BatterySample] = []
    fits: list[BatteryFit] = []
    for ups in site.ups:
        mine = [s for s in samples if s.ups == ups.name]
        if not mine:
            continue
        modelled, result = _fit_one(site, ups, mine)
        out += modelled
        if result is not None:
            fits.append(result)
    known = {u.name for u in site.ups}
    out += [s for s in samples if s.ups not in known]
    out.sort(key=lambda s: s.at_s)
    return out, fits


def _fit_one(
    site: SiteConfig, ups: UpsConfig, samples: list[BatterySample]
) -> tuple[list[BatterySample], BatteryFit | None]:
    on_battery = [s for s in samples if s.on_battery]
    if not on_battery:
        return samples, None
    if ups.runtime_at is None:
        return samples, BatteryFit(
            ups.name, len(on_battery), None, "", "no runtime_at in the site file: no model"
        )
    battery = Battery(
        runtime_ref_s=ups.runtime_at.minutes * 60.0,
        load_ref_w=ups.runtime_at.load_watts,
        peukert=ups.peukert_exponent,
    )
    full_w = modelled_load_w(site, ups.name)
    watts = _watts(on_battery, full_w)
    modelled = [_with_model(s, battery, watts.get(s.at_s)) for s in samples]
    usable = [s for s in modelled if s.on_battery and s.model_runtime_s is not None]
    if full_w <= 0 or not usable:
        why = "no watts in the site file" if full_w <= 0 else "the UPS reports no load"
        return modelled, BatteryFit(
            ups.name, len(on_battery), None, "", f"{why}: nothing to compare with the model"
        )
    ratio, basis = _discharge_ratio(usable, battery, watts) or _runtime_ratio(usable)
    if ratio is None:
        return modelled, BatteryFit(
            ups.name,
            len(usable),
            None,
            basis,
            f"too little on battery to tell ({len(usable)} reading(s))",
        )
    return modelled, _verdict(ups, len(usable), ratio, basis)


def _watts(samples: list[BatterySample], full_w: float) -> dict[float, float]:
    """Each on-battery reading's load in watts (by its time): its percent against the first
    percent of its outage, which stands for the full modelled load."""
    out: dict[float, float] = {}
    reference: float | None = None
    last_at: float | None = None
    for sample in samples:
        if last_at is None or sample.at_s - last_at > GAP_S:
            reference = sample.load_pct or None
        last_at = sample.at_s
        if reference and sample.load_pct is not None:
            out[sample.at_s] = full_w * sample.load_pct / reference
    return out


def _with_model(sample: BatterySample, battery: Battery, watts: float | None) -> BatterySample:
    if watts is None or sample.charge_pct is None:
        return sample
    return replace(sample, model_runtime_s=sample.charge_pct / 100 * battery.full_runtime_s(watts))


def _discharge_ratio(
    samples: list[BatterySample], battery: Battery, watts: dict[float, float]
) -> tuple[float, str] | None:
    """The model's expected fall of charge over the outage, over the fall observed."""
    expected = observed = 0.0
    for a, b in _pairs(samples):
        if a.charge_pct is None or b.charge_pct is None:
            continue
        load = (watts.get(a.at_s, 0.0) + watts.get(b.at_s, 0.0)) / 2
        if load <= 0:
            continue
        expected += (b.at_s - a.at_s) / battery.full_runtime_s(load) * 100
        observed += a.charge_pct - b.charge_pct
    if observed < MIN_DROP_PCT or expected <= 0:
        return None
    basis = f"discharge: the charge fell {observed:.0f} % where the model expected {expected:.0f} %"
    return expected / observed, basis


def _pairs(samples: list[BatterySample]) -> Iterable[tuple[BatterySample, BatterySample]]:
    for a, b in itertools.pairwise(samples):
        if 0 < b.at_s - a.at_s <= GAP_S:
            yield a, b


def _runtime_ratio(samples: list[BatterySample]) -> tuple[float | None, str]:
    ratios = [
        s.runtime_s / s.model_runtime_s
        for s in samples
        if s.runtime_s is not None and s.model_runtime_s
    ]
    basis = f"the UPS's own runtime figure, {len(ratios)} reading(s)"
    if len(ratios) < MIN_READINGS:
        return None, basis
    return statistics.median(ratios), basis


def _verdict(ups: UpsConfig, readings: int, ratio: float, basis: str) -> BatteryFit:
    assert ups.runtime_at is not None
    share = f"{ratio * 100:.0f} % of what the model says ({basis})"
    if ratio < AGED:
        minutes = max(1.0, round(ups.runtime_at.minutes * ratio, 1))
        return BatteryFit(
            ups.name,
            readings,
            ratio,
            basis,
            f"lasts measurably less than the model: {share}; an aged battery? The model's "
            f"{format_duration(ups.runtime_at.minutes * 60)} at "
            f"{ups.runtime_at.load_watts:.0f} W would be {format_duration(minutes * 60)}",
            suggestion=(
                f"runtime_at: {{minutes: {minutes:g}, load_watts: {ups.runtime_at.load_watts:g}}}"
            ),
        )
    if ratio > 1 / AGED:
        return BatteryFit(ups.name, readings, ratio, basis, f"lasts longer than the model: {share}")
    return BatteryFit(ups.name, readings, ratio, basis, f"matches the model: {share}")
