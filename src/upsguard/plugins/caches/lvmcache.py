"""dm-cache logical volumes managed by LVM (lvmcache(7)), through ``lvs`` and ``lvchange``.

Formats: ``lvs --reportformat json --units b --nosuffix`` prints every value as a string
(``"cache_dirty_blocks":"1234"``, ``"chunk_size":"65536"``); ``cache_mode`` is
``writethrough``, ``writeback`` or ``passthrough`` (lvm2 lib/report/columns.h).

The trap: ``lvchange --cachemode writethrough VG/LV`` does not return until the cache
is clean. lvm2 reloads the LV with the ``cleaner`` policy, prints ``Flushing N blocks for
cache VG/LV.`` every half second, and changes the mode only at the end; killed, it
aborts the flush and puts the normal policy back. So the provider starts it detached
(``nohup``, output in ``job_log_dir`` on the machine that runs it), returns at once,
and reports progress from ``cache_dirty_blocks``, with the tool's last line as detail.
The cache is clean once no dirty block is left and the mode no longer reads writeback.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from typing import Any

from upsguard.clock import Clock
from upsguard.config.caches import LvmcacheSettings
from upsguard.errors import PermanentError, TemporaryError
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import require_targets
from upsguard.plugins.remote import Detached, Runner

TIMEOUT = 30.0
FIELDS = (
    "vg_name,lv_name,cache_mode,cache_policy,chunk_size,"
    "cache_dirty_blocks,cache_used_blocks,cache_total_blocks"
)
_MODES = {
    "writeback": CacheMode.WRITE_BACK,
    "writethrough": CacheMode.WRITE_THROUGH,
    "passthrough": CacheMode.NONE,
}
_SETTABLE = (CacheMode.WRITE_BACK, CacheMode.WRITE_THROUGH)
_FLUSHING = re.compile(r"Flushing (\d+) blocks for cache (\S+?)\.?$")


def parse_lvs_json(text: str) -> list[dict[str, str]]:
    """The rows of ``lvs --reportformat json``: ``{"report": [{"lv": [...]}]}``."""
    try:
        report = json.loads(text)["report"]
        return [dict(row) for part in report for row in part.get("lv", [])]
    except (ValueError, KeyError, TypeError) as exc:
        raise TemporaryError(f"lvs printed no JSON report: {text[:80]!r}") from exc


class LvmcacheProvider:
    """One ``caches:`` entry of provider ``lvmcache``: cached LVs named ``VG/LV``."""

    def __init__(self, settings: LvmcacheSettings, clock: Clock) -> None:
        self.name: CacheName = settings.name
        self._settings = settings
        self._clock = clock
        self._runner = Runner(settings.ssh)
        self._lvs = shlex.split(settings.lvs_command)
        self._lvchange = shlex.split(settings.lvchange_command)

    async def targets(self) -> list[CacheTarget]:
        if self._settings.targets:
            return [CacheTarget(self.name, name) for name in self._settings.targets]
        rows = await self._report(["-o", "vg_name,lv_name", "-S", "segtype=cache"])
        found = [CacheTarget(self.name, f"{r['vg_name']}/{r['lv_name']}") for r in rows]
        return require_targets(
            found, f"cache '{self.name}': lvs reports no cached LV (segtype cache)"
        )

    async def read(self, target: CacheTarget) -> CacheState:
        rows = await self._report(["-o", FIELDS, target.name])
        if not rows:
            raise PermanentError(f"{self._where(target)}: lvs reports no such LV")
        row = rows[0]
        mode = _MODES.get(row.get("cache_mode", ""), CacheMode.UNKNOWN)
        dirty = _dirty_bytes(row)
        job = await self._runner.read_detached(self._log(target), timeout=TIMEOUT)
        clean = dirty == 0 and mode is not CacheMode.WRITE_BACK
        detail = f"policy {row.get('cache_policy') or '?'}"
        if dirty is None:
            detail = "not active: dirty blocks unknown"
        if job is not None:
            detail += f"; {_job_detail(job)}"
        return CacheState(target, self._clock.now(), mode, dirty, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        if mode not in _SETTABLE:
            raise PermanentError(f"{self._where(target)}: lvmcache has no mode '{mode}' here")
        job = await self._runner.read_detached(self._log(target), timeout=TIMEOUT)
        if job is not None and job.running:
            if mode is CacheMode.WRITE_THROUGH:
                return  # the flush that ends in writethrough is already under way
            await self._stop_flush(target)
        if mode is CacheMode.WRITE_BACK:
            await self._write_back(target)
        elif (await self.read(target)).mode is not mode:
            argv = [*self._lvchange, "--cachemode", "writethrough", target.name]
            await self._runner.start_detached(argv, self._log(target), timeout=TIMEOUT)

    async def _write_back(self, target: CacheTarget) -> None:
        if (await self.read(target)).mode is not CacheMode.WRITE_BACK:
            argv = [*self._lvchange, "--cachemode", "writeback", target.name]
            result = await self._runner.run(argv, timeout=TIMEOUT)
            if not result.ok:
                raise PermanentError(f"{self._where(target)}: {result.first_error_line()}")
        await self._runner.run(["rm", "-f", "--", self._log(target)], timeout=TIMEOUT)

    async def flush(self, target: CacheTarget) -> None:
        """dm-cache has no separate flush: the writethrough switch is the flush."""

    async def close(self) -> None:
        await self._runner.close()

    async def _stop_flush(self, target: CacheTarget) -> None:
        """Interrupt a flushing lvchange (it aborts cleanly and restores the policy)."""
        name = re.sub(r"([.+])", r"[\1]", target.name)  # LV names may hold '.' and '+'
        pattern = f"lvchange --cachemode writethrough {name}$"
        await self._runner.run(["pkill", "-INT", "-f", "--", pattern], timeout=TIMEOUT)
        for _ in range(100):  # it restores the normal policy on its way out: wait for that
            found = await self._runner.run(["pgrep", "-f", "--", pattern], timeout=TIMEOUT)
            if not found.ok:
                return
            await asyncio.sleep(0.1)

    async def _report(self, args: list[str]) -> list[dict[str, str]]:
        argv = [*self._lvs, "--reportformat", "json", "--units", "b", "--nosuffix", *args]
        result = await self._runner.run(argv, timeout=TIMEOUT)
        if not result.ok:
            raise PermanentError(f"cache '{self.name}': lvs: {result.first_error_line()}")
        return parse_lvs_json(result.stdout)

    def _log(self, target: CacheTarget) -> str:
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.name}-{target.name}")
        return str(self._settings.job_log_dir / f"upsguard-lvchange-{slug}.log")

    def _where(self, target: CacheTarget) -> str:
        host = f"{self._settings.ssh.host}:" if self._settings.ssh else ""
        return f"cache '{self.name}' {host}{target.name}"


def _dirty_bytes(row: dict[str, Any]) -> int | None:
    blocks, chunk = row.get("cache_dirty_blocks", ""), row.get("chunk_size", "")
    if not blocks or not chunk:
        return None
    try:
        return int(blocks) * int(float(chunk))
    except ValueError as exc:
        raise TemporaryError(f"lvs: unexpected numbers {blocks!r} x {chunk!r}") from exc


def _job_detail(job: Detached) -> str:
    """``lvchange flushing: 1234 blocks left`` or how it ended."""
    last = next((line.strip() for line in reversed(job.lines) if line.strip()), "")
    match = _FLUSHING.search(last)
    if job.running:
        return f"lvchange flushing: {match.group(1)} blocks left" if match else "lvchange started"
    if job.exit_status == 0:
        return "lvchange done"
    return f"lvchange failed (exit status {job.exit_status}): {last or 'no output'}"
