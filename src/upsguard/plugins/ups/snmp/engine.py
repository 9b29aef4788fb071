"""The SNMP engine the polls share, and the credentials of the site file as pysnmp wants them.

One ``SnmpEngine`` per event loop serves every SNMP UPS (a new engine's first request costs
about 0.4 s); the last source to leave closes it. The engine also remembers the SNMPv3 engine
id each agent answered with (RFC 3414 discovery, seen through pysnmp's observer of incoming
responses): a UPS's traps come from that same engine, and a trap receiver can only check an
SNMPv3 trap's authentication with the sender's engine id.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any

from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    SnmpEngine,
    UsmUserData,
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

from upsguard.config.types import resolve_secret
from upsguard.config.ups import SnmpSettings
from upsguard.models import UpsName

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
_USM = 3  # the SNMPv3 user-based security model
Address = tuple[str, int]


@dataclass(slots=True)
class _Engine:
    """The engine of one event loop, how many sources use it, and the agents' engine ids."""

    engine: SnmpEngine
    users: int = 0
    agent_ids: dict[Address, bytes] = field(default_factory=dict)

    def remember_agent(
        self, engine: SnmpEngine, point: str, variables: dict[str, Any], ctx: Any
    ) -> None:
        """pysnmp's observer of every authenticated response (``prepareDataElements``)."""
        if int(variables["securityModel"]) == _USM:
            host, port = variables["transportAddress"][:2]
            self.agent_ids[(str(host), int(port))] = bytes(variables["securityEngineId"])


_ENGINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Engine] = (
    weakref.WeakKeyDictionary()
)


def shared_engine() -> SnmpEngine:
    return _ENGINES[asyncio.get_running_loop()].engine


def join_engine() -> None:
    loop = asyncio.get_running_loop()
    slot = _ENGINES.get(loop)
    if slot is None:
        slot = _ENGINES[loop] = _Engine(SnmpEngine())
        slot.engine.observer.register_observer(
            slot.remember_agent, "rfc3412.prepareDataElements:response"
        )
    slot.users += 1


def leave_engine() -> None:
    loop = asyncio.get_running_loop()
    slot = _ENGINES.get(loop)
    if slot is None:
        return
    slot.users -= 1
    if slot.users <= 0:
        del _ENGINES[loop]
        slot.engine.close_dispatcher()


def agent_engine_id(address: Address) -> bytes | None:
    """The SNMPv3 engine id the agent at ``address`` answered with, once a poll met it."""
    slot = _ENGINES.get(asyncio.get_running_loop())
    return None if slot is None else slot.agent_ids.get(address)


def auth_data(name: UpsName, s: SnmpSettings) -> CommunityData | UsmUserData:
    """The credentials of the site file, read from their files or variables; the site file
    said which security it wants (``SnmpSettings`` checked), so nothing is implied here."""
    if s.version != "3":
        community = resolve_secret(f"UPS {name}: SNMP community", s.community_file, s.community_env)
        if community is None:  # allow_public_community: true
            community = "public"
        return CommunityData(community, mpModel=0 if s.version == "1" else 1)
    auth_key = resolve_secret(f"UPS {name}: SNMP auth key", s.auth_key_file, s.auth_key_env)
    priv_key = resolve_secret(f"UPS {name}: SNMP privacy key", s.priv_key_file, s.priv_key_env)
    return UsmUserData(
        s.user,
        authKey=auth_key,
        privKey=priv_key,
        authProtocol=_AUTH[s.auth_protocol] if auth_key is not None else None,
        privProtocol=_PRIV[s.priv_protocol] if priv_key is not None else None,
    )
