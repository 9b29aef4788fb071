"""``dmsetup`` for the device-mapper caches (dm-writecache, dm-cache under LVM).

``dmsetup status`` and ``dmsetup table`` answer at once whatever else runs: they take no
LVM lock, so they are where a provider reads a cache's progress while an ``lvchange`` holds
its volume group (docs/real-kernel-caches.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from upsguard.errors import PermanentError
from upsguard.plugins.remote import Runner

__all__ = ["dm_name", "dmsetup"]


def dm_name(name: str) -> str:
    """LVM's device-mapper name for ``vg/lv``: ``vg-lv``, hyphens inside doubled; any other
    name is a device-mapper name already."""
    if "/" not in name:
        return name
    vg, lv = name.split("/", 1)
    return f"{vg.replace('-', '--')}-{lv.replace('-', '--')}"


async def dmsetup(
    runner: Runner,
    program: Sequence[str],
    command: str,
    device: str | None,
    *args: str,
    where: str,
    timeout: float,
) -> str:
    """``dmsetup COMMAND [DEVICE] ARGS...``; its stdout, or ``PermanentError`` naming ``where``
    and dmsetup's own first line (``Device vg-lv not found``)."""
    argv = [*program, command, *([dm_name(device)] if device is not None else []), *args]
    result = await runner.run(argv, timeout=timeout)
    if not result.ok:
        raise PermanentError(f"{where}: dmsetup {command}: {result.first_error_line()}")
    return result.stdout
