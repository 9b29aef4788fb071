"""Every built-in cache provider (but the simulated one) keeps the CacheProvider contract."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from upsguard.clock import SystemClock
from upsguard.config.caches import CacheConfig
from upsguard.errors import PermanentError
from upsguard.models import CacheMode, CacheName, CacheTarget
from upsguard.plugins import catalog
from upsguard.plugins.caches.base import CacheProvider

MISSING = "/nonexistent/upsguard-test-tool"
SETTINGS: dict[str, dict[str, Any]] = {
    "bcache": {"sysfs_root": "/nonexistent"},
    "lvmcache": {"lvs_command": MISSING, "lvchange_command": MISSING, "dmsetup_command": MISSING},
    "writecache": {"dmsetup_command": MISSING},
    "opencas": {"casadm_command": MISSING},
    "storcli": {"storcli_command": MISSING},
    "fvp": {"pwsh_command": MISSING},
    "command": {
        "read_mode": f"{MISSING} mode",
        "set_write_through": f"{MISSING} wt",
        "set_write_back": f"{MISSING} wb",
        "read_dirty_bytes": f"{MISSING} dirty",
    },
}


def build(provider: str, tmp_path: Path) -> Any:
    target = {"storcli": "v1", "opencas": "cache1"}.get(provider, "t1")
    data = {"name": "c1", "provider": provider, "targets": [target], **SETTINGS[provider]}
    if provider in ("bcache", "fvp"):
        data["state_dir"] = str(tmp_path)
    settings = TypeAdapter(CacheConfig).validate_python(data)
    return catalog.load("cache", provider)(settings, SystemClock())


@pytest.mark.parametrize("provider", sorted(SETTINGS))
def test_implements_the_protocol_with_async_methods(provider: str, tmp_path: Path) -> None:
    instance = build(provider, tmp_path)
    assert isinstance(instance, CacheProvider)
    assert instance.name == "c1"
    for method in ("targets", "read", "set_mode", "flush", "close"):
        assert inspect.iscoroutinefunction(getattr(instance, method)), method


@pytest.mark.parametrize("provider", sorted(SETTINGS))
def test_a_missing_tool_or_device_is_a_permanent_error_naming_the_cache(
    provider: str, tmp_path: Path
) -> None:
    instance = build(provider, tmp_path)

    async def scenario() -> None:
        try:
            [target] = await instance.targets()  # as listed in the settings
            await instance.read(target)
        finally:
            await instance.close()

    with pytest.raises(PermanentError) as caught:
        asyncio.run(scenario())
    message = str(caught.value)
    assert "c1" in message or MISSING in message
    assert "\n" not in message


@pytest.mark.parametrize("provider", sorted(SETTINGS))
def test_an_unsupported_mode_is_refused(provider: str, tmp_path: Path) -> None:
    instance = build(provider, tmp_path)
    target = CacheTarget(CacheName("c1"), "v1")
    with pytest.raises(PermanentError):
        asyncio.run(instance.set_mode(target, CacheMode.UNKNOWN))
