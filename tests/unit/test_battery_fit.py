"""The battery model against what a UPS did on battery: an aged battery gets a corrected
reference point, a healthy one does not."""

from __future__ import annotations

from pathlib import Path

from tests.sites import site_from
from upsguard.config.site import SiteConfig
from upsguard.models import UpsName
from upsguard.reports.story import BatterySample
from upsguard.simulation.battery_fit import fit, modelled_load_w


def site(tmp_path: Path) -> SiteConfig:
    return site_from(
        tmp_path,
        {
            "site": "fit",
            "ups": [
                {
                    "name": "ups1",
                    "simulated": {},
                    "runtime_at": {"minutes": 30, "load_watts": 400},
                    "other_load_watts": 100,
                }
            ],
            "platforms": {"vc": {"type": "simulated"}},
            "resources": [
                {"id": "h1", "kind": "host", "platform": "vc", "watts": 200},
                {"id": "h2", "kind": "host", "platform": "vc", "watts": 100},
            ],
        },
    )


def outage(capacity: float, minutes: int = 8, load_pct: float = 40.0) -> list[BatterySample]:
    """Readings every 30 s of a battery with ``capacity`` of its rated charge, at the full
    modelled load (400 W: the reference point, 30 min when new)."""
    per_s = 100.0 / (30 * 60 * capacity)
    samples = [BatterySample("ups1", -30.0, 100.0, 1800.0, 20.0, on_battery=False)]
    for i in range(minutes * 2 + 1):
        at = i * 30.0
        charge = round(100.0 - per_s * at)  # UPSes report whole percents
        runtime = charge / 100 * 1800 * capacity
        samples.append(BatterySample("ups1", at, charge, runtime, load_pct, on_battery=True))
    return samples


def test_the_modelled_load_counts_every_resource_and_the_other_load(tmp_path: Path) -> None:
    assert modelled_load_w(site(tmp_path), UpsName("ups1")) == 400.0


def test_an_aged_battery_gets_a_corrected_reference_point(tmp_path: Path) -> None:
    samples, fits = fit(site(tmp_path), outage(capacity=0.6))

    (result,) = fits
    assert result.ratio is not None and 0.5 < result.ratio < 0.7
    assert result.basis.startswith("discharge")
    assert "lasts measurably less than the model" in result.verdict
    assert result.suggestion is not None and result.suggestion.startswith("runtime_at: {minutes: 1")
    assert "load_watts: 400" in result.suggestion
    first = next(s for s in samples if s.on_battery)
    assert first.model_runtime_s == 1800.0  # full charge, 400 W: the reference point itself


def test_a_healthy_battery_matches_the_model(tmp_path: Path) -> None:
    _, (result,) = fit(site(tmp_path), outage(capacity=1.0))

    assert result.ratio is not None and 0.9 <= result.ratio <= 1.1
    assert result.verdict.startswith("matches the model") and result.suggestion is None


def test_a_short_outage_falls_back_on_the_ups_runtime_figure(tmp_path: Path) -> None:
    _, (result,) = fit(site(tmp_path), outage(capacity=0.6, minutes=1))

    assert result.basis.startswith("the UPS's own runtime figure")
    assert result.suggestion is not None


def test_without_load_readings_nothing_is_compared(tmp_path: Path) -> None:
    samples = [
        BatterySample("ups1", float(i), 100.0 - i, 1000.0, None, on_battery=True) for i in range(5)
    ]
    _, (result,) = fit(site(tmp_path), samples)

    assert result.ratio is None and "reports no load" in result.verdict
