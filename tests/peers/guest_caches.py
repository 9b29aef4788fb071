"""The three kernel caches as the guest tests and the benchmark build them in the QEMU guest
(``tests/peers/guest.py``): bcache, dm-writecache and lvmcache (dm-cache), each in write-back on
a backing disk with the fast disk as its cache, holding what a user would have tuned by hand.

Each ``Kind`` knows how to build its cache, where the kernel reports its dirty data, what the
user's own settings look like, and how to stop it *without* a flush of its own and hash what
the backing disk alone holds. The facts behind each are in docs/real-kernel-caches.md.

What is measured on them (bench/destage.py --real, and the tests that print rates): a destage
through a provider in this process, timed against the kernel's own dirty figure sampled in the
guest on the guest's clock (``destage_through_provider``), and bcache's trickle after
``cache_mode`` writethrough alone (``bcache_writethrough_alone``).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.peers.guest import SLOW_OFFSET, Guest
from upsguard.clock import SystemClock
from upsguard.config.site import SiteConfig
from upsguard.engine.destage import DestageWatch
from upsguard.models import CacheMode, CacheName
from upsguard.plugins.registry import build_cache_providers

DATA_MB = 128
#: Where the slow disk's first byte lies on the raw disk: what "the backing disk alone" reads.
RAW_OFFSET = SLOW_OFFSET * 512


def ssh_settings(guest: Guest) -> dict[str, Any]:
    """A cache's ``ssh:`` block in a site file, pointing at the guest."""
    return {
        "host": guest.host,
        "port": guest.port,
        "user": guest.user,
        "key_file": str(guest.key_file),
        "known_hosts": str(guest.known_hosts),
    }


class Kind:
    """One kind of kernel cache, built in write-back on the disk ``backing`` with the fast disk
    as its cache, holding what the user tuned by hand (unless ``tuned`` is false: the kernel's
    and lvm's defaults)."""

    id: str
    cache: str  # its name in the site file
    target: str  # the provider's name for the device
    device: str  # what VMs read and write
    dirty_shell: str  # prints the kernel's dirty figure; ``parse_dirty`` reads it

    def create(self, guest: Guest, backing: str, fast: str, tuned: bool = True) -> None:
        raise NotImplementedError

    def site_entry(self, state_dir: Path) -> dict[str, Any]:
        raise NotImplementedError

    def parse_dirty(self, text: str) -> int:
        """Dirty bytes from what ``dirty_shell`` printed."""
        raise NotImplementedError

    def kernel_dirty(self, guest: Guest) -> int:
        """Dirty bytes as the kernel reports them."""
        return self.parse_dirty(guest.check(self.dirty_shell))

    def kernel_clean(self, guest: Guest) -> None:
        """Assert the kernel's own figures say nothing is left to write back."""
        raise NotImplementedError

    def user_settings(self, guest: Guest) -> object:
        """What the user tuned, as the kernel or lvm reports it in write-back."""
        raise NotImplementedError

    def stop_and_hash(self, guest: Guest, disk: str, offset: int) -> str:
        """Stop the cache without letting it write anything back, then hash the first DATA_MB
        of what the raw backing ``disk`` holds from ``offset`` bytes on (where the backing
        device built on it starts)."""
        raise NotImplementedError


BCACHE = "/sys/block/bcache0/bcache"
_HPRINT_UNITS = {"k": 1, "M": 2, "G": 3, "T": 4}
_KNOBS = ("cache_mode", "writeback_percent", "writeback_delay", "writeback_running")


def hprint_bytes(text: str) -> int:
    """The kernel's ``dirty_data`` (``0.0k``, ``99.0M``) in bytes."""
    text = text.strip()
    return int(float(text[:-1]) * 1024 ** _HPRINT_UNITS[text[-1]])


def make_bcache(guest: Guest, backing: str, cache: str) -> str:
    """bcache0 on ``backing``, cached by ``cache``, in write-back; returns its cache set UUID.
    Sequential writes are cached too (``sequential_cutoff`` 0) and congestion never bypasses
    the cache, so that every byte written is dirty in the cache first."""
    guest.check(f"make-bcache -B {backing} >/dev/null && make-bcache -C {cache} >/dev/null")
    guest.check(
        f"echo {backing} > /sys/fs/bcache/register && echo {cache} > /sys/fs/bcache/register"
    )
    cset = guest.check("cd /sys/fs/bcache && ls -d *-*-*-*-*").split()
    assert len(cset) == 1, cset
    guest.check(
        f"echo {cset[0]} > {BCACHE}/attach && echo writeback > {BCACHE}/cache_mode && "
        f"echo 0 > {BCACHE}/sequential_cutoff && "
        f"echo 0 > /sys/fs/bcache/{cset[0]}/congested_read_threshold_us && "
        f"echo 0 > /sys/fs/bcache/{cset[0]}/congested_write_threshold_us"
    )
    return cset[0]


