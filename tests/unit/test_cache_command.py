"""The ``command`` provider: the site file's shell commands around a fake vendor CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixtures.caches.tools import FakeTools
from upsguard.clock import SystemClock
from upsguard.config.caches import CommandCacheSettings
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.command import CommandCacheProvider, parse_mode


def make(tmp_path: Path, **override: str) -> tuple[FakeTools, CommandCacheProvider]:
    tools = FakeTools(
        tmp_path / "bin",
        {
            "nvram": {"dirty": 50_000_000, "rate": 40_000_000.0, "accepting": True},
            "broken": {"dirty": 0, "rate": 1.0, "accepting": True},
        },
        clock=0.0,
    )
    cli = tools.path("fakecache")
    settings = CommandCacheSettings.model_validate(
        {
            "name": "vendor",
            "provider": "command",
            "targets": ["nvram"],
            "read_mode": f"{cli} mode {{target}}",
            "set_write_through": f"{cli} set {{target}} wt",
            "set_write_back": f"{cli} set {{target}} wb",
            "read_dirty_bytes": f"{cli} dirty {{target}}",
            "flush": f"{cli} flush {{target}}",
            **override,
        }
    )
    return tools, CommandCacheProvider(settings, SystemClock())


def target(name: str = "nvram") -> CacheTarget:
    return CacheTarget(CacheName("vendor"), name)


def test_mode_words() -> None:
    words = ["write-back", "WriteBack", "wb", "writethrough", "WT", "none", "bogus"]
    assert [parse_mode(w) for w in words] == [
        CacheMode.WRITE_BACK,
        CacheMode.WRITE_BACK,
        CacheMode.WRITE_BACK,
        CacheMode.WRITE_THROUGH,
        CacheMode.WRITE_THROUGH,
        CacheMode.NONE,
        CacheMode.UNKNOWN,
    ]


def test_write_through_drains_to_clean_and_back(tmp_path: Path) -> None:
    tools, p = make(tmp_path)

    async def scenario() -> tuple[CacheState, list[CacheState], CacheState]:
        first = await p.read(target())
        await p.set_mode(target(), CacheMode.WRITE_THROUGH)
        seen = [await p.read(target())]
        for _ in range(3):  # 40 MB/s: 50 MB drain in 1.25 s of the fake clock
            tools.advance(0.5)
            seen.append(await p.read(target()))
        await p.set_mode(target(), CacheMode.WRITE_BACK)
        return first, seen, await p.read(target())

    first, seen, back = asyncio.run(scenario())
    assert first.mode is CacheMode.WRITE_BACK and first.dirty_bytes == 50_000_000
    assert [s.dirty_bytes for s in seen] == [50_000_000, 30_000_000, 10_000_000, 0]
    assert [s.clean for s in seen] == [False, False, False, True]
    assert back.mode is CacheMode.WRITE_BACK and not back.clean


def test_a_failing_command_is_reported_with_its_output(tmp_path: Path) -> None:
    _, p = make(tmp_path, read_mode="echo 'controller offline' >&2; exit 3")
    with pytest.raises(PermanentError, match=r"read_mode failed \(exit status 3\): controller"):
        asyncio.run(p.read(target()))


def test_a_failing_dirty_command_is_named_as_such(tmp_path: Path) -> None:
    _, p = make(tmp_path, read_dirty_bytes="echo 'no counter' >&2; exit 4")
    with pytest.raises(PermanentError, match=r"read_dirty_bytes failed \(exit status 4\): no"):
        asyncio.run(p.read(target()))


def test_a_mode_it_cannot_read_is_never_clean_even_with_nothing_dirty(tmp_path: Path) -> None:
    """A vendor CLI that words its mode otherwise ("Write-Back (forced)") reads unknown: the
    cache may still take writes into the cache, so no dirty bytes now is no proof of clean."""
    _, p = make(tmp_path, read_mode="echo 'Write-Back (forced)'")
    state = asyncio.run(p.read(target("broken")))
    assert state.mode is CacheMode.UNKNOWN and state.dirty_bytes == 0
    assert not state.clean


def test_only_a_mode_read_as_taking_no_writes_into_the_cache_can_be_clean() -> None:
    safe = {m for m in CacheMode if m.holds_no_new_writes}
    assert safe == {
        CacheMode.WRITE_THROUGH,
        CacheMode.WRITE_AROUND,
        CacheMode.CLEANER,
        CacheMode.NONE,
    }
