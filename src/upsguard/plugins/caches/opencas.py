"""Open CAS Linux caches, through ``casadm``.

Formats (Open CAS casadm source and admin guide): ``casadm -L -o csv`` lists
``type,id,disk,status,write policy,device``; ``casadm -P -i ID -o csv`` prints a header
and a value line, with ``Write Policy`` (wt, wb, wa, pt, wo), ``Status`` (``Running``,
``Flushing (37.5 %)``) and ``Dirty [4KiB Blocks]``: older releases spell it
``Dirty [4KiB blocks]``, so headers are matched without regard to case.

The trap: ``casadm -Q -i ID -c wt -f yes`` flushes first and blocks until the cache
is clean, and an interrupted flush leaves the mode unchanged. The provider starts it
detached (``nohup``, output in ``job_log_dir`` on its host), returns at once and
reports progress from the dirty-block counter and the ``Flushing (N %)`` status.
"""

from __future__ import annotations

import asyncio
import csv
import io
import re
import shlex

from upsguard.clock import Clock
from upsguard.config.caches import OpencasSettings
from upsguard.errors import PermanentError, TemporaryError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import may_flip, require_targets
from upsguard.plugins.remote import Detached, Runner

TIMEOUT = 30.0
#: How long an interrupted flush may take to restore the normal policy and end.
INTERRUPT_S = 10.0
BLOCK = 4096
_MODES = {
    "wb": CacheMode.WRITE_BACK,
    "wo": CacheMode.WRITE_BACK,  # write-only: writes are cached, so dirty
    "wt": CacheMode.WRITE_THROUGH,
    "wa": CacheMode.WRITE_AROUND,
    "pt": CacheMode.NONE,
}
_TOOL_MODE = {CacheMode.WRITE_BACK: "wb", CacheMode.WRITE_THROUGH: "wt"}


def parse_csv(text: str) -> list[dict[str, str]]:
    """CSV rows keyed by lower-cased header, so both header spellings read alike."""
    rows = list(csv.reader(io.StringIO(text.strip())))
    if not rows:
        raise TemporaryError("casadm printed no CSV")
    header = [h.strip().lower() for h in rows[0]]
    return [dict(zip(header, (v.strip() for v in row), strict=False)) for row in rows[1:]]


def cache_id(target: CacheTarget) -> str:
    """``cache1`` or ``1`` -> ``1``."""
    number = target.name.removeprefix("cache")
    if not number.isdigit():
        raise PermanentError(f"cache '{target.cache}': '{target.name}' is not a cache id")
    return number


