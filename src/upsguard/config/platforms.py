"""Platforms: what upsguard talks to in order to stop and start resources.

A resource names a platform either by its key under ``platforms:`` or, for
the kinds that need no settings (``ssh``, ``command``, ``wol``, ``none``,
``simulated``), by the type itself.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from upsguard.config.base import Credentials, Model, refuse_inline_secrets, union_tags
from upsguard.config.resources import ResourceConfig
from upsguard.config.types import Duration, Interval, LocalPath, PassEnv

#: Types a resource may name directly as its platform, with default settings.
IMPLICIT_TYPES = ("ssh", "command", "wol", "none", "simulated")


class PlatformBase(Model):
    max_parallel: int = Field(8, ge=1, le=1000, description="steps run at once on this platform")

    @property
    def fallback_without_tools(self) -> Literal["skip"] | None:
        """What to do with a VM that has no graceful path (no VMware Tools) when the platform
        decides it; None leaves it to the resource's own ``fallback``."""
        return None

    @property
    def leaves_unplanned_vms(self) -> bool:
        """Whether a host step leaves running the VMs no resource covers (else it stops them)."""
        return False

    def typical_duration(self, action: str) -> timedelta | None:
        """How long an action (``guest_shutdown``, ``host_power_on``, ...) takes on this
        platform when the platform itself knows; None for real platforms."""
        return None

    def can_power_on(self, res: ResourceConfig) -> bool:
        """Whether this platform alone can bring the resource back (without its
        ``power_on_via``): a BMC, Wake-on-LAN, a hypervisor for its VMs."""
        return True

    @property
    def reaches_hosts_directly(self) -> bool:
        """Whether upsguard can read its hosts without their manager (vCenter) up."""
        return False

    def host_step_note(self, shutdown: bool) -> str:
        """What a host step does to the host's cluster, as the plan says it ("" for nothing)."""
        return ""


class DirectHostAccess(Credentials):
    """How to reach ESXi hosts directly once vCenter is down."""

    verify_tls: bool = True
    ca_file: LocalPath | None = None


class VsphereSettings(PlatformBase, Credentials):
    type: Literal["vsphere"]
    host: str
    port: int = Field(443, ge=1, le=65535)
    verify_tls: bool = True
    ca_file: LocalPath | None = None
    max_parallel: int = Field(32, ge=1, le=1000)
    direct_hosts: DirectHostAccess | None = Field(
        None, description="credentials for ESXi hosts, used once vCenter itself is down"
    )
    vcenter_silent_after: Interval = Field(
        timedelta(seconds=60),
        description="once vCenter has not answered a request for this long, the steps left go "
        "to the ESXi hosts directly (direct_hosts)",
    )
    watch: Literal["updates", "poll"] = Field(
        "updates",
        description="how waits learn of changes: WaitForUpdatesEx pushes them (best on vCenter), "
        "or one RetrievePropertiesEx of every waited object each poll_interval",
    )
    poll_interval: Interval = Field(
        timedelta(milliseconds=500), description="with watch: poll, the time between reads"
    )
    direct_addresses: dict[str, str] = Field(
        default_factory=dict,
        description="host name in vCenter -> address[:port] to reach that ESXi host directly",
    )
    system_vms: Literal["retreat", "skip"] = Field(
        "retreat", description="vCLS and other system VMs: put the cluster in retreat mode, or skip"
    )
    without_tools: Literal["power_off", "skip"] = "power_off"
    cluster_ha_drs: Literal["set_aside", "leave"] = Field(
        "set_aside",
        description="before the first host of a cluster stops: HA host monitoring disabled and "
        "DRS manual, the values before recorded on the cluster and restored at the startup; or "
        "leave them",
    )
    unplanned_vms: Literal["shutdown", "ignore"] = Field(
        "shutdown", description="VMs no resource covers: shut them down before their host, or leave"
    )

    @property
    def fallback_without_tools(self) -> Literal["skip"] | None:
        return "skip" if self.without_tools == "skip" else None

    def can_power_on(self, res: ResourceConfig) -> bool:
        """vCenter starts VMs; a host it shut down needs its BMC (``power_on_via``)."""
        return not res.kind.is_hardware

    @property
    def leaves_unplanned_vms(self) -> bool:
        return self.unplanned_vms == "ignore"

    @property
    def reaches_hosts_directly(self) -> bool:
        return self.direct_hosts is not None

    def host_step_note(self, shutdown: bool) -> str:
        if self.cluster_ha_drs == "leave":
            return ""
        if shutdown:
            return "set HA host monitoring off and DRS to manual on its cluster (recorded), "
        return "; HA and DRS of its cluster restored as recorded once vCenter answers"


class IpmiSettings(PlatformBase, Credentials):
    type: Literal["ipmi"]
    host: str
    port: int = Field(623, ge=1, le=65535)
    poll_interval: Interval = Field(timedelta(seconds=2), description="how often a wait polls")


class RedfishSettings(PlatformBase, Credentials):
    type: Literal["redfish"]
    host: str = Field(description="address or https URL of the BMC")
    verify_tls: bool = True
    ca_file: LocalPath | None = None
    system_id: str | None = None
    poll_interval: Interval = Field(timedelta(seconds=2), description="how often a wait polls")

    @field_validator("host")
    @classmethod
    def _no_credentials(cls, host: str) -> str:
        """The address is shown in every message about the BMC: no ``user:pw@`` in it."""
        if "@" in host:
            raise ValueError(
                "credentials in the address are not accepted (it is shown in logs and "
                "messages): give user with password_file or password_env"
            )
        return host


