"""UPS entries of the site file: where to read each UPS and its battery model."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from datetime import timedelta
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from upsguard.config.base import Credentials, Model
from upsguard.config.checks_schedule import BatteryTestConfig
from upsguard.config.types import Duration, LocalPath
from upsguard.config.values import shorten
from upsguard.errors import ConfigError
from upsguard.models import UpsName

#: A UPS (or a bank of them) carries at most ten megawatts.
MAX_UPS_WATTS = 10_000_000
SOURCES = ("nut", "snmp", "simulated")
_WRITE = {
    "nut": "nut: {ups: NAME, host: ADDRESS}",
    "snmp": "snmp: {host: ADDRESS, community_file: FILE}",
    "simulated": "simulated: {}",
}


class NutSettings(Credentials):
    """A UPS served by NUT's upsd."""

    host: str = "127.0.0.1"
    port: int = Field(3493, ge=1, le=65535)
    ups: str = Field(description="the UPS name on upsd, as in upsc NAME@HOST")
    starttls: bool = Field(
        False, description="TLS to upsd (needs CERTFILE or CERTPATH in upsd.conf); off by default"
    )
    allow_plaintext: bool = Field(
        False,
        description="upsd on another machine without starttls: accepted, no warning (the "
        "login and readings cross the network in clear)",
    )
    ca_file: LocalPath | None = None
    timeout: Duration = timedelta(seconds=5)
    monitor: Literal["none", "secondary", "primary"] = Field(
        "none", description="log in like upsmon so that upsd counts us and FSD reaches us"
    )

    @property
    def in_clear_over_network(self) -> bool:
        """Whether upsd is on another machine and nothing protects or accepts the clear
        text: the password (and readings a forger could replace) cross the network."""
        if self.starttls or self.allow_plaintext:
            return False
        return not self.on_this_machine

    @property
    def on_this_machine(self) -> bool:
        """Whether upsd is on the machine upsguard runs on: a loopback address or localhost."""
        host = self.host.strip("[]").lower().rstrip(".")
        if host == "localhost" or host.endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:  # a name: only its resolver knows, and names rarely mean loopback
            return False