def bcache_knobs(guest: Guest) -> dict[str, str]:
    values = guest.check(" && ".join(f"cat {BCACHE}/{name}" for name in _KNOBS)).splitlines()
    return dict(zip(_KNOBS, values, strict=True))


class Bcache(Kind):
    id, cache, target, device = "bcache", "nas-ssd", "bcache0", "/dev/bcache0"
    dirty_shell = f"cat {BCACHE}/dirty_data"

    def create(self, guest: Guest, backing: str, fast: str, tuned: bool = True) -> None:
        self.backing = backing
        self.cset = make_bcache(guest, backing, fast)
        if tuned:  # the user's own tuning, which the provider changes while it destages
            guest.check(
                f"echo 25 > {BCACHE}/writeback_percent && echo 7 > {BCACHE}/writeback_delay"
            )
        self.user = bcache_knobs(guest)

    def site_entry(self, state_dir: Path) -> dict[str, Any]:
        return {"name": self.cache, "provider": "bcache", "state_dir": str(state_dir)}

    def parse_dirty(self, text: str) -> int:
        return hprint_bytes(text)

    def kernel_clean(self, guest: Guest) -> None:
        assert guest.check(f"cat {BCACHE}/dirty_data").strip() == "0.0k"
        # In write-through a clean cache needs no hurry: the provider put the user's writeback
        # settings back the moment it read the cache clean, before any flip back.
        through = "[writethrough] writeback writearound none"
        assert bcache_knobs(guest) == {**self.user, "cache_mode": through}

    def user_settings(self, guest: Guest) -> object:
        return bcache_knobs(guest)

    def stop_and_hash(self, guest: Guest, disk: str, offset: int) -> str:
        # Stopping the cache set writes nothing back: dirty data would stay on the cache disk
        # and the backing superblock would still say dirty.
        guest.check(f"echo 1 > /sys/fs/bcache/{self.cset}/stop")
        gone = "ls -d /sys/fs/bcache/*-*-*-*-* /sys/block/bcache0 2>/dev/null | wc -l"
        assert guest.wait_for(gone, "0") == "0"
        super_block = guest.check(f"bcache-super-show {self.backing}")
        assert re.search(r"dev\.data\.cache_state\s+\d+ \[clean\]", super_block), super_block
        first = re.search(r"dev\.data\.first_sector\s+(\d+)", super_block)
        assert first, super_block
        return guest.sha256(disk, DATA_MB, skip_bytes=offset + int(first.group(1)) * 512)


def writecache_status(guest: Guest) -> tuple[int, int, int]:
    """(blocks, free blocks, blocks under writeback) of ``dmsetup status wc``."""
    words = guest.check("dmsetup status wc").split()
    assert words[2] == "writecache" and words[3] == "0", words  # no I/O error
    return int(words[4]), int(words[5]), int(words[6])


class Writecache(Kind):
    id, cache, target, device = "writecache", "pmem", "wc", "/dev/mapper/wc"
    dirty_shell = "dmsetup status wc"
    #: The user's own tuning (writecache.rst): the provider must give back exactly this table.
    OPTIONS = "4 high_watermark 60 low_watermark 40"

    def create(self, guest: Guest, backing: str, fast: str, tuned: bool = True) -> None:
        sectors = int(guest.check(f"blockdev --getsz {backing}"))
        options = self.OPTIONS if tuned else "0"
        guest.check(
            f"dmsetup create wc --table '0 {sectors} writecache s {backing} {fast} 4096 {options}'"
        )

    def site_entry(self, state_dir: Path) -> dict[str, Any]:
        return {"name": self.cache, "provider": "writecache"}

    def parse_dirty(self, text: str) -> int:
        words = text.split()
        return (int(words[4]) - int(words[5])) * 4096

    def kernel_clean(self, guest: Guest) -> None:
        blocks, free, writeback = writecache_status(guest)
        assert (free, writeback) == (blocks, 0)
        assert guest.check("dmsetup table wc").split()[-1] == "cleaner"

    def user_settings(self, guest: Guest) -> object:
        return guest.check("dmsetup table wc").strip()

    def stop_and_hash(self, guest: Guest, disk: str, offset: int) -> str:
        guest.check("dmsetup remove wc")  # a removal writes nothing back
        return guest.sha256(disk, DATA_MB, skip_bytes=offset)


