"""bcache backing devices, through sysfs (``/sys/block/bcacheN/bcache/``).

Formats (kernel Documentation/admin-guide/bcache.rst, drivers/md/bcache/sysfs.c):
``cache_mode`` reads ``writethrough [writeback] writearound none`` (the current
mode in brackets); ``dirty_data`` is ``bch_hprint`` output such as ``0.0k`` or
``1.2G`` (one decimal, powers of 1024); ``state`` is ``no cache``, ``clean``,
``dirty`` or ``inconsistent``, and reads ``clean`` a moment before ``dirty_data``
does (docs/real-kernel-caches.md): the device is clean when both say so.

The trap: switching to writethrough does not hurry the destage. While
``writeback_percent`` is non-zero the writeback rate controller aims to keep
that share of the cache dirty and, below it, trickles at a few KiB/s; and
``writeback_delay`` holds writeback back for 30 s by default. So going to
write-through also sets both to 0 (and ``writeback_running`` to 1) and saves
the user's values in a small state file. A ``writeback_delay`` sleep the writeback
thread has already begun is not cut short (the kernel offers no way), so the drain
may start up to the user's ``writeback_delay`` after the flip. The saved values
are put back once the device is clean, or when write-back is restored, whichever
comes first. The state file lets ``upsguard cache set`` and a later ``upsguard
cache wait`` (another process) restore them too.
"""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path, PurePosixPath

from upsguard.clock import Clock
from upsguard.config.caches import BcacheSettings
from upsguard.errors import PermanentError, TemporaryError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import may_flip, require_targets
from upsguard.plugins.remote import Runner
from upsguard.saved_state import SavedState

log = logging.getLogger(__name__)

TIMEOUT = 20.0
#: What the provider changes while destaging, and the value it sets; the user's
#: values are saved first and put back afterwards.
DESTAGE_KNOBS = {"writeback_percent": "0", "writeback_delay": "0", "writeback_running": "1"}
_MODES = {
    "writeback": CacheMode.WRITE_BACK,
    "writethrough": CacheMode.WRITE_THROUGH,
    "writearound": CacheMode.WRITE_AROUND,
    "none": CacheMode.NONE,
}
_SYSFS_MODE = {mode: word for word, mode in _MODES.items()}
_HPRINT = re.compile(r"^(-?\d+(?:\.\d+)?)([kMGTPEZY]?)$")
_UNITS = "kMGTPEZY"


def parse_hprint(text: str) -> int:
    """Bytes from ``bch_hprint`` output: ``0.0k``, ``512.0k``, ``1.2G`` (powers of 1024)."""
    match = _HPRINT.match(text.strip())
    if match is None:
        raise ValueError(f"not a bcache size: {text.strip()!r}")
    number, unit = match.groups()
    power = _UNITS.index(unit) + 1 if unit else 0
    return round(float(number) * (1 << (10 * power)))


def parse_cache_mode(text: str) -> CacheMode:
    """The bracketed word of ``writethrough [writeback] writearound none``."""
    match = re.search(r"\[(\w+)\]", text)
    word = match.group(1) if match else text.strip()
    return _MODES.get(word, CacheMode.UNKNOWN)


