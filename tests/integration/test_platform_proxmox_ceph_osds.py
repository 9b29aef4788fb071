"""The startup's Ceph step of the proxmox platform, run by the executor against the PVE API
stand-in whose Ceph is real: a monitor and three OSDs (Debian's 16.2, memstore) on loopback
(``tests.peers.ceph``). Proxmox's own order for a Ceph cluster's startup (pve-docs, pveceph
"Shutdown"): the monitors' quorum and the OSDs up first, then the flags unset.

Driven by events, never by the clock: a test waits (bounded) until the step says what it waits
for, then changes the peer; the steps' timeouts are bounds, except where a timeout is the
point (a status that cannot be read), and there the wait can only end one way.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ceph import SETTABLE, CephMonitor
from tests.peers.pve import PLATFORM_LOG, PveApi, platform_said, settings_of
from tests.runs import executor_for, outcomes_by_step
from tests.sites import site_from
from upsguard.clock import SystemClock
from upsguard.config.platforms import ProxmoxSettings
from upsguard.config.site import SiteConfig
from upsguard.events import Event
from upsguard.models import PlatformName, StepOutcome, StepState
from upsguard.plugins import catalog
from upsguard.runbooks.planner import Planner

WANTED = {"noout", "norebalance", "nobackfill", "norecover"}
WAIT_S = 60.0
"""A bound on the wait for the step's end, never a measure of it."""


def site_of(pve_api: PveApi, tmp_path: Path, timeout: str) -> SiteConfig:
    """One PVE cluster's Ceph flags as a site's only resource; ``timeout`` bounds its startup
    step (its health timeout)."""
    resource = {
        "id": "pve-ceph",
        "kind": "cluster",
        "cluster": "ceph_flags",
        "platform": "pve",
        "health": {"timeout": timeout},
    }
    return site_from(
        tmp_path,
        {
            "site": "pve",
            "ups": [{"name": "ups1", "simulated": {}}],
            "platforms": {"pve": settings(pve_api, tmp_path)},
            "resources": [resource],
        },
    )


def settings(pve_api: PveApi, tmp_path: Path) -> dict[str, Any]:
    return settings_of(pve_api, tmp_path, state_dir=str(tmp_path / "state"), poll_interval="0.5s")


def platform(pve_api: PveApi, tmp_path: Path) -> Any:
    """The platform as a service builds it: each run here gets a new one, as a restarted
    service would, and finds what the shutdown recorded in ``state_dir``."""
    validated = ProxmoxSettings.model_validate(settings(pve_api, tmp_path))
    return catalog.load("platform", "proxmox")(PlatformName("pve"), validated, SystemClock())


async def run(site: SiteConfig, direction: str, px: Any) -> StepOutcome:
    """The site's ``direction`` run through the executor; its Ceph step's outcome."""
    events: list[Event] = []
    plan = Planner(site).plan(direction)
    executor = executor_for(plan, {PlatformName("pve"): px}, SystemClock(), events.append)
    result = await executor.run()
    step = "stop:pve-ceph" if direction == "shutdown" else "start:pve-ceph"
    return outcomes_by_step(result)[step]


async def flags_at(ceph: CephMonitor) -> set[str]:
    """The flags as the real monitor keeps them (the CLI runs beside the step's loop)."""
    return (await asyncio.to_thread(ceph.flags)) & SETTABLE


def test_the_flags_wait_for_every_osd_in_to_be_up_and_then_only_upsguards_go(
    pve_api: PveApi, ceph_osds: CephMonitor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a shutdown that set the flags (an operator's noout was set before), the startup
    finds the three OSDs down: the step waits and says so, the flags stay set at the
    monitor; two OSDs up: it still waits, and says two of three; the third up: the flags
    upsguard set are unset, the operator's noout stays."""
    caplog.set_level(logging.INFO, logger=PLATFORM_LOG)
    pve_api.pve.ceph = ceph_osds
    ceph_osds.set_flag("noout", True)
    site = site_of(pve_api, tmp_path, timeout="10m")

    async def scenario() -> tuple[StepOutcome, StepOutcome]:
        shutdown = await run(site, "shutdown", platform(pve_api, tmp_path))
        assert await flags_at(ceph_osds) == WANTED
        startup = asyncio.create_task(run(site, "startup", platform(pve_api, tmp_path)))
        await platform_said(caplog, "(Ceph: 0 of 3 OSDs up)")
        assert await flags_at(ceph_osds) == WANTED
        await asyncio.to_thread(ceph_osds.start_osds, 0, 1)
        await platform_said(caplog, "(Ceph: 2 of 3 OSDs up)")
        assert await flags_at(ceph_osds) == WANTED
        assert not startup.done()
        await asyncio.to_thread(ceph_osds.start_osds, 2)
        async with asyncio.timeout(WAIT_S):
            return shutdown, await startup

    shutdown, startup = asyncio.run(scenario())
    assert shutdown.state is StepState.DONE
    assert (startup.state, startup.detail) == (StepState.DONE, "Ceph flags of pve up")
    assert ceph_osds.flags() & SETTABLE == {"noout"}
    unsets = [c for c in pve_api.pve.calls if c == "PUT cluster/ceph/flags"]
    assert len(unsets) == 2  # the shutdown's set, the startup's unset: once, at the end


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ({"ceph_status_error": "got timeout"}, "Ceph unknown: read Ceph's status failed: "),
        (
            {"ceph_status_garbage": {"health": {"status": "HEALTH_OK"}}},
            "Ceph's status unknown: no monmap.mons",
        ),
    ],
    ids=["error", "garbage"],
)
def test_a_ceph_status_that_cannot_be_read_is_unknown_and_the_flags_stay_set(
    pve_api: PveApi, ceph_osds: CephMonitor, tmp_path: Path, fault: dict[str, Any], why: str
) -> None:
    """Every OSD up, but Ceph's status unread (PVE answers an error, or data without the
    fields): unknown, never "all up". The step never unsets, and fails at its timeout naming
    what it could not read."""
    pve_api.pve.ceph = ceph_osds
    ceph_osds.start_osds()
    site = site_of(pve_api, tmp_path, timeout="2s")

    async def scenario() -> StepOutcome:
        await run(site, "shutdown", platform(pve_api, tmp_path))
        for name, value in fault.items():
            setattr(pve_api.pve, name, value)
        return await run(site, "startup", platform(pve_api, tmp_path))

    startup = asyncio.run(scenario())
    assert startup.state is StepState.FAILED
    assert f"Ceph flags not unset after 2s: {why}" in startup.detail
    assert ceph_osds.flags() & SETTABLE == WANTED
    assert [c for c in pve_api.pve.calls if c == "PUT cluster/ceph/flags"] == [
        "PUT cluster/ceph/flags"  # the shutdown's, and no other
    ]