class SshSettings(PlatformBase):
    type: Literal["ssh"]
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    key_file: LocalPath | None = None
    known_hosts: LocalPath | None = None
    timeout: Duration = timedelta(seconds=20)
    poll_interval: Interval = Field(timedelta(seconds=2), description="how often a wait polls")

    def can_power_on(self, res: ResourceConfig) -> bool:
        """Only through the resource's own ``startup`` command."""
        return res.startup is not None


class WolSettings(PlatformBase):
    type: Literal["wol"]
    broadcast: str = "255.255.255.255"
    port: int = Field(9, ge=1, le=65535)
    check_port: int = Field(22, ge=1, le=65535, description="TCP port that answers once up")
    poll_interval: Interval = Field(timedelta(seconds=2), description="how often a wait polls")


class LibvirtSettings(PlatformBase):
    type: Literal["libvirt"]
    uri: str = "qemu:///system"
    poll_interval: Interval = Field(timedelta(seconds=2), description="how often a wait polls")


CephFlag = Literal[
    "noout", "norebalance", "nobackfill", "norecover", "noscrub", "nodeep-scrub", "pause"
]
"""OSD flags PVE's ``/cluster/ceph/flags`` sets that a cluster shutdown may want."""


def _cluster_shutdown_flags() -> list[CephFlag]:
    """Proxmox's documented minimum (``noout``) and the three that keep Ceph from moving
    data between the nodes still up while the others go down one by one."""
    return ["noout", "norebalance", "nobackfill", "norecover"]


class ProxmoxSettings(PlatformBase, Credentials):
    type: Literal["proxmox"]
    host: str
    port: int = Field(8006, ge=1, le=65535)
    verify_tls: bool = True
    token_name: str | None = None
    token_file: LocalPath | None = None
    token_env: str | None = None
    poll_interval: Interval = Field(timedelta(seconds=2), description="how often a wait polls")
    ca_file: LocalPath | None = None
    ceph_flags: list[CephFlag] = Field(
        default_factory=_cluster_shutdown_flags,
        min_length=1,
        description="the OSD flags a 'ceph_flags' cluster resource sets once the guests are "
        "down (noout is Proxmox's documented minimum; the others keep Ceph from moving data "
        "while nodes go one by one)",
    )
    state_dir: LocalPath | None = Field(
        None,
        description="where what upsguard changed on the cluster (HA, Ceph flags) is kept "
        "until the startup puts it back; default: 'proxmox' beside the journal",
    )


class CommandSettings(PlatformBase):
    type: Literal["command"]
    shell: str = "/bin/sh"
    timeout: Duration = timedelta(minutes=5)
    pass_env: PassEnv = Field(default_factory=list)
    poll_interval: Interval = Field(timedelta(seconds=2), description="how often a wait polls")
    state_dir: LocalPath | None = Field(
        None,
        description="where each command's output and exit status are written, so that a "
        "restarted service finds a command still running; default: 'commands' beside the journal",
    )

    def can_power_on(self, res: ResourceConfig) -> bool:
        """Only through the resource's own ``startup`` command."""
        return res.startup is not None


class SimulatedPlatformSettings(PlatformBase):
    """Timings of a platform that exists only in the simulator and the demo."""

    type: Literal["simulated"]
    max_parallel: int = Field(16, ge=1, le=1000)
    guest_shutdown: Duration = timedelta(seconds=45)
    hard_power_off: Duration = timedelta(seconds=3)
    host_shutdown: Duration = timedelta(minutes=3)
    device_shutdown: Duration = timedelta(minutes=1)
    power_on: Duration = timedelta(seconds=90)
    host_power_on: Duration = timedelta(minutes=4)
    tools_running: bool = True

    def typical_duration(self, action: str) -> timedelta | None:
        value = getattr(self, action, None)
        return value if isinstance(value, timedelta) else None


class NoPlatform(PlatformBase):
    """Resources that upsguard never powers: they go down with the UPS."""

    type: Literal["none"]


class ExternalPlatformSettings(PlatformBase):
    """A platform provided by a third-party plugin; its own module checks the rest."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    type: str

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, data: object) -> object:
        """Its other keys are unknown here, but a secret is a secret in any plugin."""
        return refuse_inline_secrets(data, nested=True)


def _platform_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in BUILTIN_TYPES else "external"


PlatformConfig = Annotated[
    Annotated[VsphereSettings, Tag("vsphere")]
    | Annotated[IpmiSettings, Tag("ipmi")]
    | Annotated[RedfishSettings, Tag("redfish")]
    | Annotated[SshSettings, Tag("ssh")]
    | Annotated[WolSettings, Tag("wol")]
    | Annotated[LibvirtSettings, Tag("libvirt")]
    | Annotated[ProxmoxSettings, Tag("proxmox")]
    | Annotated[CommandSettings, Tag("command")]
    | Annotated[SimulatedPlatformSettings, Tag("simulated")]
    | Annotated[NoPlatform, Tag("none")]
    | Annotated[ExternalPlatformSettings, Tag("external")],
    Discriminator(_platform_tag),
]

BUILTIN_TYPES = union_tags(PlatformConfig)

_IMPLICIT_MODELS: dict[str, type[PlatformBase]] = {
    "ssh": SshSettings,
    "command": CommandSettings,
    "wol": WolSettings,
    "none": NoPlatform,
    "simulated": SimulatedPlatformSettings,
}


def implicit_platform(type_name: str) -> PlatformBase:
    """Default settings for a platform a resource names by its type alone."""
    return _IMPLICIT_MODELS[type_name].model_validate({"type": type_name})
