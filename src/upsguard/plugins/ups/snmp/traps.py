"""Traps from SNMP UPSes: one receiver per local UDP port, shared by the UPSes that name it.

A trap is a change of a UPS only when all of these hold:

- it comes from the address the UPS's polls go to;
- it carries the UPS's v1/v2c community (a v1 or a v2c trap: APC cards send v1), or comes
  from the UPS's SNMPv3 user at the security level of the polls, authenticated with the key
  localized to the agent's engine id (which the polls learned: ``engine.agent_engine_id``);
- it announces a change upsguard reads (``NEWS``): UPS-MIB's upsTraps (on battery, test
  completed, alarm added or removed: power back and low battery come as alarms) or PowerNet's
  on battery, low battery, power restored, return from low battery, and self-test results.

Each receiver has an SNMP engine of its own, holding only the communities and users of the UPSes
that listen on its port, so a poll's configuration never opens the trap port to anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysnmp.carrier.asyncio.dgram import udp
from pysnmp.entity import config
from pysnmp.entity.rfc3413 import ntfrcv
from pysnmp.hlapi.v3arch.asyncio import CommunityData, SnmpEngine, UsmUserData
from pysnmp.proto.rfc1902 import OctetString

from upsguard.errors import PermanentError

log = logging.getLogger(__name__)

_UPS_TRAPS = "1.3.6.1.2.1.33.2"  # RFC 1628 upsTraps
_APC_TRAPS = "1.3.6.1.4.1.318.0"  # PowerNet's SNMPv1 traps as SNMPv2 trap OIDs (RFC 3584)
NEWS = frozenset(
    [
        # upsTrapOnBattery, upsTrapTestCompleted, upsTrapAlarmEntryAdded, ...Removed,
        # in the SNMPv2 form and as SNMPv1 traps (enterprise upsTraps, specific 1..4)
        *(f"{_UPS_TRAPS}.{n}" for n in (1, 2, 3, 4)),
        *(f"{_UPS_TRAPS}.0.{n}" for n in (1, 2, 3, 4)),
        # upsDiagnosticsFailed(3), upsDischarged(4), upsOnBattery(5), lowBattery(7),
        # powerRestored(9), upsDiagnosticsPassed(10), returnFromLowBattery(11)
        *(f"{_APC_TRAPS}.{n}" for n in (3, 4, 5, 7, 9, 10, 11)),
    ]
)
_TRAP_OID = "1.3.6.1.6.3.1.1.4.1.0"  # snmpTrapOID.0
_LEVELS = {"noAuthNoPriv": 1, "authNoPriv": 2, "authPriv": 3}


@dataclass(eq=False, slots=True)
class Listener:
    """A UPS that listens: where its traps come from, who sends them, whom to tell."""

    address: str
    models: frozenset[int]  # SNMP security models: 1 v1, 2 v2c, 3 USM
    security_name: str
    level: int
    changed: Callable[[], None]


@dataclass(slots=True)
class _Sender:
    """Who sent the trap being handled (pysnmp's observer says it just before the callback)."""

    address: str = ""
    model: int = 0
    security_name: str = ""
    level: int = 0


class TrapPort:
    """One local UDP port receiving traps, with an SNMP engine of its own."""

    def __init__(self, address: str, port: int) -> None:
        self.key = (address, port)
        self.where = f"{address}:{port}"
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            raise PermanentError(
                f"cannot listen for SNMP traps on {self.where}: {exc.strerror}; give "
                "snmp.trap_port a free port (below 1024 needs CAP_NET_BIND_SERVICE)"
            ) from exc
        try:
            self.engine = SnmpEngine()
            transport = udp.UdpAsyncioTransport().open_server_mode(sock=sock)
            config.add_transport(self.engine, udp.DOMAIN_NAME, transport)
        except BaseException:
            sock.close()
            raise
        self.listeners: list[Listener] = []
        self._communities: dict[str, str] = {}
        self._sender = _Sender()
        self.engine.observer.register_observer(self._note, "rfc3412.receiveMessage:request")
        ntfrcv.NotificationReceiver(self.engine, self._received)

    def listen(
        self,
        auth: CommunityData | UsmUserData,
        address: str,
        changed: Callable[[], None],
        engine_id: bytes | None,
    ) -> Listener:
        """Tell ``changed`` of the traps from ``address`` with the credentials of the polls."""
        name = self.allow(auth, engine_id)
        if isinstance(auth, CommunityData):
            listener = Listener(address, frozenset({1, 2}), name, 1, changed)
        else:
            listener = Listener(
                address, frozenset({3}), name, _LEVELS[auth.security_level], changed
            )
        self.listeners.append(listener)
        return listener

    def allow(self, auth: CommunityData | UsmUserData, engine_id: bytes | None) -> str:
        """Let the credentials of a UPS in; the security name its traps will arrive with.

        An SNMPv3 user is known only once ``engine_id`` is (a trap is authenticated with a
        key localized to the sender's engine id); calling again with a new one updates it.
        """
        if isinstance(auth, CommunityData):
            community = str(auth.communityName)
            if community not in self._communities:
                index = f"c{len(self._communities) + 1}"
                config.add_v1_system(self.engine, index, community)
                self._communities[community] = index
            return self._communities[community]
        if engine_id is not None:
            config.add_v3_user(
                self.engine,
                auth.userName,
                auth.authentication_protocol,
                auth.authentication_key,
                auth.privacy_protocol,
                auth.privacy_key,
                securityEngineId=OctetString(engine_id),
            )
        return str(auth.userName)

    def _note(self, engine: SnmpEngine, point: str, variables: dict[str, Any], ctx: Any) -> None:
        self._sender = _Sender(
            address=str(variables["transportAddress"][0]),
            model=int(variables["securityModel"]),
            security_name=str(variables["securityName"]),
            level=int(variables["securityLevel"]),
        )

    def _received(
        self,
        engine: SnmpEngine,
        state: Any,
        context_engine_id: Any,
        context_name: Any,
        var_binds: Any,
        ctx: Any,
    ) -> None:
        sender, self._sender = self._sender, _Sender()
        trap = next((str(v) for name, v in var_binds if str(name) == _TRAP_OID), "")
        if trap not in NEWS:
            log.debug("trap %s from %s on %s: not a change", trap, sender.address, self.where)
            return
        for listener in self.listeners:
            if (
                sender.address == listener.address
                and sender.model in listener.models
                and sender.security_name == listener.security_name
                and sender.level >= listener.level
            ):
                listener.changed()

    def close(self) -> None:
        self.engine.close_dispatcher()


_PORTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], TrapPort]] = (
    weakref.WeakKeyDictionary()
)


def open_trap_port(address: str, port: int) -> TrapPort:
    """The receiver of ``address:port`` on this event loop, opened by its first listener."""
    ports = _PORTS.setdefault(asyncio.get_running_loop(), {})
    if (address, port) not in ports:
        ports[(address, port)] = TrapPort(address, port)
    return ports[(address, port)]


def stop_listening(port: TrapPort, listener: Listener | None) -> None:
    """The last listener of a port closes it."""
    if listener is not None:
        with contextlib.suppress(ValueError):
            port.listeners.remove(listener)
    if not port.listeners:
        ports = _PORTS.get(asyncio.get_running_loop(), {})
        if ports.get(port.key) is port:
            del ports[port.key]
        port.close()
