"""Resources: the things the runbooks stop and start, and what each needs running."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from upsguard.config.base import Credentials, Model
from upsguard.config.types import Duration, HealthUrl, Interval, LocalPath, PassEnv
from upsguard.models import ResourceId, ResourceKind

Fallback = Literal["power_off", "skip", "fail"]

#: How long stopping and starting take when neither the site file nor the platform says.
DEFAULT_STOP_S = {
    ResourceKind.VM: 60.0,
    ResourceKind.VM_GROUP: 60.0,
    ResourceKind.HOST: 180.0,
    ResourceKind.STORAGE: 120.0,
    ResourceKind.SWITCH: 60.0,
    ResourceKind.COMMAND: 30.0,
    ResourceKind.CLUSTER: 30.0,
}
DEFAULT_START_S = {
    ResourceKind.VM: 90.0,
    ResourceKind.VM_GROUP: 90.0,
    ResourceKind.HOST: 300.0,
    ResourceKind.STORAGE: 240.0,
    ResourceKind.SWITCH: 120.0,
    ResourceKind.COMMAND: 30.0,
    ResourceKind.CLUSTER: 60.0,
}
"""After a graceful stop timed out: power off, leave it running, or fail the step."""

#: A MAC address as ``ip link`` shows it, or with dashes or no separator.
MAC_ADDRESS = re.compile(r"^[0-9a-f]{2}([:-]?)[0-9a-f]{2}(\1[0-9a-f]{2}){4}$", re.IGNORECASE)

#: One resource draws at most a megawatt.
MAX_WATTS = 1_000_000


class Selector(Model):
    """Which VMs a ``vm_group`` covers; every given criterion must match."""

    name: str | None = Field(None, description="glob on the VM name, e.g. 'web-*'")
    folder: str | None = Field(None, description="folder path, e.g. 'Prod/Web'")
    tag: str | None = Field(None, description="vSphere tag as 'category:name'")
    attribute: dict[str, str] | None = Field(None, description="custom attribute name: value")

    @model_validator(mode="after")
    def _not_empty(self) -> Selector:
        if not any((self.name, self.folder, self.tag, self.attribute)):
            raise ValueError("a selector needs at least one of name, folder, tag, attribute")
        return self

    def describe(self) -> str:
        """As a plan says it: ``name web-*, folder Prod/Web, attribute tier=batch`` (the
        attributes as ``upsguard inventory`` shows them)."""
        words = [
            f"{field} {value}"
            for field, value in (("name", self.name), ("folder", self.folder), ("tag", self.tag))
            if value is not None
        ]
        words += [f"attribute {k}={v}" for k, v in sorted((self.attribute or {}).items())]
        return ", ".join(words)


#: An HTTP header's name (RFC 9110 token): no colon, no space, no line break.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class HttpCheck(Credentials):
    """A URL that must answer 2xx, and how to log in to it: HTTP basic (``user`` with
    ``password_file`` or ``password_env``), or one header whose value is read from
    ``value_file`` or ``value_env`` (``header: X-Api-Key``; ``header: Authorization`` with
    ``Bearer ...`` in the file). Never in the URL: the URL is shown in logs and events."""

    url: HealthUrl
    header: str | None = Field(None, description="a header sent with value_file's content")
    value_file: LocalPath | None = None
    value_env: str | None = None
    verify_tls: bool = True
    ca_file: LocalPath | None = Field(
        None, description="CA bundle that signs the server's certificate"
    )

    @model_validator(mode="after")
    def _one_way_to_log_in(self) -> HttpCheck:
        for a, b in (("password_file", "password_env"), ("value_file", "value_env")):
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise ValueError(f"give one of {a}, {b}")
        password = self.password_file is not None or self.password_env is not None
        value = self.value_file is not None or self.value_env is not None
        if (self.user is None) != (not password):
            raise ValueError("HTTP basic needs both user and password_file (or password_env)")
        if (self.header is None) != (not value):
            raise ValueError("a header needs both header (its name) and value_file (or value_env)")
        if self.user is not None and self.header is not None:
            raise ValueError("give user and a password, or a header, not both")
        if self.header is not None and not _HEADER_NAME.fullmatch(self.header):
            raise ValueError("header: not a header name (letters, digits, '-', no colon)")
        return self


def _url_alone(value: object) -> object:
    """``http: URL`` is short for ``http: {url: URL}``."""
    return {"url": value} if isinstance(value, str) else value


class HealthCheck(Model):
    """What must answer before a started resource counts as up."""

    tcp: str | None = Field(None, description="host:port that must accept a connection")
    http: (
        Annotated[HttpCheck, BeforeValidator(_url_alone, json_schema_input_type=str | HttpCheck)]
        | None
    ) = Field(None, description="URL that must answer 2xx, or {url, user, password_file, ...}")
    command: str | None = Field(None, description="command that must exit 0")
    pass_env: PassEnv = Field(default_factory=list)
    platform: bool = Field(True, description="the platform's own check (Tools running, connected)")
    timeout: Duration = timedelta(minutes=10)
    interval: Interval = timedelta(seconds=5)


class Estimate(Model):
    """How long stopping and starting take, for the plan and the simulator."""

    stop: Duration | None = None
    start: Duration | None = None


class SshCommands(Model):
    """How a resource's own commands run on its device over SSH (a platform of type ssh)."""

    once: bool = Field(
        False,
        description="run shutdown and startup under flock on the device, so that a copy sent "
        "again after a restart is refused while the first still runs there (needs a POSIX "
        "shell and flock on the device)",
    )


