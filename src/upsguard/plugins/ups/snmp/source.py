"""``SnmpSource``: one UPS over SNMP; reads, commands as SETs, and traps as changes.

The polls share this event loop's SNMP engine (``engine``); readings come from
``readings``, the SETs of each command from ``control``, and traps arrive through the
receiver of the UPS's trap port (``traps``), opened only when the site file gives one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from pysnmp.error import PySnmpError
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    UdpTransportTarget,
    UsmUserData,
    bulk_cmd,
    get_cmd,
    set_cmd,
)
from pysnmp.proto.rfc1902 import Integer, ObjectIdentifier, TimeTicks

from upsguard.clock import Clock
from upsguard.config.ups import SnmpSettings, UpsConfig
from upsguard.errors import AuthenticationError, ConfigError, PermanentError, UpsUnreachable
from upsguard.findings import Finding
from upsguard.models import UpsName, UpsReading
from upsguard.plugins.ups.snmp.checks import SnmpCheck, test_result
from upsguard.plugins.ups.snmp.control import SETS, TEST_RESULTS, TEST_SPIN_LOCK
from upsguard.plugins.ups.snmp.engine import (
    agent_engine_id,
    auth_data,
    join_engine,
    leave_engine,
    shared_engine,
)
from upsguard.plugins.ups.snmp.readings import (
    POWERNET_OIDS,
    UPS_ALARM_DESCR,
    UPS_MIB_OIDS,
    powernet_reading,
    snmp_value,
    ups_mib_reading,
)
from upsguard.plugins.ups.snmp.traps import Listener, TrapPort, open_trap_port, stop_listening
from upsguard.selftest import TestResult

log = logging.getLogger(__name__)

# Error indications that mean the agent refused who we are, not that it is away.
_REFUSED = ("digest", "unknownusm", "unknownusername", "ciphering", "decryption", "seclevel")
RESOLVE_RETRY_S = 30.0
"""While the UPS's host name does not resolve, how often the trap listener tries again."""

Values = dict[str, int | str | None]
SetValue: TypeAlias = Integer | TimeTicks | ObjectIdentifier


