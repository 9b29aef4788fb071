"""dm-writecache devices, through ``dmsetup`` (kernel device-mapper/writecache.rst).

The trap: dm-writecache has no write-through mode. Every block it holds is dirty (it caches
writes only), and its draining mode is ``cleaner``: new writes go around the cache and it
writes back everything it holds. On this kernel (docs/real-kernel-caches.md) neither way of
setting it is enough alone: the ``cleaner`` message starts the drain but leaves no trace in
``dmsetup table`` (so nobody, upsguard after a restart included, could tell the cache is
draining), and ``cleaner`` in the table shows but does not start it. So ``write-through``
here reloads the table with ``cleaner`` added, then sends the message. The mode reads
``cleaner`` from the table; dirty bytes are (blocks - free blocks) x block size from ``dmsetup
status``; the cache is clean when no block is cached or under writeback while cleaner is on.
Going back to write-back reloads the user's table, without ``cleaner``. ``flush`` sends the
``flush`` message, which commits the cache's metadata (it does not destage).

Targets are device-mapper names (``vg-lv``); an LVM name ``vg/lv`` is accepted and mapped the
way LVM names its devices (hyphens doubled).
"""

from __future__ import annotations

import shlex

from upsguard.clock import Clock
from upsguard.config.caches import WritecacheSettings
from upsguard.errors import PermanentError, TemporaryError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import may_flip, require_targets
from upsguard.plugins.devmapper import dmsetup
from upsguard.plugins.remote import Runner

TIMEOUT = 30.0
_FIXED_TABLE_WORDS = 8  # start length writecache p|s origin cache block_size n_opts


def parse_status(line: str) -> tuple[int, int, int, int]:
    """(error, blocks, free blocks, blocks under writeback) from a status line."""
    words = line.split()
    if len(words) < 7 or words[2] != "writecache":
        raise TemporaryError(f"not a dm-writecache status line: {line.strip()[:80]!r}")
    error, blocks, free, writeback = (int(w) for w in words[3:7])
    return error, blocks, free, writeback


def parse_table(line: str) -> tuple[list[str], list[str]]:
    """(fixed words, optional words) of a dm-writecache table line."""
    words = line.split()
    if len(words) < _FIXED_TABLE_WORDS or words[2] != "writecache":
        raise TemporaryError(f"not a dm-writecache table line: {line.strip()[:80]!r}")
    count = int(words[_FIXED_TABLE_WORDS - 1])
    return words[: _FIXED_TABLE_WORDS - 1], words[_FIXED_TABLE_WORDS : _FIXED_TABLE_WORDS + count]


class WritecacheProvider:
    """One ``caches:`` entry of provider ``writecache``."""

    def __init__(self, settings: WritecacheSettings, clock: Clock) -> None:
        self.name: CacheName = settings.name
        self._settings = settings
        self._clock = clock
        self._runner = Runner(settings.ssh)
        self._dmsetup = shlex.split(settings.dmsetup_command)

    async def targets(self) -> list[CacheTarget]:
        if self._settings.targets:
            return [CacheTarget(self.name, name) for name in self._settings.targets]
        out = await self._dm(None, "status", "--target", "writecache")
        names = [line.split(":", 1)[0] for line in out.splitlines() if ":" in line]
        found = [CacheTarget(self.name, name) for name in names]
        return require_targets(found, f"cache '{self.name}': dmsetup reports no writecache device")

    async def read(self, target: CacheTarget) -> CacheState:
        error, blocks, free, writeback = parse_status(await self._dm(target, "status"))
        fixed, options = parse_table(await self._dm(target, "table"))
        block_size = int(fixed[6])
        dirty = (blocks - free) * block_size
        mode = CacheMode.CLEANER if "cleaner" in options else CacheMode.WRITE_BACK
        clean = dirty == 0 and mode is CacheMode.CLEANER and error == 0
        detail = f"{blocks - free} of {blocks} blocks cached, {writeback} under writeback"
        if error:
            detail = f"device error {error}: the cache device failed; " + detail
        return CacheState(target, self._clock.now(), mode, dirty, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        if mode in (CacheMode.WRITE_THROUGH, CacheMode.CLEANER):
            await self._clean(target)
        elif mode is CacheMode.WRITE_BACK:
            await self._leave_cleaner(target)
        else:
            raise PermanentError(f"{self._where(target)}: dm-writecache has no mode '{mode}'")

    async def flush(self, target: CacheTarget) -> None:
        await self._dm(target, "message", "0", "flush")

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """``CacheDiagnosis``: dmsetup is there, run as root."""
        return [await may_flip(self.name, self._runner, programs=[self._dmsetup[0]], root=True)]

    async def close(self) -> None:
        await self._runner.close()

    async def _clean(self, target: CacheTarget) -> None:
        """``cleaner`` in the table, so that it shows, then the message, which drains. Both
        are idempotent: a flip that was cut short is finished by the next one."""
        fixed, options = parse_table(await self._dm(target, "table"))
        if "cleaner" not in options:
            await self._load(target, fixed, [*options, "cleaner"])
        await self._dm(target, "message", "0", "cleaner")

    async def _leave_cleaner(self, target: CacheTarget) -> None:
        """Reload the same table without ``cleaner``: the message has no opposite."""
        fixed, options = parse_table(await self._dm(target, "table"))
        if "cleaner" in options:
            await self._load(target, fixed, [word for word in options if word != "cleaner"])

    async def _load(self, target: CacheTarget, fixed: list[str], options: list[str]) -> None:
        """Load a new table and swap it in (``resume`` suspends the device around the swap)."""
        await self._dm(target, "reload", "--table", " ".join([*fixed, str(len(options)), *options]))
        await self._dm(target, "resume")

    async def _dm(self, target: CacheTarget | None, command: str, *args: str) -> str:
        where = self._where(target) if target else f"cache '{self.name}'"
        name = target.name if target is not None else None
        return await dmsetup(
            self._runner, self._dmsetup, command, name, *args, where=where, timeout=TIMEOUT
        )

    def _where(self, target: CacheTarget) -> str:
        host = f"{self._settings.ssh.host}:" if self._settings.ssh else ""
        return f"cache '{self.name}' {host}{target.name}"
