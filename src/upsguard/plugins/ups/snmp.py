"""A UPS with an SNMP card, read with pysnmp's asyncio API (v1, v2c, v3 authPriv).

Two MIBs map onto NUT's status words, so the layers above see one kind of reading:

- the standard UPS-MIB (RFC 1628): ``upsOutputSource`` gives OL/OB/BYPASS/BOOST/TRIM/OFF,
  ``upsBatteryStatus`` low or depleted gives LB, ``upsAlarmsPresent`` > 0 gives ALARM and
  the alarm table refines it (on battery, low battery, overload, replace battery, test in
  progress, shutdown pending);
- APC PowerNet: ``upsBasicOutputStatus`` (on battery test gives OB CAL),
  ``upsBasicBatteryStatus``, ``upsAdvBatteryReplaceIndicator``, charge in tenths of a
  percent when the card has ``upsHighPrecBatteryCapacity``, runtime in TimeTicks.

``upsSecondsOnBattery`` is kept in ``raw`` only while the output source says battery: some
agents leave the count of an earlier outage standing, and a UPS on line is never on battery
because of it. One ``SnmpEngine`` per event loop is shared by every SNMP UPS (a new engine's
first request costs about 0.4 s).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pysnmp.error import PySnmpError
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    bulk_cmd,
    get_cmd,
    usm3DESEDEPrivProtocol,
    usmAesCfb128Protocol,
    usmAesCfb192Protocol,
    usmAesCfb256Protocol,
    usmDESPrivProtocol,
    usmHMAC128SHA224AuthProtocol,
    usmHMAC192SHA256AuthProtocol,
    usmHMAC256SHA384AuthProtocol,
    usmHMAC384SHA512AuthProtocol,
    usmHMACMD5AuthProtocol,
    usmHMACSHAAuthProtocol,
)
from pysnmp.proto.rfc1905 import EndOfMibView, NoSuchInstance, NoSuchObject

from upsguard.clock import Clock
from upsguard.config.types import resolve_secret
from upsguard.config.ups import SnmpSettings, UpsConfig
from upsguard.errors import AuthenticationError, ConfigError, PermanentError, UpsUnreachable
from upsguard.models import UpsFlag, UpsName, UpsReading

UPS_MIB = "1.3.6.1.2.1.33.1"
UPS_MIB_OIDS = {
    "upsBatteryStatus": f"{UPS_MIB}.2.1.0",
    "upsSecondsOnBattery": f"{UPS_MIB}.2.2.0",
    "upsEstimatedMinutesRemaining": f"{UPS_MIB}.2.3.0",
    "upsEstimatedChargeRemaining": f"{UPS_MIB}.2.4.0",
    "upsInputVoltage.1": f"{UPS_MIB}.3.3.1.3.1",
    "upsOutputSource": f"{UPS_MIB}.4.1.0",
    "upsOutputPercentLoad.1": f"{UPS_MIB}.4.4.1.5.1",
    "upsAlarmsPresent": f"{UPS_MIB}.6.1.0",
    "upsTestResultsSummary": f"{UPS_MIB}.7.3.0",
}
UPS_ALARM_DESCR = f"{UPS_MIB}.6.2.1.2"
_WELL_KNOWN_ALARMS = f"{UPS_MIB}.6.3."
# upsWellKnownAlarms (RFC 1628 section 6.3) that say more than ALARM.
_ALARM_FLAGS = {
    1: UpsFlag.RB,  # upsAlarmBatteryBad
    3: UpsFlag.LB,  # upsAlarmLowBattery
    4: UpsFlag.LB,  # upsAlarmDepletedBattery
    8: UpsFlag.OVER,  # upsAlarmOutputOverload
    22: UpsFlag.FSD,  # upsAlarmShutdownPending
    23: UpsFlag.FSD,  # upsAlarmShutdownImminent
    24: UpsFlag.CAL,  # upsAlarmTestInProgress
}
# upsOutputSource: other(1) none(2) normal(3) bypass(4) battery(5) booster(6) reducer(7)
_OUTPUT_SOURCE = {
    2: {UpsFlag.OFF},
    3: {UpsFlag.OL},
    4: {UpsFlag.OL, UpsFlag.BYPASS},
    5: {UpsFlag.OB, UpsFlag.DISCHRG},
    6: {UpsFlag.OL, UpsFlag.BOOST},
    7: {UpsFlag.OL, UpsFlag.TRIM},
}

APC = "1.3.6.1.4.1.318.1.1.1"
POWERNET_OIDS = {
    "upsBasicBatteryStatus": f"{APC}.2.1.1.0",
    "upsAdvBatteryCapacity": f"{APC}.2.2.1.0",
    "upsAdvBatteryRunTimeRemaining": f"{APC}.2.2.3.0",
    "upsAdvBatteryReplaceIndicator": f"{APC}.2.2.4.0",
    "upsHighPrecBatteryCapacity": f"{APC}.2.3.1.0",
    "upsAdvInputLineVoltage": f"{APC}.3.2.1.0",
    "upsBasicOutputStatus": f"{APC}.4.1.1.0",
    "upsAdvOutputLoad": f"{APC}.4.2.3.0",
}
# upsBasicOutputStatus, PowerNet-MIB.
_APC_OUTPUT = {
    2: {UpsFlag.OL},  # onLine
    3: {UpsFlag.OB, UpsFlag.DISCHRG},  # onBattery
    4: {UpsFlag.OL, UpsFlag.BOOST},  # onSmartBoost
    5: {UpsFlag.OFF},  # timedSleeping
    6: {UpsFlag.OL, UpsFlag.BYPASS},  # softwareBypass
    7: {UpsFlag.OFF},  # off
    9: {UpsFlag.OL, UpsFlag.BYPASS},  # switchedBypass
    10: {UpsFlag.OL, UpsFlag.BYPASS, UpsFlag.ALARM},  # hardwareFailureBypass
    11: {UpsFlag.OFF},  # sleepingUntilPowerReturn
    12: {UpsFlag.OL, UpsFlag.TRIM},  # onSmartTrim
    13: {UpsFlag.OL},  # ecoMode
    14: {UpsFlag.OL},  # hotStandby
    15: {UpsFlag.OB, UpsFlag.CAL},  # onBatteryTest
    16: {UpsFlag.OL, UpsFlag.BYPASS},  # emergencyStaticBypass
    18: {UpsFlag.OL},  # powerSavingMode
    20: {UpsFlag.OL},  # eConversion
}

_AUTH = {
    "md5": usmHMACMD5AuthProtocol,
    "sha": usmHMACSHAAuthProtocol,
    "sha224": usmHMAC128SHA224AuthProtocol,
    "sha256": usmHMAC192SHA256AuthProtocol,
    "sha384": usmHMAC256SHA384AuthProtocol,
    "sha512": usmHMAC384SHA512AuthProtocol,
}
_PRIV = {
    "des": usmDESPrivProtocol,
    "3des": usm3DESEDEPrivProtocol,
    "aes": usmAesCfb128Protocol,
    "aes192": usmAesCfb192Protocol,
    "aes256": usmAesCfb256Protocol,
}
# Error indications that mean the agent refused who we are, not that it is away.
_REFUSED = ("digest", "unknownusm", "unknownusername", "ciphering", "decryption", "seclevel")


@dataclass(slots=True)
class _Engine:
    """The engine of one event loop and how many sources use it (the last one closes it)."""

    engine: SnmpEngine
    users: int = 0


_ENGINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Engine] = (
    weakref.WeakKeyDictionary()
)


def _engine() -> SnmpEngine:
    return _ENGINES[asyncio.get_running_loop()].engine


def _join_engine() -> None:
    loop = asyncio.get_running_loop()
    slot = _ENGINES.get(loop)
    if slot is None:
        slot = _ENGINES[loop] = _Engine(SnmpEngine())
    slot.users += 1


def _leave_engine() -> None:
    loop = asyncio.get_running_loop()
    slot = _ENGINES.get(loop)
    if slot is None:
        return
    slot.users -= 1
    if slot.users <= 0:
        del _ENGINES[loop]
        slot.engine.close_dispatcher()


Values = dict[str, int | str | None]


class SnmpSource:
    """One UPS read over SNMP through UPS-MIB or PowerNet (see the module docstring)."""

    def __init__(self, config: UpsConfig, clock: Clock) -> None:
        if config.snmp is None:
            raise ConfigError(f"UPS {config.name}: the snmp source needs an 'snmp' section")
        self.name: UpsName = config.name
        self.settings: SnmpSettings = config.snmp
        self._clock = clock
        self._auth: CommunityData | UsmUserData | None = None
        self._target: UdpTransportTarget | None = None

    @property
    def where(self) -> str:
        s = self.settings
        return f"UPS {self.name}: SNMP agent {s.host}:{s.port}"

    def _auth_data(self) -> CommunityData | UsmUserData:
        if self._auth is None:
            self._auth = auth_data(self.name, self.settings)
        return self._auth

    async def _transport(self) -> UdpTransportTarget:
        if self._target is None:
            _join_engine()
            s = self.settings
            self._target = await UdpTransportTarget.create(
                (s.host, s.port), timeout=s.timeout.total_seconds(), retries=s.retries
            )
        return self._target

    async def _get(self, oids: Mapping[str, str]) -> Values:
        target = await self._transport()  # joins this loop's engine first
        error, status, index, binds = await get_cmd(
            _engine(),
            self._auth_data(),
            target,
            ContextData(contextName=self.settings.context),
            *(ObjectType(ObjectIdentity(oid)) for oid in oids.values()),
        )
        self._check(error, status, index)
        values = [_value(value) for _, value in binds]
        if len(values) != len(oids):
            raise UpsUnreachable(f"{self.where} answered {len(values)} values for {len(oids)}")
        return dict(zip(oids, values, strict=True))

    async def _walk(self, column: str, limit: int = 64) -> list[int | str | None]:
        """The values of one table column (the alarm table is short: a bounded bulk read)."""
        target = await self._transport()
        error, status, index, binds = await bulk_cmd(
            _engine(),
            self._auth_data(),
            target,
            ContextData(contextName=self.settings.context),
            0,
            limit,
            ObjectType(ObjectIdentity(column)),
        )
        self._check(error, status, index)
        prefix = column + "."
        return [_value(v) for name, v in binds if str(name).startswith(prefix)]

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
        raise PermanentError(
            f"UPS {self.name}: SNMP sources send no UPS commands ({name}); "
            "use a NUT source (snmp-ups driver) for instant commands"
        )

    async def close(self) -> None:
        if self._target is not None:
            self._target = None
            _leave_engine()


def auth_data(name: UpsName, s: SnmpSettings) -> CommunityData | UsmUserData:
    """The credentials of the site file, read from their files or variables."""
    if s.version != "3":
        community = s.community or resolve_secret(
            f"UPS {name}: SNMP community", s.community_file, None
        )
        return CommunityData(community or "public", mpModel=0 if s.version == "1" else 1)
    auth_key = resolve_secret(f"UPS {name}: SNMP auth key", s.auth_key_file, s.auth_key_env)
    priv_key = resolve_secret(f"UPS {name}: SNMP privacy key", s.priv_key_file, s.priv_key_env)
    if priv_key is not None and auth_key is None:
        raise ConfigError(f"UPS {name}: SNMPv3 privacy needs an auth key too")
    return UsmUserData(
        s.user,
        authKey=auth_key,
        privKey=priv_key,
        authProtocol=_AUTH[s.auth_protocol] if auth_key is not None else None,
        privProtocol=_PRIV[s.priv_protocol] if priv_key is not None else None,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _value(value: Any) -> int | str | None:
    if isinstance(value, NoSuchObject | NoSuchInstance | EndOfMibView) or value is None:
        return None
    if value.__class__.__name__ in ("NoSuchObject", "NoSuchInstance", "EndOfMibView"):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value.prettyPrint() if hasattr(value, "prettyPrint") else value)


def _num(value: int | str | None, scale: float = 1.0) -> float | None:
    return float(value) * scale if isinstance(value, int) else None


def ups_mib_reading(
    ups: UpsName, at: datetime, v: Mapping[str, int | str | None], alarms: Sequence[Any]
) -> UpsReading:
    """Normalize RFC 1628 values; ``alarms`` are the upsAlarmDescr OIDs (as text)."""
    source = v.get("upsOutputSource")
    flags = set(_OUTPUT_SOURCE.get(source, set()) if isinstance(source, int) else set())
    if v.get("upsBatteryStatus") in (3, 4):  # batteryLow, batteryDepleted
        flags.add(UpsFlag.LB)
    if v.get("upsTestResultsSummary") == 5:  # inProgress
        flags.add(UpsFlag.CAL)
    present = v.get("upsAlarmsPresent")
    if isinstance(present, int) and present > 0:
        flags.add(UpsFlag.ALARM)
    for alarm in alarms:
        text = str(alarm)
        if text.startswith(_WELL_KNOWN_ALARMS):
            flag = _ALARM_FLAGS.get(int(text[len(_WELL_KNOWN_ALARMS) :].split(".")[0]))
            if flag is not None:
                flags.add(flag)
    raw = {k: str(val) for k, val in v.items() if val is not None}
    if UpsFlag.OB not in flags:
        raw.pop("upsSecondsOnBattery", None)  # left over from an earlier outage
    raw["alarms"] = " ".join(str(a) for a in alarms)
    return UpsReading(
        ups=ups,
        at=at,
        flags=frozenset(flags),
        charge_pct=_num(v.get("upsEstimatedChargeRemaining")),
        runtime_s=_num(v.get("upsEstimatedMinutesRemaining"), 60.0),
        load_pct=_num(v.get("upsOutputPercentLoad.1")),
        input_voltage=_num(v.get("upsInputVoltage.1")),
        raw=raw,
    )


def powernet_reading(ups: UpsName, at: datetime, v: Mapping[str, int | str | None]) -> UpsReading:
    """Normalize APC PowerNet values (runtime TimeTicks are hundredths of a second)."""
    status = v.get("upsBasicOutputStatus")
    flags = set(_APC_OUTPUT.get(status, set()) if isinstance(status, int) else set())
    battery = v.get("upsBasicBatteryStatus")
    if battery == 3:  # batteryLow
        flags.add(UpsFlag.LB)
    if battery == 4:  # batteryInFaultCondition
        flags |= {UpsFlag.RB, UpsFlag.ALARM}
    if v.get("upsAdvBatteryReplaceIndicator") == 2:  # batteryNeedsReplacing
        flags.add(UpsFlag.RB)
    load = _num(v.get("upsAdvOutputLoad"))
    if load is not None and load > 100:
        flags.add(UpsFlag.OVER)
    charge = _num(v.get("upsHighPrecBatteryCapacity"), 0.1)
    if charge is None:
        charge = _num(v.get("upsAdvBatteryCapacity"))
    return UpsReading(
        ups=ups,
        at=at,
        flags=frozenset(flags),
        charge_pct=charge,
        runtime_s=_num(v.get("upsAdvBatteryRunTimeRemaining"), 0.01),
        load_pct=load,
        input_voltage=_num(v.get("upsAdvInputLineVoltage")),
        raw={k: str(val) for k, val in v.items() if val is not None},
    )