class BcacheProvider:
    """One ``caches:`` entry of provider ``bcache``: every bcacheN device, or those listed."""

    def __init__(self, settings: BcacheSettings, clock: Clock) -> None:
        self.name: CacheName = settings.name
        self._settings = settings
        self._clock = clock
        self._runner = Runner(settings.ssh)
        self._root = PurePosixPath(settings.sysfs_root)
        self._saved: SavedState[dict[str, str]] = SavedState(
            settings.state_dir / f"{settings.name}.bcache.json", "saved bcache settings"
        )

    async def targets(self) -> list[CacheTarget]:
        if self._settings.targets:
            return [CacheTarget(self.name, name) for name in self._settings.targets]
        found = [CacheTarget(self.name, name) for name in await self._list_devices()]
        return require_targets(
            found, f"cache '{self.name}': no bcache device under {self._root}/block"
        )

    async def read(self, target: CacheTarget) -> CacheState:
        mode_text, state, dirty_text = await self._get_many(
            target, "cache_mode", "state", "dirty_data"
        )
        mode = parse_cache_mode(mode_text)
        state, dirty_text = state.strip(), dirty_text.strip()
        try:
            dirty = parse_hprint(dirty_text)
        except ValueError as exc:
            raise TemporaryError(f"{self._where(target)}: dirty_data: {exc}") from exc
        # `state` turns `clean` while the last extents are still being written back (seen with
        # megabytes left): only dirty_data at zero is clean.
        clean = state in ("clean", "no cache") and dirty == 0
        if clean and self._saved.has(target.name):
            await self._restore_knobs(target)
        detail = f"state {state}"
        if state == "inconsistent":
            detail += ": the backing device was run without its cache; data may be lost"
        elif not clean and self._saved.has(target.name):
            detail += ", destaging at full speed (writeback_percent 0)"
        return CacheState(target, self._clock.now(), mode, dirty, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        if mode not in _SYSFS_MODE:
            raise PermanentError(f"{self._where(target)}: bcache has no mode '{mode}'")
        await self._put(target, "cache_mode", _SYSFS_MODE[mode])
        if mode is CacheMode.WRITE_THROUGH:
            await self._hurry(target)
        elif mode is CacheMode.WRITE_BACK and self._saved.has(target.name):
            await self._restore_knobs(target)

    async def flush(self, target: CacheTarget) -> None:
        """bcache has no flush command: the full-speed settings of write-through are it."""
        await self._hurry(target)

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """``CacheDiagnosis``: the sysfs files a flip writes are writable."""
        files = [self._attr(t, a) for t in targets for a in ("cache_mode", "writeback_percent")]
        return [await may_flip(self.name, self._runner, writable=files)]

    async def close(self) -> None:
        await self._runner.close()

    async def _hurry(self, target: CacheTarget) -> None:
        """Save the user's writeback knobs (once) and set them for a full-speed destage."""
        if not self._saved.has(target.name):
            values = [v.strip() for v in await self._get_many(target, *DESTAGE_KNOBS)]
            self._saved.put(target.name, dict(zip(DESTAGE_KNOBS, values, strict=True)))
        await self._put_many(target, DESTAGE_KNOBS)

    async def _restore_knobs(self, target: CacheTarget) -> None:
        await self._put_many(target, self._saved.get(target.name, {}))
        self._saved.drop(target.name)
        log.info("%s: restored the user's writeback settings", self._where(target))

    async def _list_devices(self) -> list[str]:
        block = self._root / "block"
        if self._settings.ssh is None:
            return sorted(p.parent.name for p in Path(block).glob("bcache*/bcache") if p.is_dir())
        script = f"cd {shlex.quote(str(block))} && ls -d bcache*/bcache 2>/dev/null; true"
        result = await self._runner.run(["sh", "-c", script], timeout=TIMEOUT)
        return sorted(line.split("/")[0] for line in result.stdout.split() if line)

    def _attr(self, target: CacheTarget, attr: str) -> PurePosixPath:
        return self._root / "block" / target.name / "bcache" / attr

    def _where(self, target: CacheTarget) -> str:
        host = f"{self._settings.ssh.host}:" if self._settings.ssh else ""
        return f"cache '{self.name}' {host}{target.name}"

    async def _get_many(self, target: CacheTarget, *attrs: str) -> list[str]:
        paths = [self._attr(target, attr) for attr in attrs]
        try:
            return await self._runner.read_texts(paths, timeout=TIMEOUT)
        except PermanentError as exc:
            raise PermanentError(
                f"{self._where(target)}: not a bcache device ({exc}); "
                "check 'targets' and 'sysfs_root'"
            ) from exc

    async def _put(self, target: CacheTarget, attr: str, value: str) -> None:
        await self._runner.write_text(self._attr(target, attr), value, timeout=TIMEOUT)

    async def _put_many(self, target: CacheTarget, values: dict[str, str]) -> None:
        """Several attributes in one go: a flip or a restore is one round trip over SSH."""
        pairs = [(self._attr(target, attr), value) for attr, value in values.items()]
        await self._runner.write_texts(pairs, timeout=TIMEOUT)