def dm_cache_status(guest: Guest) -> tuple[int, int, str]:
    """(dirty blocks, block size in bytes, mode) from ``dmsetup status vg-origin`` (kernel
    device-mapper/cache.rst): ``<md block> <used>/<total> <block sectors> <used>/<total> <read
    hits> <read misses> <write hits> <write misses> <demotions> <promotions> <dirty> <#feat>``."""
    words = guest.check("dmsetup status vg-origin").split()
    assert words[2] == "cache", words
    features = words[15 : 15 + int(words[14])]
    mode = next(w for w in features if w in ("writeback", "writethrough", "passthrough"))
    return int(words[13]), int(words[5]) * 512, mode


class Lvmcache(Kind):
    id, cache, target, device = "lvmcache", "dmcache", "vg/origin", "/dev/vg/origin"
    dirty_shell = "dmsetup status vg-origin"
    FIELDS = "cache_mode,cache_policy,cache_settings,lv_tags"

    def create(self, guest: Guest, backing: str, fast: str, tuned: bool = True) -> None:
        """vg/origin on ``backing``, cached by a pool on ``fast``, with the user's own
        ``migration_threshold``. The VG's metadata lives on ``fast`` only, so that lvm's own
        writes never wait on the slow disk."""
        guest.check(
            f"pvcreate -q --metadatacopies 0 {backing} && pvcreate -q {fast} && "
            f"vgcreate -q vg {backing} {fast}"
        )
        guest.check(f"lvcreate -q -y -n origin -L 512M vg {backing}")
        guest.check(f"lvcreate -q -y --type cache-pool -n fast -L 256M vg {fast}")
        guest.check(
            "lvconvert -q -y --type cache --cachepool vg/fast --cachemode writeback vg/origin"
        )
        if tuned:
            guest.check("lvchange -q --cachesettings migration_threshold=4096 vg/origin")

    def site_entry(self, state_dir: Path) -> dict[str, Any]:
        return {"name": self.cache, "provider": "lvmcache"}

    def parse_dirty(self, text: str) -> int:
        words = text.split()
        return int(words[13]) * int(words[5]) * 512

    def kernel_clean(self, guest: Guest) -> None:
        dirty, _, mode = dm_cache_status(guest)
        assert (dirty, mode) == (0, "writethrough")

    def user_settings(self, guest: Guest) -> object:
        out = guest.check(f"lvs --noheadings --separator '|' -o {self.FIELDS} vg/origin")
        return [word.strip() for word in out.strip().split("|")]

    def stop_and_hash(self, guest: Guest, disk: str, offset: int) -> str:
        # Removing the cache's top device writes nothing back; its origin stays readable.
        guest.check("dmsetup remove vg-origin")
        return guest.sha256("/dev/mapper/vg-origin_corig", DATA_MB)


KINDS: list[type[Kind]] = [Bcache, Writecache, Lvmcache]


# --- measuring a destage on the guest's own clock -----------------------------------------


def guest_clock_offset(guest: Guest) -> float:
    """Guest wall clock minus this machine's, within half an SSH round trip: the guest's clock
    stamps what the kernel said, this machine's what upsguard did."""
    before = time.time()
    guest_now = float(guest.check("date +%s.%N"))
    after = time.time()
    return guest_now - (before + after) / 2


class KernelWatch:
    """The kernel's dirty figure sampled in the guest about every 0.1 s with the guest's clock,
    into a file: when the kernel said what, without an SSH round trip per sample."""

    LOG = "/run/test-loads/kernel-watch.log"

    def __init__(self, guest: Guest, kind: Kind) -> None:
        self.guest = guest
        self.kind = kind
        guest.check(f"mkdir -p /run/test-loads && : > {self.LOG}")
        guest.start_load(
            "kernel-watch", f'echo "$(date +%s.%N) $({kind.dirty_shell})" >> {self.LOG}; sleep 0.1'
        )

    def samples(self) -> list[tuple[float, int]]:
        """(guest time, dirty bytes) so far."""
        found = []
        for line in self.guest.check(f"cat {self.LOG}").splitlines():
            stamp, _, text = line.partition(" ")
            if text.strip():  # a sample cut short when the watch was stopped
                found.append((float(stamp), self.kind.parse_dirty(text)))
        return found

    def first_clean(self) -> float:
        """The guest time of the first sample with no dirty data."""
        clean = [at for at, dirty in self.samples() if dirty == 0]
        assert clean, self.samples()[-5:]
        return clean[0]

    def stop(self) -> None:
        self.guest.stop_load("kernel-watch")


