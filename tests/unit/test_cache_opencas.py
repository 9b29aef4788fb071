"""Open CAS provider against a fake ``casadm`` printing its CSV formats (both header cases)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.caches.tools import FakeTools
from upsguard.clock import SystemClock
from upsguard.config.caches import OpencasSettings
from upsguard.errors import PermanentError, TemporaryError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.opencas import INTERRUPT_S, OpencasProvider


def cas(cid: int, dirty: int, policy: str = "wb", rate: float = 30000.0) -> dict[str, object]:
    return {
        "kind": "opencas", "id": cid, "disk": f"/dev/nvme{cid}n1", "core": f"/dev/sd{cid}",
        "policy": policy, "size_blocks": 1000000, "dirty": dirty, "rate": rate,
        "draining": False, "accepting": policy == "wb",
    }  # fmt: skip


def make(
    tmp_path: Path,
    old_headers: bool = False,
    clock: float | None = None,
    interrupt_s: float = INTERRUPT_S,
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
    return tools, OpencasProvider(settings, SystemClock(), interrupt_s=interrupt_s)


def target(name: str = "cache1") -> CacheTarget:
    return CacheTarget(CacheName("cas"), name)


#: How long a test reads a cache for a state before it fails: a read takes a fraction of a
#: second even on a busy machine, a flush on the tools' own clock none at all.
WAIT_S = 30.0


async def read_until(
    p: OpencasProvider, done: Callable[[CacheState], bool], what: str
) -> CacheState:
    """Read ``cache1`` until ``done``. Bounded: a flush gone wrong fails the test, naming
    what it waited for and what it read last, instead of hanging it to the suite's timeout."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not done(state := await p.read(target())):
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{what}: not read within {WAIT_S:g}s; last read: {state}")
        await asyncio.sleep(0.05)
    return state


def flushing(state: CacheState) -> bool:
    return state.detail.startswith("status Flushing (")


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

    async def scenario() -> tuple[CacheState, CacheState, CacheState]:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        started = await read_until(p, flushing, "the flush")
        tools.advance(1.0)  # 30,000 blocks a second of 90,000: a third is written back
        halfway = await read_until(p, lambda s: (s.dirty_bytes or 0) < 90000 * 4096, "progress")
        tools.advance(60.0)
        # clean is the cache's own word; casadm's exit may be reported a moment later
        return started, halfway, await read_until(p, lambda s: s.clean, "clean")

    started, halfway, done = asyncio.run(scenario())
    assert started.detail == "status Flushing (0.0 %); casadm flushing"
    assert not started.clean and started.mode is CacheMode.WRITE_BACK
    assert halfway.dirty_bytes == 60000 * 4096 and not halfway.clean
    assert done.clean and done.mode is CacheMode.WRITE_THROUGH
    assert done.detail.startswith("status Running; casadm ")
    assert tools.device("1")["policy"] == "wt"


def test_write_back_interrupts_a_flush(tmp_path: Path) -> None:
    """The flush is seen under way (on the tools' own clock, which stands still) before the
    write-back comes: it once slept 0.6 s instead, and a busy machine read it otherwise."""
    _, p = make(tmp_path, clock=0.0)

    async def scenario() -> CacheState:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        await read_until(p, flushing, "the flush")
        await p.set_mode(target(), CacheMode.WRITE_BACK)
        return await p.read(target())

    state = asyncio.run(scenario())
    assert state.mode is CacheMode.WRITE_BACK and state.detail == "status Running"


def test_write_back_interrupts_its_own_flush_not_another_casadm_of_the_same_cache_id(
    tmp_path: Path,
) -> None:
    """Another ``casadm -Q -i 1 -c wt`` on the machine (here a second fake with its own
    state, as another test runs one beside this) is not this provider's to interrupt: its
    flush goes on. Interrupted, it would leave its cache dirty in write-back, and whoever
    waited for it clean would wait for ever."""
    tools, p = make(tmp_path / "this", clock=0.0)
    _, other = make(tmp_path / "other", clock=0.0)

    async def scenario() -> CacheState:
        await other.set_mode(target(), CacheMode.WRITE_THROUGH)
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        await read_until(p, flushing, "this provider's flush")
        try:
            await p.set_mode(target(), CacheMode.WRITE_BACK)
            return await other.read(target())
        finally:
            await other.set_mode(target(), CacheMode.WRITE_BACK)  # no fake left running

    left = asyncio.run(scenario())
    assert left.detail == "status Flushing (0.0 %); casadm flushing"
    assert (asyncio.run(p.read(target()))).detail == "status Running"
    assert tools.device("1")["policy"] == "wb"


def test_a_flush_that_does_not_stop_when_interrupted_is_a_temporary_error(
    tmp_path: Path,
) -> None:
    """Write-back while a switch to write-through will not end: an error to try again, never
    a wait without end, nor a success that the switch would undo once its flush is done."""
    tools, p = make(tmp_path, clock=0.0, interrupt_s=0.5)
    data = tools.read()
    data["devices"]["1"]["deaf"] = True
    tools.write(data)

    async def scenario() -> None:
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        await read_until(p, flushing, "the flush")
        try:
            await p.set_mode(target(), CacheMode.WRITE_BACK)
        finally:
            tools.advance(60.0)  # the flush ends: no fake left running
            await read_until(p, lambda s: s.clean, "clean")

    with pytest.raises(TemporaryError, match=r"cache 'cas' cache1: casadm -Q still flushing "):
        asyncio.run(scenario())


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
