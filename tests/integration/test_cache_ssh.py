"""Cache providers on a remote host: a real sshd on loopback, host keys checked.

The "remote" host is this machine through Debian's sshd. The providers' work over SSH on
real caches is tested against the QEMU guest's kernel (tests/integration/test_guest_caches.py);
here, what an SSH endpoint that cannot be trusted does to a provider.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.peers.sshd import Sshd
from upsguard.clock import SystemClock
from upsguard.config.caches import BcacheSettings
from upsguard.errors import PermanentError
from upsguard.plugins.caches.bcache import BcacheProvider

pytestmark = pytest.mark.sshd


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


def test_host_key_mismatch_is_refused_by_the_provider(sshd: Sshd, tmp_path: Path) -> None:
    settings = bcache_settings(sshd, tmp_path, known_hosts=sshd.wrong_known_hosts)
    provider = BcacheProvider(settings, SystemClock())
    with pytest.raises(PermanentError, match=r"host key does not match"):
        asyncio.run(provider.targets())