class OpencasProvider:
    """One ``caches:`` entry of provider ``opencas``: caches named ``cacheN``."""

    def __init__(
        self, settings: OpencasSettings, clock: Clock, *, interrupt_s: float = INTERRUPT_S
    ) -> None:
        """``interrupt_s``: how long an interrupted switch may take to end (see
        ``_interrupt``)."""
        self.name: CacheName = settings.name
        self._settings = settings
        self._clock = clock
        self._interrupt_s = interrupt_s
        self._runner = Runner(settings.ssh)
        self._casadm = shlex.split(settings.casadm_command)

    async def targets(self) -> list[CacheTarget]:
        if self._settings.targets:
            names = [n if n.startswith("cache") else f"cache{n}" for n in self._settings.targets]
            return [CacheTarget(self.name, n) for n in names]
        rows = parse_csv(await self._casadm_out(None, "-L", "-o", "csv"))
        found = [
            CacheTarget(self.name, f"cache{r['id']}") for r in rows if r.get("type") == "cache"
        ]
        return require_targets(found, f"cache '{self.name}': casadm lists no running cache")

    async def read(self, target: CacheTarget) -> CacheState:
        cid = cache_id(target)
        rows = parse_csv(await self._casadm_out(target, "-P", "-i", cid, "-o", "csv"))
        if not rows:
            raise TemporaryError(f"{self._where(target)}: casadm -P printed no statistics")
        row = rows[0]
        mode = _MODES.get(row.get("write policy", ""), CacheMode.UNKNOWN)
        try:
            dirty = int(row["dirty [4kib blocks]"]) * BLOCK
        except (KeyError, ValueError) as exc:
            raise TemporaryError(f"{self._where(target)}: casadm -P has no dirty count") from exc
        status = row.get("status", "")
        clean = dirty == 0 and mode.holds_no_new_writes and not status.startswith("Flush")
        detail = f"status {status}"
        job = await self._runner.read_detached(self._log(target), timeout=TIMEOUT)
        if job is not None:
            detail += f"; {_job_detail(job)}"
        return CacheState(target, self._clock.now(), mode, dirty, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        if mode not in _TOOL_MODE:
            raise PermanentError(f"{self._where(target)}: not offered here: mode '{mode}'")
        cid = cache_id(target)
        job = await self._runner.read_detached(self._log(target), timeout=TIMEOUT)
        if job is not None and job.running:
            if mode is CacheMode.WRITE_THROUGH:
                return  # the flush that ends in wt is under way
            await self._interrupt(target)
        if mode is CacheMode.WRITE_BACK:
            if (await self.read(target)).mode is not CacheMode.WRITE_BACK:
                await self._casadm_out(target, "-Q", "-i", cid, "-c", "wb")
            await self._runner.run(["rm", "-f", "--", self._log(target)], timeout=TIMEOUT)
            return
        if (await self.read(target)).mode is CacheMode.WRITE_THROUGH:
            return
        await self._runner.start_detached(self._switch(cid), self._log(target), timeout=TIMEOUT)

    async def flush(self, target: CacheTarget) -> None:
        """The write-through switch flushes already; otherwise start ``casadm -F``."""
        job = await self._runner.read_detached(self._log(target), timeout=TIMEOUT)
        if job is None or not job.running:
            argv = [*self._casadm, "-F", "-i", cache_id(target)]
            await self._runner.start_detached(argv, self._log(target), timeout=TIMEOUT)

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """``CacheDiagnosis``: casadm is there, run as root."""
        return [await may_flip(self.name, self._runner, programs=[self._casadm[0]], root=True)]

    async def close(self) -> None:
        await self._runner.close()

    def _switch(self, cid: str) -> list[str]:
        """The command that flushes cache ``cid`` and then switches it to write-through."""
        return [*self._casadm, "-Q", "-i", cid, "-c", "wt", "-f", "yes"]

    async def _interrupt(self, target: CacheTarget) -> None:
        """Interrupt the switch this provider started, and wait for it to end: it restores
        the normal policy on its way out. It is found by its whole command, casadm's path as
        the site file gives it included: another casadm's flush of a cache with the same id
        (another program's, another test's fake) is not this provider's to stop, and stopped
        it would leave that cache dirty in write-back. ``TemporaryError`` when it has not
        ended within ``interrupt_s``: a switch to write-back now would be undone by it."""
        pattern = _literal(" ".join(self._switch(cache_id(target))))
        await self._runner.run(["pkill", "-INT", "-f", "--", pattern], timeout=TIMEOUT)
        try:
            async with asyncio.timeout(self._interrupt_s):
                while (await self._runner.run(["pgrep", "-f", "--", pattern], timeout=TIMEOUT)).ok:
                    await asyncio.sleep(0.1)
        except TimeoutError as exc:
            raise TemporaryError(
                f"{self._where(target)}: casadm -Q still flushing "
                f"{self._interrupt_s:g}s after it was interrupted; try again"
            ) from exc

    async def _casadm_out(self, target: CacheTarget | None, *args: str) -> str:
        result = await self._runner.run([*self._casadm, *args], timeout=TIMEOUT)
        if not result.ok:
            where = self._where(target) if target else f"cache '{self.name}'"
            raise PermanentError(f"{where}: casadm {args[0]}: {result.first_error_line()}")
        return result.stdout

    def _log(self, target: CacheTarget) -> str:
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.name}-{target.name}")
        return str(self._settings.job_log_dir / f"upsguard-casadm-{slug}.log")

    def _where(self, target: CacheTarget) -> str:
        host = f"{self._settings.ssh.host}:" if self._settings.ssh else ""
        return f"cache '{self.name}' {host}{target.name}"


def _literal(text: str) -> str:
    """``text`` as an extended regular expression (``pgrep -f``) that matches it as it is."""
    return re.sub(r"([\\.\[\](){}*+?|^$])", r"\\\1", text)


def _job_detail(job: Detached) -> str:
    if job.running:
        return "casadm flushing"
    if job.exit_status == 0:
        return "casadm done"
    last = next((line.strip() for line in reversed(job.lines) if line.strip()), "no output")
    return f"casadm failed (exit status {job.exit_status}): {last}"
