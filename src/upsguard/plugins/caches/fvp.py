"""Host-side VM write-back acceleration of the PernixData FVP kind, through its cmdlets.

Each call runs one ``pwsh -NoProfile -NonInteractive -Command`` script that imports the
module, connects (the password goes on standard input, never on a command line),
runs the cmdlets and prints ``ConvertTo-Json``. Targets are VMs.

The traps: after ``Set-PrnxAccelerationPolicy -WriteThrough`` the *effective* policy
stays write-back until the VM's dirty data has been destaged to the datastore, so
the provider polls ``Get-PrnxAccelerationPolicy -Effective`` and ``time_to_destage``
of ``Get-PrnxObjectStats``; and going back to write-back needs the VM's write-back
peer counts (``-NumWBPeers``, ``-NumWBExternalPeers``), which the write-through policy
no longer shows: they are saved in ``state_dir`` before the switch and used to
restore the policy exactly. FVP exposes no dirty byte count: ``dirty_bytes`` is None
and the detail carries the time to destage.
"""

from __future__ import annotations

import json
import logging
import shlex
from typing import Any

from upsguard.clock import Clock
from upsguard.config.caches import FvpSettings
from upsguard.config.types import resolve_secret
from upsguard.errors import AuthenticationError, PermanentError, TemporaryError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import may_flip, require_targets
from upsguard.plugins.remote import Runner
from upsguard.saved_state import SavedState

log = logging.getLogger(__name__)

TIMEOUT = 120.0  # pwsh and the module take seconds to start
MODULE = "PrnxCli"


def ps_quote(text: str) -> str:
    """A PowerShell single-quoted string literal."""
    return "'" + text.replace("'", "''") + "'"


def _field(obj: dict[str, Any], *names: str) -> Any:
    """A property by any of its spellings, without regard to case."""
    lowered = {key.lower(): value for key, value in obj.items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


class FvpProvider:
    """One ``caches:`` entry of provider ``fvp``: accelerated VMs of one FVP cluster."""

    def __init__(self, settings: FvpSettings, clock: Clock) -> None:
        self.name: CacheName = settings.name
        self._settings = settings
        self._clock = clock
        self._runner = Runner(settings.ssh)
        self._pwsh = shlex.split(settings.pwsh_command)
        self._peers: SavedState[list[int]] = SavedState(
            settings.state_dir / f"{settings.name}.fvp.json", "FVP peer counts"
        )

    async def targets(self) -> list[CacheTarget]:
        if self._settings.targets:
            return [CacheTarget(self.name, name) for name in self._settings.targets]
        answer = await self._script("$p = Get-PrnxAccelerationPolicy -Effective", "@{policy=$p}")
        policies = answer.get("policy") or []
        if isinstance(policies, dict):
            policies = [policies]
        found = [CacheTarget(self.name, str(_field(p, "Name"))) for p in policies]
        return require_targets(found, f"cache '{self.name}': FVP reports no accelerated VM")

    async def read(self, target: CacheTarget) -> CacheState:
        vm = ps_quote(target.name)
        answer = await self._script(
            f"$p = Get-PrnxAccelerationPolicy -Name {vm} -Effective\n"
            f"$s = Get-PrnxObjectStats -ObjectIdentifier {vm} -NumberOfSamples 1",
            "@{policy=$p; stats=$s}",
        )
        policy = answer.get("policy") or {}
        mode = _mode(str(_field(policy, "WritePolicy", "WriteMode") or ""))
        ttd = _time_to_destage(answer.get("stats"))
        clean = mode is CacheMode.WRITE_THROUGH and ttd in (0, None)
        detail = f"effective policy {_field(policy, 'WritePolicy', 'WriteMode')}"
        if ttd is not None:
            detail += f", time to destage {ttd:g}s"
        return CacheState(target, self._clock.now(), mode, None, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        vm = ps_quote(target.name)
        if mode is CacheMode.WRITE_THROUGH:
            await self._remember_peers(target)
            await self._script(f"Set-PrnxAccelerationPolicy -Name {vm} -WriteThrough", None)
        elif mode is CacheMode.WRITE_BACK:
            peers, external = self._peers.get(target.name, [1, 0])  # FVP's default
            await self._script(
                f"Set-PrnxAccelerationPolicy -Name {vm} -WriteBack "
                f"-NumWBPeers {peers} -NumWBExternalPeers {external}",
                None,
            )
            self._peers.drop(target.name)
        else:
            raise PermanentError(f"cache '{self.name}' {target.name}: FVP has no mode '{mode}'")

    async def flush(self, target: CacheTarget) -> None:
        """FVP destages on its own once the policy is write-through."""

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """``CacheDiagnosis``: pwsh is there (the login the read already proved)."""
        return [await may_flip(self.name, self._runner, programs=[self._pwsh[0]])]

    async def close(self) -> None:
        await self._runner.close()

    async def _remember_peers(self, target: CacheTarget) -> None:
        """Save the write-back peer counts before write-through hides them (once)."""
        if self._peers.has(target.name):
            return
        answer = await self._script(
            f"$p = Get-PrnxAccelerationPolicy -Name {ps_quote(target.name)}", "@{policy=$p}"
        )
        policy = answer.get("policy") or {}
        if _mode(str(_field(policy, "WritePolicy", "WriteMode") or "")) is CacheMode.WRITE_BACK:
            peers = int(_field(policy, "NumWBPeers") or 0)
            external = int(_field(policy, "NumWBExternalPeers") or 0)
            self._peers.put(target.name, [peers, external])

    async def _script(self, body: str, result: str | None) -> dict[str, Any]:
        lines = ["$ErrorActionPreference = 'Stop'", f"Import-Module {MODULE}"]
        password = resolve_secret(
            f"cache '{self.name}'", self._settings.password_file, self._settings.password_env
        )
        if self._settings.fvp_server:
            login = f"Connect-PrnxServer -NameOrIPAddress {ps_quote(self._settings.fvp_server)}"
            if self._settings.user:
                login += f" -UserName {ps_quote(self._settings.user)}"
            if password is not None:
                login += " -Password ([Console]::In.ReadLine())"
            lines.append(f"$null = {login}")
        lines.append(body)
        lines.append(f"{result} | ConvertTo-Json -Depth 4 -Compress" if result else "")
        argv = [*self._pwsh, "-NoProfile", "-NonInteractive", "-Command", "\n".join(lines)]
        stdin = password + "\n" if password is not None else None
        done = await self._runner.run(argv, timeout=TIMEOUT, input=stdin)
        if not done.ok:
            message = f"cache '{self.name}': {done.first_error_line()}"
            if "Connect-PrnxServer" in done.stderr and "uthentica" in done.stderr:
                raise AuthenticationError(message)
            raise PermanentError(message)
        if result is None:
            return {}
        try:
            answer: dict[str, Any] = json.loads(done.stdout or "{}")
        except ValueError as exc:
            raise TemporaryError(f"cache '{self.name}': pwsh printed no JSON") from exc
        return answer


def _mode(policy: str) -> CacheMode:
    word = policy.replace("_", "").replace("-", "").lower()
    return {"writeback": CacheMode.WRITE_BACK, "writethrough": CacheMode.WRITE_THROUGH}.get(
        word, CacheMode.UNKNOWN
    )


def _time_to_destage(stats: Any) -> float | None:
    samples = stats if isinstance(stats, list) else [stats] if isinstance(stats, dict) else []
    for sample in samples:
        value = _field(sample, "time_to_destage", "TimeToDestage")
        if value is not None:
            return float(value)
    return None
