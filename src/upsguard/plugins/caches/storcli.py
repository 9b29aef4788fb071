"""RAID controller caches (Broadcom MegaRAID ``storcli64``, Dell ``perccli64``).

Format: ``storcli64 /c0/vall show J`` prints JSON; each virtual drive's ``Cache`` field
joins the read, write and IO policies (``RWBD``: read ahead, write-back, direct;
``NRWTD``; ``RAWBD`` with ``AWB``, always write-back). The write policy is set with
``/c0/vN set wrcache=WT`` and put back with ``WB`` or ``AWB``.

The trap: a controller exposes no dirty counter. So the provider judges "clean"
itself: the write policy reads WT and a ``/c0 flushcache`` issued after the switch
succeeded (it blocks until the controller cache is written out). ``read()`` runs that
flush when it has not yet succeeded, so another process (``upsguard cache wait``)
reaches the same verdict. Each drive's previous write policy is remembered so that
write-back restores it exactly (WB or AWB); otherwise ``write_back_policy`` applies.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from typing import Any

from upsguard.clock import Clock
from upsguard.config.caches import StorcliSettings
from upsguard.errors import PermanentError, TemporaryError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import may_flip, require_targets
from upsguard.plugins.remote import Runner

TIMEOUT = 30.0
FLUSH_TIMEOUT = 600.0
_WRITE_POLICY = re.compile(r"AWB|WB|WT")


def parse_answer(text: str) -> dict[str, Any]:
    """The first controller's object of a ``J`` answer; ``Failure`` raises with its reason."""
    try:
        controller: dict[str, Any] = json.loads(text)["Controllers"][0]
        status = controller["Command Status"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise TemporaryError(f"storcli printed no JSON answer: {text.strip()[:80]!r}") from exc
    if status.get("Status") != "Success":
        raise PermanentError(str(status.get("Description") or status.get("Status")))
    return controller


def write_policy(cache_field: str) -> str:
    """``RWBD`` -> ``WB``; ``RAWBD`` -> ``AWB``; ``NRWTD`` -> ``WT``."""
    match = _WRITE_POLICY.search(cache_field)
    return match.group(0) if match else ""


class StorcliProvider:
    """One ``caches:`` entry of provider ``storcli``: the virtual drives of one controller."""

    def __init__(self, settings: StorcliSettings, clock: Clock) -> None:
        self.name: CacheName = settings.name
        self._settings = settings
        self._clock = clock
        self._runner = Runner(settings.ssh)
        self._storcli = shlex.split(settings.storcli_command)
        self._ctl = f"/c{settings.controller}"
        self._flushed: set[str] = set()
        self._previous: dict[str, str] = {}
        self._flush_lock = asyncio.Lock()  # one flush of the controller at a time

    async def targets(self) -> list[CacheTarget]:
        if self._settings.targets:
            return [CacheTarget(self.name, name) for name in self._settings.targets]
        rows = await self._drives(f"{self._ctl}/vall")
        found = [CacheTarget(self.name, "v" + row["DG/VD"].split("/")[1]) for row in rows]
        return require_targets(found, f"cache '{self.name}': {self._ctl} has no virtual drive")

    async def read(self, target: CacheTarget) -> CacheState:
        [row] = await self._drives(self._vd(target))
        policy = write_policy(str(row.get("Cache", "")))
        mode = CacheMode.WRITE_THROUGH if policy == "WT" else CacheMode.WRITE_BACK
        if not policy:
            mode = CacheMode.UNKNOWN
        detail = f"cache policy {row.get('Cache', '?')}, state {row.get('State', '?')}"
        if mode is CacheMode.WRITE_THROUGH and target.name not in self._flushed:
            detail += "; " + await self._flush_once(target)
        clean = mode is CacheMode.WRITE_THROUGH and target.name in self._flushed
        return CacheState(target, self._clock.now(), mode, None, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        if mode is CacheMode.WRITE_THROUGH:
            [row] = await self._drives(self._vd(target))
            current = write_policy(str(row.get("Cache", "")))
            if current in ("WB", "AWB"):
                self._previous[target.name] = current
            await self._call(self._vd(target), "set", "wrcache=WT")
        elif mode is CacheMode.WRITE_BACK:
            policy = self._previous.pop(target.name, self._settings.write_back_policy)
            await self._call(self._vd(target), "set", f"wrcache={policy}")
            self._flushed.discard(target.name)
        else:
            raise PermanentError(f"{self._where(target)}: a RAID controller has no mode '{mode}'")

    async def flush(self, target: CacheTarget) -> None:
        await self._call(self._ctl, "flushcache", timeout=FLUSH_TIMEOUT)

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """``CacheDiagnosis``: storcli is there, run as root."""
        return [await may_flip(self.name, self._runner, programs=[self._storcli[0]], root=True)]

    async def close(self) -> None:
        await self._runner.close()

    async def _flush_once(self, target: CacheTarget) -> str:
        """Flush after the WT switch; its success is what "clean" means here."""
        async with self._flush_lock:
            if target.name in self._flushed:
                return "controller cache flushed"
            try:
                await self.flush(target)
            except PermanentError as exc:
                return f"flush failed: {exc}"
            self._flushed.add(target.name)
        return "controller cache flushed"

    async def _drives(self, path: str) -> list[dict[str, Any]]:
        answer = await self._call(path, "show")
        rows = answer.get("Response Data", {}).get("Virtual Drives", [])
        if not rows:
            raise PermanentError(f"cache '{self.name}' {path}: no virtual drive")
        return list(rows)

    async def _call(self, path: str, *words: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        argv = [*self._storcli, path, *words, "J"]
        result = await self._runner.run(argv, timeout=timeout)
        try:
            return parse_answer(result.stdout)
        except PermanentError as exc:
            raise PermanentError(f"cache '{self.name}' {path} {' '.join(words)}: {exc}") from exc
        except TemporaryError as exc:
            if not result.ok:
                raise PermanentError(
                    f"cache '{self.name}' {path}: {result.first_error_line()}"
                ) from exc
            raise

    def _vd(self, target: CacheTarget) -> str:
        number = target.name.removeprefix("v")
        if not number.isdigit():
            raise PermanentError(f"{self._where(target)}: name virtual drives v0, v1, ...")
        return f"{self._ctl}/v{number}"

    def _where(self, target: CacheTarget) -> str:
        host = f"{self._settings.ssh.host}:" if self._settings.ssh else ""
        return f"cache '{self.name}' {host}{target.name}"
