"""dm-cache logical volumes managed by LVM (lvmcache(7)): ``lvchange`` to flip, ``dmsetup
status`` to watch.

What ``lvchange --cachemode writethrough VG/LV`` does with dirty blocks (measured on Debian
12's lvm2 2.03.16 and kernel 6.1: docs/real-kernel-caches.md, tests/integration/
test_guest_kernel.py): it loads the ``cleaner`` policy, with lvm's default settings instead of
the user's, prints ``Flushing N blocks for cache VG/LV.`` until no dirty block is left, and only
then switches the mode and returns. All that time it holds the volume group's lock, so ``lvs``
waits behind it; and killed (a shutdown, an impatient operator) it aborts the flush and puts
``writeback`` back, undoing the flip without a word.

So write-through here is the ``cleaner`` policy alone, ``lvchange --cachepolicy cleaner``: it
returns once the new table is loaded, and lvm loads the cleaner in the kernel's writethrough
mode, so no new write is cached dirty while the kernel writes every dirty block back by itself.
The user's own policy is kept in an LV tag (``upsguard.policy:smq``) set by the same
``lvchange``, on the machine the cache lives on, so that whoever flips back (the service after
a restart, the CLI in another process) restores it; the user's cache settings are never
touched. Progress comes from ``dmsetup status`` (kernel device-mapper/cache.rst), which takes
no LVM lock and reads the kernel's own dirty count.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass

from upsguard.clock import Clock
from upsguard.config.caches import LvmcacheSettings
from upsguard.errors import PermanentError, TemporaryError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import may_flip, require_targets
from upsguard.plugins.devmapper import dmsetup
from upsguard.plugins.remote import Runner

log = logging.getLogger(__name__)

TIMEOUT = 60.0  # an lvchange reloads a table, which waits for migrations under way
#: The LV tag that holds the user's policy while upsguard destages with the cleaner.
TAG = "upsguard.policy:"
#: lvm2's default policy: what write-back restores when the cleaner is on and no tag says more.
DEFAULT_POLICY = "smq"
_MODES = {
    "writeback": CacheMode.WRITE_BACK,
    "writethrough": CacheMode.WRITE_THROUGH,
    "passthrough": CacheMode.NONE,
}
_SETTABLE = (CacheMode.WRITE_BACK, CacheMode.WRITE_THROUGH)


@dataclass(frozen=True, slots=True)
class DmCacheStatus:
    """What ``dmsetup status`` tells of a dm-cache device."""

    block_bytes: int
    dirty_blocks: int
    mode: str
    policy: str
    needs_check: bool


def parse_status(line: str) -> DmCacheStatus:
    """``START LENGTH cache <metadata block size> <used>/<total> <cache block size (sectors)>
    <used>/<total> <read hits> <read misses> <write hits> <write misses> <demotions>
    <promotions> <dirty> <#features> <features>* <#core args> <core args>* <policy>
    <#policy args> <policy args>* <metadata mode> <needs_check>`` (device-mapper/cache.rst);
    ``Fail`` in place of it all when the cache device failed."""
    words = line.split()
    if len(words) < 4 or words[2] != "cache":
        raise TemporaryError(f"not a dm-cache status line: {line.strip()[:80]!r}")
    if words[3] == "Fail":
        raise PermanentError("the cache device failed (dm-cache status Fail)")
    try:
        features = int(words[14])
        core = 15 + features
        policy = core + 1 + int(words[core])
        policy_args = int(words[policy + 1])
        mode = next((w for w in words[15:core] if w in _MODES), "")
        after = words[policy + 2 + policy_args :]
        return DmCacheStatus(
            block_bytes=int(words[5]) * 512,
            dirty_blocks=int(words[13]),
            mode=mode,
            policy=words[policy],
            needs_check=len(after) > 1 and after[1] == "needs_check",
        )
    except (IndexError, ValueError) as exc:
        raise TemporaryError(f"not a dm-cache status line: {line.strip()[:80]!r}") from exc


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
        self._dmsetup = shlex.split(settings.dmsetup_command)

    async def targets(self) -> list[CacheTarget]:
        if self._settings.targets:
            return [CacheTarget(self.name, name) for name in self._settings.targets]
        rows = await self._report(["-o", "vg_name,lv_name", "-S", "segtype=cache"])
        found = [CacheTarget(self.name, f"{r['vg_name']}/{r['lv_name']}") for r in rows]
        return require_targets(
            found, f"cache '{self.name}': lvs reports no cached LV (segtype cache)"
        )

    async def read(self, target: CacheTarget) -> CacheState:
        status = await self._status(target)
        mode = _MODES.get(status.mode, CacheMode.UNKNOWN)
        dirty = status.dirty_blocks * status.block_bytes
        clean = dirty == 0 and mode.holds_no_new_writes
        detail = f"policy {status.policy}"
        if status.policy == "cleaner" and not clean:
            detail += f", writing back {status.dirty_blocks} blocks"
        if status.needs_check:
            detail += "; metadata needs a check (lvconvert --repair)"
        return CacheState(target, self._clock.now(), mode, dirty, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        if mode not in _SETTABLE:
            raise PermanentError(f"{self._where(target)}: lvmcache has no mode '{mode}' here")
        if mode is CacheMode.WRITE_THROUGH:
            await self._clean(target)
        else:
            await self._write_back(target)

    async def flush(self, target: CacheTarget) -> None:
        """dm-cache has no separate flush: the cleaner policy is the flush."""

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """``CacheDiagnosis``: lvchange, lvs and dmsetup are there, run as root."""
        tools = [self._lvchange[0], self._lvs[0], self._dmsetup[0]]
        return [await may_flip(self.name, self._runner, programs=tools, root=True)]

    async def close(self) -> None:
        await self._runner.close()

    async def _clean(self, target: CacheTarget) -> None:
        """The cleaner policy, the user's policy kept in a tag by the same command. Nothing to
        do when the cleaner is on already, or when the cache holds nothing dirty and is not in
        write-back (a write-through cache caches no write dirty)."""
        status = await self._status(target)
        if status.policy == "cleaner":
            return
        if status.mode != "writeback" and status.dirty_blocks == 0:
            return
        await self._change(target, "--cachepolicy", "cleaner", "--addtag", f"{TAG}{status.policy}")

    async def _write_back(self, target: CacheTarget) -> None:
        """Back to the user's policy (its tag, or lvm's default when the cleaner is on and no
        tag says which), and to write-back mode if lvm's metadata says otherwise."""
        rows = await self._report(["-o", "lv_tags,cache_mode,cache_policy", target.name])
        if not rows:
            raise PermanentError(f"{self._where(target)}: lvs reports no such LV")
        row = rows[0]
        saved = [tag for tag in row.get("lv_tags", "").split(",") if tag.startswith(TAG)]
        args: list[str] = []
        if saved or row.get("cache_policy") == "cleaner":
            policy = saved[0][len(TAG) :] if saved else DEFAULT_POLICY
            if not saved:
                log.warning("%s: no saved policy: restoring %s", self._where(target), policy)
            args += ["--cachepolicy", policy]
            for tag in saved:
                args += ["--deltag", tag]
        if row.get("cache_mode") != "writeback":
            args += ["--cachemode", "writeback"]
        if args:
            await self._change(target, *args)

    async def _change(self, target: CacheTarget, *args: str) -> None:
        result = await self._runner.run([*self._lvchange, *args, target.name], timeout=TIMEOUT)
        if not result.ok:
            raise PermanentError(f"{self._where(target)}: lvchange: {result.first_error_line()}")

    async def _status(self, target: CacheTarget) -> DmCacheStatus:
        line = await dmsetup(
            self._runner,
            self._dmsetup,
            "status",
            target.name,
            where=f"{self._where(target)} (not an active cached LV?)",
            timeout=TIMEOUT,
        )
        try:
            return parse_status(line)
        except PermanentError as exc:
            raise PermanentError(f"{self._where(target)}: {exc}") from exc

    async def _report(self, args: list[str]) -> list[dict[str, str]]:
        argv = [*self._lvs, "--reportformat", "json", "--units", "b", "--nosuffix", *args]
        result = await self._runner.run(argv, timeout=TIMEOUT)
        if not result.ok:
            raise PermanentError(f"cache '{self.name}': lvs: {result.first_error_line()}")
        return parse_lvs_json(result.stdout)

    def _where(self, target: CacheTarget) -> str:
        host = f"{self._settings.ssh.host}:" if self._settings.ssh else ""
        return f"cache '{self.name}' {host}{target.name}"
