"""The ``CacheProvider`` protocol: one configured cache and its targets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath
from typing import Any, Protocol, runtime_checkable

from upsguard.clock import Clock
from upsguard.errors import PermanentError, UpsguardError
from upsguard.findings import Area, Finding, fail, ok
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.remote import Runner, where


@runtime_checkable
class CacheProvider(Protocol):
    """Manages one ``caches:`` entry: its devices, their mode, their dirty data.

    Methods raise ``TemporaryError`` when a command or file cannot be read
    now (retry later) and ``PermanentError`` when the device is gone or the
    tool refuses; one target's failure never affects another's result.
    """

    name: CacheName

    async def targets(self) -> list[CacheTarget]:
        """The devices or objects this cache entry manages."""
        ...

    async def read(self, target: CacheTarget) -> CacheState:
        """Mode and dirty data now; ``clean`` only when nothing is left to destage."""
        ...

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        """Switch the mode; returns once accepted, without waiting for destage.

        Switching to write-through also does what makes the destage go fast
        (bcache: ``writeback_percent`` 0); switching back restores what the
        user had. Idempotent.
        """
        ...

    async def flush(self, target: CacheTarget) -> None:
        """Hurry the destage where the device offers it; a no-op elsewhere."""
        ...

    async def close(self) -> None:
        """Release connections (SSH). Never raises."""
        ...


@runtime_checkable
class CacheDiagnosis(Protocol):
    """A provider that can check, without flipping anything, that upsguard may flip its
    cache: an optional capability, asked by ``upsguard doctor``. Reading the mode and the
    dirty bytes the doctor checks itself, through ``targets`` and ``read``.
    """

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """Whether the mode of each of ``targets`` can be switched by the user upsguard runs
        as (here or over SSH): the files it writes are writable, the tools it runs are
        there and run with enough rights.

        Never switches a mode and never writes. Each problem is a ``warn`` or ``fail``
        finding (``Area.CACHE``, subject: the cache's name) with its fix; an error it did
        not expect propagates, and the doctor makes it a ``fail``.
        """
        ...


class CacheProviderFactory(Protocol):
    def __call__(self, settings: Any, clock: Clock) -> CacheProvider: ...


def require_targets(found: list[CacheTarget], nothing: str) -> list[CacheTarget]:
    """Found targets; none at all is an error, never "nothing dirty, all clean"."""
    if not found:
        raise PermanentError(f"{nothing}: set 'targets' or check the settings")
    return found


_RIGHTS_SCRIPT = """
id -u
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do [ -w "$1" ] || echo "unwritable $1"; shift; done
[ "$#" -gt 0 ] && shift
for p in "$@"; do command -v "$p" >/dev/null 2>&1 || echo "missing $p"; done
"""
CHECK_TIMEOUT_S = 30.0


async def may_flip(
    name: CacheName,
    runner: Runner,
    *,
    programs: Sequence[str] = (),
    writable: Sequence[PurePath | str] = (),
    root: bool = False,
) -> Finding:
    """A provider's rights check, where its commands run (here or over SSH), in one shell:
    the ``programs`` it runs are there, the files it writes are writable, and, with
    ``root``, it runs as root (lvchange, dmsetup, casadm and storcli want root). Writes
    nothing and runs nothing but the shell's own tests."""
    argv = ["sh", "-c", _RIGHTS_SCRIPT, "upsguard-check", *map(str, writable), "--", *programs]
    at = where(runner.ssh)
    try:
        result = await runner.run(argv, timeout=CHECK_TIMEOUT_S)
    except UpsguardError as exc:
        return fail(Area.CACHE, name, "rights", str(exc), "check the cache's ssh settings")
    lines = result.stdout.split()
    uid, problems = (lines[0] if lines else "?"), result.stdout.splitlines()[1:]
    missing = tuple(line.split(" ", 1)[1] for line in problems if line.startswith("missing "))
    unwritable = tuple(line.split(" ", 1)[1] for line in problems if line.startswith("unwritable"))
    if root and uid != "0":
        return fail(
            Area.CACHE,
            name,
            "rights",
            f"runs as uid {uid} on {at}: {', '.join(programs)} need root to switch the mode",
            "run upsguard as root, or give the cache an ssh: user who is root there",
            missing=("root",),
        )
    if missing or unwritable:
        lacking = [f"{p} not found" for p in missing] + [f"{f} not writable" for f in unwritable]
        return fail(
            Area.CACHE,
            name,
            "rights",
            f"on {at}: {'; '.join(lacking)}",
            "install the tools (or set their path in the site file), and run as root",
            missing=missing + unwritable,
        )
    said = [f"uid {uid}"] + ([f"{', '.join(programs)} found"] if programs else [])
    said += [f"{len(writable)} control file(s) writable"] if writable else []
    return ok(Area.CACHE, name, "rights", f"may switch the mode on {at}: {', '.join(said)}")