@dataclass(frozen=True)
class Destage:
    """One destage through a provider, every time on the guest's clock."""

    dirty: int  # bytes the kernel held when the provider flipped the cache
    flipped_at: float
    kernel_clean_at: float  # the first sample of the kernel saying clean
    noticed_at: float  # when upsguard's watch said clean
    poll_interval: float

    @property
    def rate(self) -> float:
        """Bytes per second from the flip to the kernel's clean."""
        return self.dirty / max(self.kernel_clean_at - self.flipped_at, 1e-3)

    @property
    def lag_polls(self) -> float:
        """How soon after the kernel said clean upsguard noticed, in poll intervals."""
        return (self.noticed_at - self.kernel_clean_at) / self.poll_interval


def site_config(guest: Guest, kind: Kind, state_dir: Path, poll_interval: float) -> SiteConfig:
    entry = {
        **kind.site_entry(state_dir),
        "ssh": ssh_settings(guest),
        "poll_interval": f"{int(poll_interval * 1000)}ms",
        "destage_timeout": "5m",
    }
    return SiteConfig.model_validate(
        {
            "site": "guest",
            "ups": [{"name": "ups1", "nut": {"host": "127.0.0.1", "ups": "ups1"}}],
            "caches": [entry],
        }
    )


SSH_ATTEMPTS = 3
"""How many times a test asks a cache in the guest (a flip, a status) before it fails: beside
two busy loops, the emulated guest took more than the provider's 10 s to answer SSH, twice
(the service asks a cache that refused again, every ``engine.destage.RETRY_S``, while the
outage lasts; a person runs ``cache status`` again)."""


def destage_through_provider(
    guest: Guest, kind: Kind, state_dir: Path, poll_interval: float
) -> Destage:
    """Flip ``kind``'s cache to write-through with its provider, in this process, and wait
    with upsguard's own destage watch until it says clean; the kernel is watched meanwhile."""
    site = site_config(guest, kind, state_dir, poll_interval)
    name = CacheName(kind.cache)
    watch = KernelWatch(guest, kind)
    try:
        offset = guest_clock_offset(guest)
        dirty = kind.kernel_dirty(guest)

        async def flip_and_wait() -> tuple[float, float]:
            clock = SystemClock()
            providers = build_cache_providers(site, clock)
            destage = DestageWatch(site, providers, clock, lambda _: None)
            try:
                for _ in range(SSH_ATTEMPTS):  # as the service asks a cache that refused again
                    flipped = time.time()
                    results = await destage.set_mode(CacheMode.WRITE_THROUGH, [name])
                    if all(r.ok for r in results):
                        break
                assert all(r.ok for r in results), results
                assert await destage.wait_clean([name])
                return flipped, time.time()
            finally:
                for provider in providers.values():
                    await provider.close()

        flipped, noticed = asyncio.run(flip_and_wait())
        kernel_clean = watch.first_clean()
    finally:
        watch.stop()
    return Destage(dirty, flipped + offset, kernel_clean, noticed + offset, poll_interval)


@dataclass(frozen=True)
class Trickle:
    """bcache after ``cache_mode`` writethrough alone, as its writeback thread drains it."""

    rate: float  # bytes per second over the watched window
    writeback_rate: int  # the kernel's rate at the end, bytes per second
    minimum: int  # writeback_rate_minimum, bytes per second
    dirty: int  # writeback_rate_debug's dirty and target at the end
    target: int


def bcache_writethrough_alone(guest: Guest, window: float) -> Trickle:
    """Flip bcache0 with ``cache_mode`` alone, as a user would by hand, wait (in the guest) for
    the writeback thread to start writing back after its ``writeback_delay``, then watch it
    for ``window`` seconds. ``window`` sets how long the trickle is measured, nothing else."""
    start = guest.check(f"cat {BCACHE}/dirty_data").strip()
    guest.check(f"echo writethrough > {BCACHE}/cache_mode")
    sample = f'echo "$(date +%s.%N) $(cat {BCACHE}/dirty_data)"'
    out = guest.check(
        f'i=0; while [ "$(cat {BCACHE}/dirty_data)" = "{start}" ] && [ $i -lt 3000 ]; do '
        f"sleep 0.1; i=$((i + 1)); done; {sample}; sleep {window}; {sample}; "
        f"cat {BCACHE}/writeback_rate {BCACHE}/writeback_rate_minimum {BCACHE}/writeback_rate_debug"
    )
    lines = out.splitlines()
    (t1, d1), (t2, d2) = (line.split() for line in lines[:2])
    debug = dict(line.split(":", 1) for line in lines[4:] if ":" in line)
    return Trickle(
        rate=(hprint_bytes(d1) - hprint_bytes(d2)) / (float(t2) - float(t1)),
        writeback_rate=hprint_bytes(lines[2]),
        minimum=int(lines[3]) * 512,
        dirty=hprint_bytes(debug["dirty"]),
        target=hprint_bytes(debug["target"]),
    )