class SnmpSource:
    """One UPS read over SNMP through UPS-MIB or PowerNet (see the package docstring)."""

    def __init__(self, config: UpsConfig, clock: Clock) -> None:
        if config.snmp is None:
            raise ConfigError(f"UPS {config.name}: the snmp source needs an 'snmp' section")
        self.name: UpsName = config.name
        self.config = config
        self.settings: SnmpSettings = config.snmp
        self._clock = clock
        self._auth: CommunityData | UsmUserData | None = None
        self._target: UdpTransportTarget | None = None
        self._traps: tuple[TrapPort, Listener] | None = None
        self._trap_engine_id: bytes | None = None

    @property
    def where(self) -> str:
        s = self.settings
        return f"UPS {self.name}: SNMP agent {s.host}:{s.port}"

    def _auth_data(self) -> CommunityData | UsmUserData:
        if self._auth is None:
            self._auth = auth_data(self.name, self.settings)
        return self._auth

    async def _transport(self) -> UdpTransportTarget:
        """The agent's address, resolved once; joins this loop's shared engine."""
        if self._target is None:
            s = self.settings
            try:
                target = await UdpTransportTarget.create(
                    (s.host, s.port), timeout=s.timeout.total_seconds(), retries=s.retries
                )
            except (OSError, ValueError, PySnmpError) as exc:
                raise UpsUnreachable(f"{self.where}: {_first_line(exc)}") from exc
            join_engine()
            self._target = target
        return self._target

    async def _get(self, oids: Mapping[str, str]) -> Values:
        target = await self._transport()  # joins this loop's engine first
        error, status, index, binds = await get_cmd(
            shared_engine(),
            self._auth_data(),
            target,
            ContextData(contextName=self.settings.context),
            *(ObjectType(ObjectIdentity(oid)) for oid in oids.values()),
        )
        self._check(error, status, index)
        self._follow_engine_id()
        values = [snmp_value(value) for _, value in binds]
        if len(values) != len(oids):
            raise UpsUnreachable(f"{self.where} answered {len(values)} values for {len(oids)}")
        return dict(zip(oids, values, strict=True))

    async def _walk(self, column: str, limit: int = 64) -> list[int | str | None]:
        """The values of one table column (the alarm table is short: a bounded bulk read)."""
        target = await self._transport()
        error, status, index, binds = await bulk_cmd(
            shared_engine(),
            self._auth_data(),
            target,
            ContextData(contextName=self.settings.context),
            0,
            limit,
            ObjectType(ObjectIdentity(column)),
        )
        self._check(error, status, index)
        prefix = column + "."
        return [snmp_value(v) for name, v in binds if str(name).startswith(prefix)]

    def _check(self, error: Any, status: Any, index: Any) -> None:
        if error:
            text = str(error)
            squashed = (text + type(error).__name__).replace(" ", "").lower()
            if any(word in squashed for word in _REFUSED):
                raise AuthenticationError(
                    f"{self.where} refused SNMPv3 user '{self.settings.user}' ({text}): "
                    "check the user, its protocols and its key files"
                )
            hint = " (wrong community or context?)" if "timeout" in squashed else ""
            raise UpsUnreachable(f"{self.where}: {text}{hint}")
        if status:
            raise UpsUnreachable(f"{self.where} answered {status.prettyPrint()} at #{index}")

    async def read(self) -> UpsReading:
        try:
            if self.settings.mib == "powernet":
                return powernet_reading(
                    self.name, self._clock.now(), await self._get(POWERNET_OIDS)
                )
            values = await self._get(UPS_MIB_OIDS)
            alarms: Sequence[int | str | None] = ()
            if isinstance(values["upsAlarmsPresent"], int) and values["upsAlarmsPresent"] > 0:
                alarms = await self._walk(UPS_ALARM_DESCR)
            return ups_mib_reading(self.name, self._clock.now(), values, alarms)
        except (AuthenticationError, UpsUnreachable, ConfigError):
            raise
        except (OSError, ValueError, PySnmpError) as exc:
            raise UpsUnreachable(f"{self.where}: {_first_line(exc)}") from exc

    async def command(self, name: str) -> None:
        """Send ``name`` as this MIB's SETs (``control``), one at a time, in their order; the
        delay is ``at_shutdown_end.delay``. A SET the agent refuses stops the rest."""
        mib = self.settings.mib
        sets = SETS[mib].get(name)
        if sets is None:
            raise PermanentError(
                f"UPS {self.name}: '{name}' cannot be sent over SNMP with {mib} "
                f"(it can send {', '.join(sorted(SETS[mib]))})"
            )
        delay_s = round(self.config.at_shutdown_end.delay.total_seconds())
        for step in sets:
            lock: list[tuple[str, Integer]] = []
            if step.oid.endswith(".33.1.7.1.0"):  # upsTestId: with the spin lock just read
                spin = (await self._get({"upsTestSpinLock": TEST_SPIN_LOCK}))["upsTestSpinLock"]
                lock = [(TEST_SPIN_LOCK, Integer(spin if isinstance(spin, int) else 0))]
            await self._set(name, step.name, [*lock, (step.oid, step.value(delay_s))])

    async def _set(self, command: str, what: str, values: Sequence[tuple[str, SetValue]]) -> None:
        """SET ``values`` (object id, value) for ``command``; raises when the agent refuses."""
        refused = await self.write(command, values)
        if refused is not None:
            shown = ", ".join(f"{what} = {value.prettyPrint()}" for _, value in values[-1:])
            raise PermanentError(
                f"UPS {self.name}: {command} over {self.settings.mib}: the agent refused "
                f"{shown} ({refused}); check the card's write access for this community or user"
            )

    async def write(self, doing: str, values: Sequence[tuple[str, SetValue]]) -> str | None:
        """One SET of ``values``, which the agent applies all or none; why the agent refused
        it (its error status), or None when it took it."""
        try:
            target = await self._transport()
            error, status, _, binds = await set_cmd(
                shared_engine(),
                self._auth_data(),
                target,
                ContextData(contextName=self.settings.context),
                *(ObjectType(ObjectIdentity(oid), value) for oid, value in values),
            )
        except (OSError, ValueError, PySnmpError) as exc:
            raise UpsUnreachable(f"{self.where}: {doing}: {_first_line(exc)}") from exc
        self._check(error, 0, 0)
        if status:
            return str(status.prettyPrint())
        # an agent that answers a SET of an object it does not serve with noSuchInstance
        # (snmpsim does) did not do it either
        if any(snmp_value(value) is None for _, value in binds):
            return "noSuchInstance"
        return None

    async def get(self, oids: Mapping[str, str]) -> Values:
        """Named objects read in one GET; a missing one reads None."""
        return await self._get(oids)

    async def battery_test_result(self) -> TestResult:
        """``BatteryTests``: the MIB's test result objects (``control.TEST_RESULTS``)."""
        try:
            values = await self._get(TEST_RESULTS[self.settings.mib])
        except (OSError, ValueError, PySnmpError) as exc:
            raise UpsUnreachable(f"{self.where}: {_first_line(exc)}") from exc
        return test_result(self.settings.mib, values)

    async def diagnose(self, commands: Sequence[str]) -> list[Finding]:
        """``UpsDiagnosis``: see ``checks``."""
        return await SnmpCheck(self, commands).run()

    async def watch_for_changes(self, changed: Callable[[], None]) -> None:
        """Call ``changed`` on each trap of this UPS that announces a change (``traps``), until
        cancelled; returns at once when the site file gives no ``trap_port``.

        Raises ``PermanentError`` when the trap port cannot be opened, ``ConfigError`` when
        the credentials cannot be read. An SNMPv3 UPS's traps count once a poll has met its
        engine (their keys are localized to its engine id).
        """
        s = self.settings
        if s.trap_port is None:
            return
        target = await self._resolved()
        auth = self._auth_data()
        engine_id = agent_engine_id(_address(target)) if s.version == "3" else None
        port = open_trap_port(s.trap_address, s.trap_port)
        try:
            listener = port.listen(auth, _address(target)[0], changed, engine_id)
        except BaseException:
            stop_listening(port, None)  # closes a port nobody else listens on
            raise
        self._traps, self._trap_engine_id = (port, listener), engine_id
        try:
            await asyncio.Event().wait()
        finally:
            self._traps = None
            stop_listening(port, listener)

    async def _resolved(self) -> UdpTransportTarget:
        """The agent's address: traps must come from it. Waits while the name does not
        resolve (a DNS server may be down with the power)."""
        while True:
            try:
                return await self._transport()
            except UpsUnreachable as exc:
                log.warning("%s: its traps wait for its address: %s", self.where, exc)
                await asyncio.sleep(RESOLVE_RETRY_S)

    def _follow_engine_id(self) -> None:
        """A poll met the agent's engine: its SNMPv3 traps can be checked with that id now."""
        if self._traps is None or self._target is None or self.settings.version != "3":
            return
        engine_id = agent_engine_id(_address(self._target))
        if engine_id is not None and engine_id != self._trap_engine_id:
            self._traps[0].allow(self._auth_data(), engine_id)
            self._trap_engine_id = engine_id

    async def close(self) -> None:
        if self._target is not None:
            self._target = None
            leave_engine()


def _address(target: UdpTransportTarget) -> tuple[str, int]:
    host, port = target.transport_address[:2]
    return str(host), int(port)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
