"""Write-back caches in the data path, and what upsguard must do with them on battery."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from upsguard.config.base import Credentials, Model, refuse_inline_secrets, union_tags
from upsguard.config.types import ByteRate, ByteSize, Duration, Interval, LocalPath, PassEnv
from upsguard.models import CacheName, ResourceId


class SshTarget(Model):
    """Run the provider's commands on another machine over SSH; host keys are checked."""

    host: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    key_file: LocalPath | None = None
    known_hosts: LocalPath | None = None


class CacheBase(Model):
    name: CacheName
    lives_on: ResourceId | None = Field(
        None, description="the resource this cache lives on (a host or storage); none = local"
    )
    ssh: SshTarget | None = None
    carries: list[ResourceId] = Field(
        default_factory=list, description="resources whose data passes through this cache"
    )
    destage_timeout: Duration = timedelta(minutes=10)
    worst_case_rate: ByteRate | None = Field(
        None,
        description="the slowest this cache destages; until a rate is measured, the runtime "
        "trigger counts dirty data at this rate (without it, as destage_timeout)",
    )
    on_timeout: Literal["wait_until_floor", "continue"] = Field(
        "wait_until_floor",
        description="after destage_timeout: keep waiting down to the critical floor, or go on",
    )
    poll_interval: Interval = timedelta(seconds=2)
    targets: list[str] = Field(
        default_factory=list, description="devices or objects to manage; empty = all found"
    )


class BcacheSettings(CacheBase):
    provider: Literal["bcache"]
    sysfs_root: LocalPath = Path("/sys")
    state_dir: LocalPath = Field(
        Path("/var/lib/upsguard/caches"),
        description="where the user's writeback settings are kept while destaging",
    )


class LvmcacheSettings(CacheBase):
    provider: Literal["lvmcache"]
    lvs_command: str = "lvs"
    lvchange_command: str = "lvchange"
    dmsetup_command: str = "dmsetup"


class WritecacheSettings(CacheBase):
    provider: Literal["writecache"]
    dmsetup_command: str = "dmsetup"
    lvs_command: str = "lvs"
    lvchange_command: str = "lvchange"


class OpencasSettings(CacheBase):
    provider: Literal["opencas"]
    casadm_command: str = "casadm"
    job_log_dir: LocalPath = Field(
        Path("/run"), description="where the flushing casadm's output is kept, on its host"
    )


class StorcliSettings(CacheBase):
    provider: Literal["storcli"]
    storcli_command: str = "storcli64"
    controller: int = Field(0, ge=0, le=255)
    write_back_policy: Literal["WB", "AWB"] = "WB"


class FvpSettings(CacheBase, Credentials):
    """FVP management server login: ``user`` with ``password_file`` or ``password_env``."""

    provider: Literal["fvp"]
    pwsh_command: str = "pwsh"
    fvp_server: str | None = None
    state_dir: LocalPath = Field(
        Path("/var/lib/upsguard/caches"),
        description="where each VM's write-back peer counts are kept while in write-through",
    )


class CommandCacheSettings(CacheBase):
    """Any other cache: the site file gives the commands."""

    provider: Literal["command"]
    read_mode: str
    set_write_through: str
    set_write_back: str
    read_dirty_bytes: str
    flush: str | None = None
    pass_env: PassEnv = Field(default_factory=list)


class SimulatedCacheSettings(CacheBase):
    """A cache that exists only in the simulator and the demo."""

    provider: Literal["simulated"]
    dirty: ByteSize = 0
    destage_rate: ByteRate = 100 * 1024 * 1024


class ExternalCacheSettings(CacheBase):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    provider: str

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, data: object) -> object:
        """Its other keys are unknown here, but a secret is a secret in any plugin."""
        return refuse_inline_secrets(data, nested=True)


def _cache_tag(value: Any) -> str:
    kind = value.get("provider") if isinstance(value, dict) else getattr(value, "provider", None)
    return kind if isinstance(kind, str) and kind in BUILTIN_PROVIDERS else "external"


CacheConfig = Annotated[
    Annotated[BcacheSettings, Tag("bcache")]
    | Annotated[LvmcacheSettings, Tag("lvmcache")]
    | Annotated[WritecacheSettings, Tag("writecache")]
    | Annotated[OpencasSettings, Tag("opencas")]
    | Annotated[StorcliSettings, Tag("storcli")]
    | Annotated[FvpSettings, Tag("fvp")]
    | Annotated[CommandCacheSettings, Tag("command")]
    | Annotated[SimulatedCacheSettings, Tag("simulated")]
    | Annotated[ExternalCacheSettings, Tag("external")],
    Discriminator(_cache_tag),
]

BUILTIN_PROVIDERS = union_tags(CacheConfig)
