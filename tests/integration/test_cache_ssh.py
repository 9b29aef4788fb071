"""Cache providers on a remote host: a real sshd on loopback, host keys checked.

The "remote" host is this machine through Debian's sshd, so the providers read the
fake sysfs tree and run the fake tools over SSH exactly as they would on a NAS.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.fixtures.caches.fake_bcache import Device, FakeBcacheSysfs
from tests.peers.sshd import Sshd
from upsguard.clock import SystemClock
from upsguard.config.caches import BcacheSettings
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheState, CacheTarget
from upsguard.plugins.caches.base import CacheProvider
from upsguard.plugins.caches.bcache import BcacheProvider

pytestmark = pytest.mark.sshd
MiB = 1024 * 1024


async def until_clean(p: CacheProvider, target: CacheTarget, limit: float) -> list[CacheState]:
    seen = [await p.read(target)]
    deadline = time.monotonic() + limit
    while not seen[-1].clean and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        seen.append(await p.read(target))
    return seen


def bcache_settings(sshd: Sshd, tmp_path: Path, known_hosts: Path | None = None) -> BcacheSettings:
    return BcacheSettings.model_validate(
        {
            "name": "nas-ssd",
            "provider": "bcache",
            "ssh": sshd.settings_dict(known_hosts),
            "sysfs_root": str(tmp_path / "sys"),
            "state_dir": str(tmp_path / "state"),
        }
    )


def test_bcache_over_ssh_destages_and_restores_settings(sshd: Sshd, tmp_path: Path) -> None:
    with FakeBcacheSysfs(tmp_path / "sys", {"bcache0": Device(dirty=300 * MiB)}) as sysfs:
        provider = BcacheProvider(bcache_settings(sshd, tmp_path), SystemClock())

        async def scenario() -> tuple[list[CacheTarget], list[CacheState]]:
            try:
                found = await provider.targets()
                await provider.set_mode(found[0], CacheMode.WRITE_THROUGH)
                return found, await until_clean(provider, found[0], limit=30)
            finally:
                await provider.close()

        found, seen = asyncio.run(scenario())
        assert [t.name for t in found] == ["bcache0"]
        assert seen[-1].clean and seen[-1].mode is CacheMode.WRITE_THROUGH
        assert sysfs.attr("bcache0", "writeback_percent") == "10"


def test_host_key_mismatch_is_refused_by_the_provider(sshd: Sshd, tmp_path: Path) -> None:
    settings = bcache_settings(sshd, tmp_path, known_hosts=sshd.wrong_known_hosts)
    provider = BcacheProvider(settings, SystemClock())
    with pytest.raises(PermanentError, match=r"host key does not match"):
        asyncio.run(provider.targets())