class SnmpSettings(Model):
    """A UPS with an SNMP card, read through UPS-MIB (RFC 1628) or APC PowerNet.

    Nothing about its security is implied: v1/v2c needs its community from a file or a
    variable (or ``allow_public_community: true``), v3 needs an auth key (or
    ``security: noAuthNoPriv`` written out). Traps are listened for only when ``trap_port``
    is given.
    """

    _TESTS: ClassVar[frozenset[str]] = frozenset(
        {"test.battery.start.quick", "test.battery.start.deep", "test.battery.stop"}
    )
    COMMANDS: ClassVar[Mapping[str, frozenset[str]]] = {
        "ups-mib": frozenset({"load.off", "load.off.delay", "shutdown.return", "shutdown.stayoff"})
        | _TESTS,
        "powernet": frozenset({"load.off", "load.off.delay", "shutdown.return", "shutdown.stayoff"})
        | _TESTS,
    }
    """The commands each MIB has SETs for (``plugins/ups/snmp`` sends them)."""

    host: str
    port: int = Field(161, ge=1, le=65535)
    mib: Literal["ups-mib", "powernet"] = "ups-mib"
    version: Literal["1", "2c", "3"] = "2c"
    community: SkipJsonSchema[None] = Field(None, exclude=True)  # refused: a secret inline
    community_file: LocalPath | None = None
    community_env: str | None = None
    allow_public_community: bool = Field(
        False, description="v1/v2c with the well-known community 'public' (no secret at all)"
    )
    user: str | None = None
    security: Literal["authPriv", "authNoPriv", "noAuthNoPriv"] | None = Field(
        None,
        description="SNMPv3 level; taken from the keys given, but noAuthNoPriv must be written",
    )
    auth_protocol: Literal["md5", "sha", "sha224", "sha256", "sha384", "sha512"] = "sha"
    auth_key_file: LocalPath | None = None
    auth_key_env: str | None = None
    priv_protocol: Literal["des", "3des", "aes", "aes192", "aes256"] = "aes"
    priv_key_file: LocalPath | None = None
    priv_key_env: str | None = None
    context: str = ""
    timeout: Duration = timedelta(seconds=2)
    retries: int = Field(2, ge=0, le=10)
    trap_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="listen on this UDP port for the UPS's traps and poll at once on one "
        "(not listened for when not given)",
    )
    trap_address: str = Field("0.0.0.0", description="the local address of the trap port")

    @field_validator("community", mode="before")
    @classmethod
    def _no_inline_community(cls, value: object) -> object:
        """Its own error type: the loader hides a secret field's value errors, and this one
        holds no value to hide."""
        raise PydanticCustomError(
            "inline_secret",
            "inline 'community' is not accepted: put it in a file (community_file) or an "
            "environment variable (community_env), or write allow_public_community: true "
            "for 'public'",
        )

    @model_validator(mode="after")
    def _security_said_explicitly(self) -> SnmpSettings:
        if self.version == "3":
            self._check_v3()
        else:
            self._check_community()
        return self

    def _check_community(self) -> None:
        given = [n for n in ("community_file", "community_env") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError("give one of community_file, community_env")
        if given and self.allow_public_community:
            raise ValueError(f"allow_public_community: true and {given[0]}: choose one")
        if not given and not self.allow_public_community:
            raise ValueError(
                f"SNMP v{self.version} needs its community: give community_file or "
                "community_env, or write allow_public_community: true to use 'public'"
            )

    def _check_v3(self) -> None:
        if not self.user:
            raise ValueError("SNMP version 3 needs 'user'")
        level = self.keys_level
        if level == "privacy without auth":
            raise ValueError(
                "SNMPv3 privacy needs an auth key too: give auth_key_file or auth_key_env"
            )
        if self.security is None and level == "noAuthNoPriv":
            raise ValueError(
                "SNMPv3 without an auth key: give auth_key_file or auth_key_env (and "
                "priv_key_file or priv_key_env for privacy), or write security: noAuthNoPriv"
            )
        if self.security is not None and self.security != level:
            raise ValueError(f"security: {self.security} but the keys given make {level}")

    @property
    def keys_level(self) -> str:
        """The SNMPv3 security level the key files and variables given make."""
        auth = self.auth_key_file is not None or self.auth_key_env is not None
        priv = self.priv_key_file is not None or self.priv_key_env is not None
        if priv:
            return "authPriv" if auth else "privacy without auth"
        return "authNoPriv" if auth else "noAuthNoPriv"


class SimulatedUpsSettings(Model):
    """A UPS that exists only in the simulator (and in ``upsguard demo``)."""

    start_charge: float = Field(100.0, ge=0, le=100)


class RuntimeAt(Model):
    """One reference point of the battery: it lasts ``minutes`` at ``load_watts``."""

    minutes: float = Field(gt=0, le=10_080, description="at most a week")
    load_watts: float = Field(gt=0, le=MAX_UPS_WATTS)


LOAD_CYCLE_COMMANDS = frozenset({"shutdown.return", "shutdown.reboot", "shutdown.reboot.graceful"})
"""NUT instant commands after which the UPS cuts its output and brings it back by itself,
mains or not: the path back for a site whose controller stops its own machine."""


class UpsCommandPolicy(Model):
    """What to tell the UPS once everything is down (NUT instant commands)."""

    command: str | None = Field(
        None, description="NUT instant command, e.g. shutdown.return or load.off.delay"
    )
    delay: Duration = timedelta(seconds=120)

    @property
    def brings_power_back(self) -> bool:
        """The command cycles the UPS's output: power comes back without a person."""
        return self.command in LOAD_CYCLE_COMMANDS


class UpsConfig(Model):
    name: UpsName
    nut: NutSettings | None = None
    snmp: SnmpSettings | None = None
    simulated: SimulatedUpsSettings | None = None
    runtime_at: RuntimeAt | None = Field(
        None, description="battery model reference point; without it the UPS's own estimate is used"
    )
    peukert_exponent: float = Field(1.15, ge=1.0, le=1.6)
    other_load_watts: float = Field(
        0.0, ge=0, le=MAX_UPS_WATTS, description="load not described by resources"
    )
    low_battery_charge: float = Field(20.0, ge=0, le=100)
    low_battery_runtime: Duration = timedelta(minutes=2)
    link_grace: Duration = Field(
        timedelta(seconds=15),
        description="a link loss shorter than this, while on mains, is not an outage",
    )
    at_shutdown_end: UpsCommandPolicy = UpsCommandPolicy()
    battery_test: BatteryTestConfig | None = Field(
        None, description="a scheduled battery test of this UPS (off when not given)"
    )

    @property
    def commands(self) -> list[str]:
        """The instant commands upsguard sends this UPS (NUT-style names): the one at the
        end of a shutdown, and the battery test's start and stop."""
        found = [self.at_shutdown_end.command] if self.at_shutdown_end.command else []
        if self.battery_test is not None:
            found += [self.battery_test.command, "test.battery.stop"]
        return found

    @model_validator(mode="before")
    @classmethod
    def _no_empty_source(cls, data: object) -> object:
        """``nut:`` with its body commented out must not quietly become another source."""
        if isinstance(data, dict):
            for name in SOURCES:
                if name in data and data[name] is None:
                    raise ValueError(f"'{name}:' is empty: write {_WRITE[name]}")
        return data

    @model_validator(mode="after")
    def _exactly_one_source(self) -> UpsConfig:
        given = [n for n in SOURCES if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of nut, snmp, simulated (got {', '.join(given)})")
        if not given:
            raise ValueError(
                f"UPS {shorten(self.name)!r} has no source: write {_WRITE['nut']} or "
                f"{_WRITE['snmp']}, or {_WRITE['simulated']} for one that exists only in the "
                "simulator"
            )
        return self

    @property
    def source_type(self) -> str:
        """``nut``, ``snmp`` or ``simulated``: validation made sure exactly one is given."""
        for name in SOURCES:
            if getattr(self, name) is not None:
                return name
        raise ConfigError(f"UPS {shorten(self.name)!r} has no source: write {_WRITE['nut']}")
