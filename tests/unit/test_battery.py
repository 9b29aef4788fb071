"""The Peukert-style battery model of the simulator."""

from __future__ import annotations

import pytest

from upsguard.simulation.battery import Battery


def test_reference_point_is_honoured() -> None:
    battery = Battery(runtime_ref_s=1800, load_ref_w=400)
    assert battery.runtime_s(400) == pytest.approx(1800)


def test_half_the_load_lasts_more_than_twice_as_long() -> None:
    battery = Battery(runtime_ref_s=1800, load_ref_w=400, peukert=1.2)
    assert battery.runtime_s(200) == pytest.approx(1800 * 2**1.2)
    assert battery.runtime_s(200) > 2 * battery.runtime_s(400)


def test_ideal_battery_is_linear() -> None:
    battery = Battery(runtime_ref_s=1800, load_ref_w=400, peukert=1.0)
    assert battery.runtime_s(800) == pytest.approx(900)


def test_draining_at_changing_load() -> None:
    battery = Battery(runtime_ref_s=1000, load_ref_w=100, peukert=1.0)
    assert battery.drain(100, 250) is None
    assert battery.charge_pct == pytest.approx(75)
    # at half the load, the 75 % left lasts 1500 s
    assert battery.runtime_s(50) == pytest.approx(1500)
    assert battery.drain(50, 2000) == pytest.approx(1500)
    assert battery.soc == 0


def test_recharge_is_linear_and_capped() -> None:
    battery = Battery(runtime_ref_s=1000, load_ref_w=100, soc=0.5, recharge_s=1000)
    battery.charge(250)
    assert battery.charge_pct == pytest.approx(75)
    battery.charge(10_000)
    assert battery.charge_pct == 100
