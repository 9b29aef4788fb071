"""What ``upsguard doctor`` checks of an SNMP UPS, and how its battery tests came out.

The login is one read of the UPS (v3 keys and protocols, or the community, and the
context); the commands the plan sends must have SETs in the UPS's MIB and the objects they
set must be there (a test read of each); and the community or user must be allowed to
write: the one setting of the control group that is no action (UPS-MIB ``upsAutoRestart``,
PowerNet ``upsAdvConfigShutoffDelay``) is written back with the value it has, which changes
nothing and shows whether the agent lets us write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from upsguard.config.ups import SnmpSettings
from upsguard.errors import UpsguardError
from upsguard.findings import Area, Finding, fail, ok
from upsguard.models import UpsName, UpsReading
from upsguard.plugins.ups.snmp.control import SETS, WRITE_PROBE
from upsguard.selftest import TestResult, TestState


class Agent(Protocol):
    """What the checks use of ``SnmpSource``."""

    name: UpsName
    settings: SnmpSettings

    @property
    def where(self) -> str: ...
    async def read(self) -> UpsReading: ...
    async def get(self, oids: Mapping[str, str]) -> dict[str, int | str | None]: ...
    async def write(self, doing: str, values: Sequence[tuple[str, Any]]) -> str | None: ...


# UPS-MIB upsTestResultsSummary
_SUMMARY = {
    1: TestState.PASSED,  # donePass
    2: TestState.WARNING,  # doneWarning
    3: TestState.FAILED,  # doneError
    4: TestState.ABORTED,  # aborted
    5: TestState.RUNNING,  # inProgress
    6: TestState.NONE,  # noTestsInitiated
}
# PowerNet upsAdvTestDiagnosticsResults, upsAdvTestCalibrationResults
_DIAGNOSTICS = {1: TestState.PASSED, 2: TestState.FAILED, 3: TestState.FAILED, 4: TestState.RUNNING}
_CALIBRATION = {1: TestState.PASSED, 2: TestState.FAILED, 3: TestState.RUNNING}


def test_result(mib: str, values: Mapping[str, int | str | None]) -> TestResult:
    """The MIB's test result objects as one ``TestResult``."""
    if mib == "ups-mib":
        code = values.get("upsTestResultsSummary")
        state = _SUMMARY.get(code, TestState.UNKNOWN) if isinstance(code, int) else TestState.NONE
        detail = values.get("upsTestResultsDetail")
        return TestResult(
            state, f"upsTestResultsSummary {code}" + (f": {detail}" if detail else "")
        )
    calibration = values.get("upsAdvTestCalibrationResults")
    if calibration == 3:  # a calibration (deep test) under way says more than the diagnostic
        return TestResult(TestState.RUNNING, "upsAdvTestCalibrationResults 3")
    code = values.get("upsAdvTestDiagnosticsResults")
    if not isinstance(code, int):
        return TestResult(TestState.NONE, "no upsAdvTestDiagnosticsResults")
    return TestResult(
        _DIAGNOSTICS.get(code, TestState.UNKNOWN), f"upsAdvTestDiagnosticsResults {code}"
    )


class SnmpCheck:
    def __init__(self, source: Agent, commands: Sequence[str]) -> None:
        self.source = source
        self.s = source.settings
        self.commands = list(dict.fromkeys(commands))
        self.subject = str(source.name)

    def _who(self) -> str:
        s = self.s
        if s.version == "3":
            context = f", context '{s.context}'" if s.context else ""
            return f"SNMPv3 user '{s.user}' ({s.keys_level}){context}"
        return f"SNMP v{s.version} community" + (" 'public'" if s.allow_public_community else "")

    async def run(self) -> list[Finding]:
        try:
            reading = await self.source.read()
        except UpsguardError as exc:
            return [
                fail(
                    Area.UPS,
                    self.subject,
                    "login",
                    str(exc),
                    "check host and port, the credentials (community, or v3 user, protocols and "
                    "keys), the context, and the card's access list",
                )
            ]
        status = " ".join(sorted(f.value for f in reading.flags)) or "-"
        charge = "?" if reading.charge_pct is None else f"{reading.charge_pct:.0f} %"
        found = [
            ok(Area.UPS, self.subject, "login", f"{self.source.where}: {self._who()} answered"),
            ok(Area.UPS, self.subject, "data", f"answered now: {status}, charge {charge}"),
        ]
        if self.commands:
            found.append(await self._commands())
            found.append(await self._rights())
        return found

    async def _commands(self) -> Finding:
        mib = self.s.mib
        unknown = [c for c in self.commands if c not in SETS[mib]]
        if unknown:
            return fail(
                Area.UPS,
                self.subject,
                "commands",
                f"{', '.join(unknown)} cannot be sent over SNMP with {mib}",
                f"use one of {', '.join(sorted(SETS[mib]))}, or a NUT source (snmp-ups driver)",
                missing=tuple(unknown),
            )
        objects = {step.name: step.oid for c in self.commands for step in SETS[mib][c]}
        values = await self.source.get(objects)
        missing = tuple(name for name, value in values.items() if value is None)
        if missing:
            return fail(
                Area.UPS,
                self.subject,
                "commands",
                f"the agent has no {', '.join(missing)}: it cannot do {', '.join(self.commands)}",
                "check the card's MIB support and firmware, or use a NUT source (snmp-ups)",
                missing=missing,
            )
        return ok(
            Area.UPS,
            self.subject,
            "commands",
            f"{', '.join(self.commands)}: the agent has {', '.join(objects)} (read each)",
        )

    async def _rights(self) -> Finding:
        name, oid, kind = WRITE_PROBE[self.s.mib]
        value = (await self.source.get({name: oid}))[name]
        if not isinstance(value, int):
            return fail(
                Area.UPS,
                self.subject,
                "rights",
                f"the agent has no {name} to try a write on",
                "check the card's MIB support",
                missing=(name,),
            )
        refused = await self.source.write("write test", [(oid, kind(value))])
        if refused is not None:
            return fail(
                Area.UPS,
                self.subject,
                "rights",
                f"the agent refused to write {name} back with its own value {value} ({refused})",
                f"give {self._who()} write access to the MIB's control objects",
                missing=("write",),
            )
        return ok(
            Area.UPS,
            self.subject,
            "rights",
            f"may write: {name} written back with its own value {value}",
        )
