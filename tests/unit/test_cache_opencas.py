"""Open CAS provider against a fake ``casadm`` printing its CSV formats (both header cases)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.caches.tools import FakeTools
from upsguard.clock import SystemClock
from upsguard.config.caches import OpencasSettings
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.opencas import OpencasProvider


def cas(cid: int, dirty: int, policy: str = "wb", rate: float = 30000.0) -> dict[str, object]:
    return {
        "kind": "opencas", "id": cid, "disk": f"/dev/nvme{cid}n1", "core": f"/dev/sd{cid}",
        "policy": policy, "size_blocks": 1000000, "dirty": dirty, "rate": rate,
        "draining": False, "accepting": policy == "wb",
    }  # fmt: skip


def make(
    tmp_path: Path, old_headers: bool = False, clock: float | None = None
) -> tuple[FakeTools, OpencasProvider]:
    devices = {"1": cas(1, 90000), "2": cas(2, 0, "wt")}
    tools = FakeTools(tmp_path / "bin", devices, clock=clock)
    if old_headers:
        data = tools.read()
        data["old_headers"] = True
        tools.write(data)
    settings = OpencasSettings.model_validate(
        {
            "name": "cas",
            "provider": "opencas",
            "casadm_command": tools.path("casadm"),
            "job_log_dir": str(tmp_path),
        }
    )
    return tools, OpencasProvider(settings, SystemClock())


def target(name: str = "cache1") -> CacheTarget:
    return CacheTarget(CacheName("cas"), name)


@pytest.mark.parametrize("old_headers", [False, True], ids=["Blocks]", "blocks]"])
def test_lists_caches_and_reads_dirty_blocks(tmp_path: Path, old_headers: bool) -> None:
    _, p = make(tmp_path, old_headers)

    async def scenario() -> tuple[list[CacheTarget], CacheState, CacheState]:
        return await p.targets(), await p.read(target()), await p.read(target("cache2"))

    found, dirty, clean = asyncio.run(scenario())
    assert [t.name for t in found] == ["cache1", "cache2"]
    assert dirty.mode is CacheMode.WRITE_BACK and dirty.dirty_bytes == 90000 * 4096
    assert not dirty.clean and dirty.detail == "status Running"
    assert clean.clean and clean.mode is CacheMode.WRITE_THROUGH


def test_write_through_flushes_in_the_background_with_progress(tmp_path: Path) -> None:
    """The drain runs on the tools' own clock: the test moves it once it has seen the flush."""
    tools, p = make(tmp_path, clock=0.0)

    async def read_until(done: Callable[[CacheState], bool]) -> CacheState:
        while not done(state := await p.read(target())):
            await asyncio.sleep(0.05)
        return state

    async def scenario() -> tuple[CacheState, CacheState, CacheState]:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        flushing = await read_until(lambda s: s.detail.startswith("status Flushing ("))
        tools.advance(1.0)  # 30,000 blocks a second of 90,000: a third is written back
        halfway = await read_until(lambda s: (s.dirty_bytes or 0) < 90000 * 4096)
        tools.advance(60.0)
        # clean is the cache's own word; casadm's exit may be reported a moment later
        return flushing, halfway, await read_until(lambda s: s.clean)

    flushing, halfway, done = asyncio.run(scenario())
    assert flushing.detail == "status Flushing (0.0 %); casadm flushing"
    assert not flushing.clean and flushing.mode is CacheMode.WRITE_BACK
    assert halfway.dirty_bytes == 60000 * 4096 and not halfway.clean
    assert done.clean and done.mode is CacheMode.WRITE_THROUGH
    assert done.detail.startswith("status Running; casadm ")
    assert tools.device("1")["policy"] == "wt"


def test_write_back_interrupts_a_flush(tmp_path: Path) -> None:
    tools, p = make(tmp_path)
    data = tools.read()
    data["devices"]["1"]["rate"] = 100.0
    tools.write(data)

    async def scenario() -> CacheState:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        await asyncio.sleep(0.6)
        await p.set_mode(target(), CacheMode.WRITE_BACK)
        return await p.read(target())

    state = asyncio.run(scenario())
    assert state.mode is CacheMode.WRITE_BACK and state.detail == "status Running"


def test_a_cache_that_is_not_running_is_named(tmp_path: Path) -> None:
    _, p = make(tmp_path)
    with pytest.raises(PermanentError, match=r"cache 'cas' cache9: casadm -P: Cache 9 is not"):
        asyncio.run(p.read(target("cache9")))


def test_setting_the_current_mode_again_does_nothing(tmp_path: Path) -> None:
    _, p = make(tmp_path)
    asyncio.run(p.set_mode(target("cache2"), CacheMode.WRITE_THROUGH))
    assert asyncio.run(p.read(target("cache2"))).detail == "status Running"


def test_finding_no_cache_at_all_is_an_error_not_all_clean(tmp_path: Path) -> None:
    tools, p = make(tmp_path)
    tools.write({"devices": {}, "calls": {}})
    with pytest.raises(PermanentError, match=r"cache 'cas': casadm lists no running cache"):
        asyncio.run(p.targets())
