"""Open CAS provider against a fake ``casadm`` printing its CSV formats (both header cases)."""

from __future__ import annotations

import asyncio
import time
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


def make(tmp_path: Path, old_headers: bool = False) -> tuple[FakeTools, OpencasProvider]:
    tools = FakeTools(tmp_path / "bin", {"1": cas(1, 90000), "2": cas(2, 0, "wt")})
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
    tools, p = make(tmp_path)

    async def scenario() -> list[CacheState]:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        seen = [await p.read(target())]
        deadline = time.monotonic() + 30
        while not seen[-1].clean and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            seen.append(await p.read(target()))
        return seen

    seen = asyncio.run(scenario())
    flushing = [s for s in seen if s.detail.startswith("status Flushing (")]
    assert flushing and "casadm flushing" in flushing[0].detail
    assert seen[-1].clean and seen[-1].mode is CacheMode.WRITE_THROUGH
    assert seen[-1].detail == "status Running; casadm done"
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