class ResourceConfig(Model):
    id: ResourceId
    kind: ResourceKind
    platform: str | None = Field(
        None, description="a key of 'platforms', or a type needing no settings (ssh, command, none)"
    )
    vm: str | None = Field(None, description="VM name on the platform (kind vm); default: the id")
    host: str | None = Field(None, description="address or name on the platform; default: the id")
    select: Selector | None = None
    count: int | None = Field(
        None,
        ge=0,
        le=100_000,
        description="vm_group: members expected, for plans made without inventory",
    )
    runs_on: list[ResourceId] = Field(
        default_factory=list,
        description="hosts a VM runs on, when known without live inventory",
    )
    depends_on: list[ResourceId] = Field(default_factory=list)
    watts: float = Field(0.0, ge=0, le=MAX_WATTS)
    shed: bool = Field(False, description="stop early, while shedding load, to buy runtime")
    stop: bool | None = Field(
        None, description="stopped by the shutdown runbook; default: yes, except switches"
    )
    start: bool | None = Field(
        None, description="started by the startup runbook; default: yes, except switches"
    )
    guest_timeout: Duration = Field(
        timedelta(minutes=5), description="graceful shutdown time before the fallback"
    )
    fallback: Fallback = "power_off"
    retries: int = Field(2, ge=0, le=20)
    maintenance_mode: bool = False
    power_on_via: str | None = Field(None, description="a platform (BMC, WoL) that powers it on")
    shutdown: str | None = Field(None, description="command for ssh and command platforms")
    startup: str | None = Field(None, description="command for ssh and command platforms")
    status: str | None = Field(None, description="exits 0 while it is up (ssh, command)")
    mac: str | None = Field(None, description="MAC address for Wake-on-LAN (wol platform)")
    ssh: SshCommands | None = Field(
        None, description="how its commands run on the device (ssh platform): {once: true}"
    )
    health: HealthCheck | None = None
    estimate: Estimate = Estimate()
    serves_platform: str | None = Field(
        None, description="this VM is the manager of that platform (vCenter): it goes last"
    )
    cluster: Literal["ha", "ceph_flags"] | None = Field(
        None,
        description="kind cluster: the cluster state a shutdown changes and a startup puts "
        "back: 'ha' (disarmed before any guest of the platform stops) or 'ceph_flags' (set "
        "once every guest of the platform is down, before its nodes stop)",
    )
    ceph_monitor: bool = Field(
        False,
        description="kind host: the node runs a Ceph monitor; it stops after the nodes that "
        "do not (the monitors keep their quorum until the end), and starts first",
    )
    runs_upsguard: bool = Field(False, description="upsguard itself runs here: it goes last")
    contact: str | None = Field(
        None, description="who to call about it: a name from 'contacts', or any text (run book)"
    )
    manual: str | None = Field(
        None, description="how to stop and start it by hand when upsguard is down (run book)"
    )

    @field_validator("mac")
    @classmethod
    def _a_mac_address(cls, mac: str | None) -> str | None:
        if mac is not None and not MAC_ADDRESS.match(mac):
            raise ValueError(f"not a MAC address: {mac!r}: write it like 'aa:bb:cc:dd:ee:ff'")
        return mac

    @model_validator(mode="after")
    def _kind_fields(self) -> ResourceConfig:
        if self.kind is ResourceKind.VM_GROUP and self.select is None:
            raise ValueError("a vm_group needs 'select'")
        if self.kind is not ResourceKind.VM_GROUP and self.select is not None:
            raise ValueError("'select' is only for kind vm_group")
        if self.kind is ResourceKind.COMMAND and not (self.shutdown or self.startup):
            raise ValueError("a command resource needs 'shutdown' or 'startup'")
        if (self.kind is ResourceKind.CLUSTER) != (self.cluster is not None):
            raise ValueError("'cluster' (ha or ceph_flags) is for kind cluster, and it needs one")
        if self.ceph_monitor and self.kind is not ResourceKind.HOST:
            raise ValueError("'ceph_monitor' is only for kind host")
        return self

    @property
    def stops(self) -> bool:
        if self.stop is not None:
            return self.stop
        return self.kind is not ResourceKind.SWITCH and self.platform not in (None, "none")

    @property
    def starts(self) -> bool:
        if self.start is not None:
            return self.start
        return self.kind is not ResourceKind.SWITCH and self.platform not in (None, "none")

    @property
    def stop_estimate_s(self) -> float:
        """How long stopping it takes: its ``estimate.stop``, else the default for its kind."""
        given = self.estimate.stop
        return given.total_seconds() if given is not None else DEFAULT_STOP_S[self.kind]

    @property
    def target_name(self) -> str:
        if self.kind is ResourceKind.VM:
            return self.vm or self.id
        return self.host or self.id
