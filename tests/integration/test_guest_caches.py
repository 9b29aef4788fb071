"""The cache providers against the real kernel: bcache, dm-writecache and lvmcache (dm-cache) in
the QEMU guest, driven over SSH by ``upsguard cache`` with a site file that points at the guest.

For each cache the test writes a known pattern of dirty data through it in write-back mode,
checks that the provider reads the mode and the dirty bytes the kernel reports, flips it to
write-through with ``upsguard cache set write-through --wait`` and watches the dirty data fall
to zero, flips it back and checks that the user's own settings are back, and then proves that
nothing was lost: the cache is stopped *without* a flush of its own (bcache: the cache set is
stopped; dm-writecache and dm-cache: the cache's device-mapper device is removed) and the
backing disk alone must hold exactly what was written.

The backing disk is slow to write (``Guest.slow_disk``: dm-delay, as a spindle behind an SSD
cache), so that a destage lasts long enough to be watched and the dirty data is still there when
the provider first reads it (smq writes back all it holds within a second of idleness on the
guest's fast disks); ``Guest.hold_writes`` stops a destage where it is, for as long as a test
needs. A light read load runs throughout, as VMs keep reading on battery: without any I/O bcache
raises its writeback rate by itself and hides its trap (docs/real-kernel-caches.md, where the
facts these tests rely on are recorded). Nothing here asserts how long anything took.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.peers.guest import SLOW_OFFSET, Guest
from tests.peers.service import CLI
from upsguard.config.types import parse_bytes

pytestmark = pytest.mark.guest

DATA_MB = 128
CLI_TIMEOUT = 600.0  # a safety net for one CLI call, never a measure
WRITE_DELAY_MS = 500  # the slow backing disk's
#: Where the slow disk's first byte lies on the raw disk: what "the backing disk alone" reads.
RAW_OFFSET = SLOW_OFFSET * 512


# --- the command line, as a user runs it ----------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """One line ``cache set --wait`` prints per poll when its output is not a terminal."""

    dirty: int
    rate: int
    eta: str
    clean: int
    total: int


_PROGRESS = re.compile(
    r"\] (?P<dirty>[\d.]+ \w+) dirty, (?P<rate>[\d.]+ \w+)/s, ETA (?P<eta>\S+), "
    r"(?P<clean>\d+)/(?P<total>\d+) clean"
)


def progress_line(line: str) -> Progress | None:
    match = _PROGRESS.search(line)
    if match is None:
        return None
    return Progress(
        parse_bytes(match["dirty"].replace(" ", "")),
        parse_bytes(match["rate"].replace(" ", "")),
        match["eta"],
        int(match["clean"]),
        int(match["total"]),
    )


@dataclass(frozen=True)
class Site:
    """A site file whose one cache the provider reaches in the guest over SSH."""

    path: Path
    cache: str

    def argv(self, *args: str) -> list[str]:
        return [*CLI, *args, "-c", str(self.path)]

    def upsguard(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False
        )

    def status(self) -> dict[str, Any]:
        """The provider's one reading of the cache's one target (``cache status``)."""
        done = self.upsguard("cache", "status", "--format", "json", "--sample", "0")
        assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        assert len(rows) == 1, rows
        return rows[0]


def write_site(guest: Guest, tmp_path: Path, caches: list[dict[str, Any]]) -> Site:
    ssh = {
        "host": guest.host,
        "port": guest.port,
        "user": guest.user,
        "key_file": str(guest.key_file),
        "known_hosts": str(guest.known_hosts),
    }
    config = {
        "site": "guest",
        "ups": [{"name": "ups1", "nut": {"host": "127.0.0.1", "ups": "ups1"}}],
        "caches": [
            {"ssh": ssh, "poll_interval": "500ms", "destage_timeout": "3m", **cache}
            for cache in caches
        ],
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return Site(path, caches[0]["name"])


# --- the three kernel caches, as the tests build them -----------------------------------------


class Kind:
    """One kind of kernel cache, built in write-back on the slow disk ``backing`` with the
    fast disk as its cache, holding what the user tuned by hand."""

    id: str
    cache: str  # its name in the site file
    target: str  # the provider's name for the device
    device: str  # what VMs read and write

    def create(self, guest: Guest, backing: str, fast: str) -> None:
        raise NotImplementedError

    def site_entry(self, tmp_path: Path) -> dict[str, Any]:
        raise NotImplementedError

    def kernel_dirty(self, guest: Guest) -> int:
        """Dirty bytes as the kernel reports them."""
        raise NotImplementedError

    def kernel_clean(self, guest: Guest) -> None:
        """Assert the kernel's own figures say nothing is left to write back."""
        raise NotImplementedError

    def user_settings(self, guest: Guest) -> object:
        """What the user tuned, as the kernel or lvm reports it in write-back."""
        raise NotImplementedError

    def stop_and_hash(self, guest: Guest, disk: str) -> str:
        """Stop the cache without letting it write anything back, then hash the first DATA_MB
        of what the raw backing ``disk`` holds."""
        raise NotImplementedError


BCACHE = "/sys/block/bcache0/bcache"
_HPRINT_UNITS = {"k": 1, "M": 2, "G": 3, "T": 4}
_KNOBS = ("cache_mode", "writeback_percent", "writeback_delay", "writeback_running")


def hprint_bytes(text: str) -> int:
    """The kernel's ``dirty_data`` (``0.0k``, ``99.0M``) in bytes."""
    text = text.strip()
    return round(float(text[:-1]) * 1024 ** _HPRINT_UNITS[text[-1]])


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

    def create(self, guest: Guest, backing: str, fast: str) -> None:
        self.backing = backing
        self.cset = make_bcache(guest, backing, fast)
        # The user's own tuning, which the provider changes while it destages.
        guest.check(f"echo 25 > {BCACHE}/writeback_percent && echo 7 > {BCACHE}/writeback_delay")
        self.user = bcache_knobs(guest)

    def site_entry(self, tmp_path: Path) -> dict[str, Any]:
        return {"name": self.cache, "provider": "bcache", "state_dir": str(tmp_path / "state")}

    def kernel_dirty(self, guest: Guest) -> int:
        return hprint_bytes(guest.check(f"cat {BCACHE}/dirty_data"))

    def kernel_clean(self, guest: Guest) -> None:
        assert guest.check(f"cat {BCACHE}/dirty_data").strip() == "0.0k"
        # In write-through a clean cache needs no hurry: the provider put the user's writeback
        # settings back the moment it read the cache clean, before any flip back.
        through = "[writethrough] writeback writearound none"
        assert bcache_knobs(guest) == {**self.user, "cache_mode": through}

    def user_settings(self, guest: Guest) -> object:
        return bcache_knobs(guest)

    def stop_and_hash(self, guest: Guest, disk: str) -> str:
        # Stopping the cache set writes nothing back: dirty data would stay on the cache disk
        # and the backing superblock would still say dirty.
        guest.check(f"echo 1 > /sys/fs/bcache/{self.cset}/stop")
        gone = "ls -d /sys/fs/bcache/*-*-*-*-* /sys/block/bcache0 2>/dev/null | wc -l"
        assert guest.wait_for(gone, "0") == "0"
        super_block = guest.check(f"bcache-super-show {self.backing}")
        assert re.search(r"dev\.data\.cache_state\s+\d+ \[clean\]", super_block), super_block
        first = re.search(r"dev\.data\.first_sector\s+(\d+)", super_block)
        assert first, super_block
        return guest.sha256(disk, DATA_MB, skip_bytes=RAW_OFFSET + int(first.group(1)) * 512)


def writecache_status(guest: Guest) -> tuple[int, int, int]:
    """(blocks, free blocks, blocks under writeback) of ``dmsetup status wc``."""
    words = guest.check("dmsetup status wc").split()
    assert words[2] == "writecache" and words[3] == "0", words  # no I/O error
    return int(words[4]), int(words[5]), int(words[6])


class Writecache(Kind):
    id, cache, target, device = "writecache", "pmem", "wc", "/dev/mapper/wc"
    #: The user's own tuning (writecache.rst): the provider must give back exactly this table.
    OPTIONS = "4 high_watermark 60 low_watermark 40"

    def create(self, guest: Guest, backing: str, fast: str) -> None:
        sectors = int(guest.check(f"blockdev --getsz {backing}"))
        guest.check(
            f"dmsetup create wc --table '0 {sectors} writecache s {backing} {fast} 4096 "
            f"{self.OPTIONS}'"
        )

    def site_entry(self, tmp_path: Path) -> dict[str, Any]:
        return {"name": self.cache, "provider": "writecache"}

    def kernel_dirty(self, guest: Guest) -> int:
        blocks, free, _ = writecache_status(guest)
        return (blocks - free) * 4096

    def kernel_clean(self, guest: Guest) -> None:
        blocks, free, writeback = writecache_status(guest)
        assert (free, writeback) == (blocks, 0)
        assert guest.check("dmsetup table wc").split()[-1] == "cleaner"

    def user_settings(self, guest: Guest) -> object:
        return guest.check("dmsetup table wc").strip()

    def stop_and_hash(self, guest: Guest, disk: str) -> str:
        guest.check("dmsetup remove wc")  # a removal writes nothing back
        return guest.sha256(disk, DATA_MB, skip_bytes=RAW_OFFSET)


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
    FIELDS = "cache_mode,cache_policy,cache_settings,lv_tags"

    def create(self, guest: Guest, backing: str, fast: str) -> None:
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
        guest.check("lvchange -q --cachesettings migration_threshold=4096 vg/origin")

    def site_entry(self, tmp_path: Path) -> dict[str, Any]:
        return {"name": self.cache, "provider": "lvmcache"}

    def kernel_dirty(self, guest: Guest) -> int:
        blocks, size, _ = dm_cache_status(guest)
        return blocks * size

    def kernel_clean(self, guest: Guest) -> None:
        dirty, _, mode = dm_cache_status(guest)
        assert (dirty, mode) == (0, "writethrough")

    def user_settings(self, guest: Guest) -> object:
        out = guest.check(f"lvs --noheadings --separator '|' -o {self.FIELDS} vg/origin")
        settings = [word.strip() for word in out.strip().split("|")]
        assert settings == ["writeback", "smq", "migration_threshold=4096", ""]  # no tag left
        return settings

    def stop_and_hash(self, guest: Guest, disk: str) -> str:
        # Removing the cache's top device writes nothing back; its origin stays readable.
        guest.check("dmsetup remove vg-origin")
        return guest.sha256("/dev/mapper/vg-origin_corig", DATA_MB)


KINDS = [Bcache, Writecache, Lvmcache]


@dataclass
class Setup:
    """A cache of one kind in the guest, holding DATA_MB of known data, dirty."""

    guest: Guest
    kind: Kind
    site: Site
    disk: str  # the raw disk under the slow one
    want: str  # the data's sha256
    user: object  # the user's settings before any flip


def build(guest: Guest, kind: Kind, tmp_path: Path) -> Setup:
    disk, fast, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    kind.create(guest, guest.slow_disk(disk, WRITE_DELAY_MS), fast)
    user = kind.user_settings(guest)
    guest.check(f"dd if={source} of={kind.device} bs=1M count={DATA_MB} oflag=direct status=none")
    guest.start_load(
        "reads", f"dd if={kind.device} of=/dev/null bs=4k count=1 iflag=direct status=none; "
        "sleep 0.2"
    )  # fmt: skip
    site = write_site(guest, tmp_path, [kind.site_entry(tmp_path)])
    return Setup(guest, kind, site, disk, want, user)


def check_read_as_write_back(setup: Setup) -> None:
    """The provider reads write-back and the dirty bytes the kernel reports. The kernel writes
    back a little by itself meanwhile, so its figure is read just before and just after the
    provider's; the provider's must lie between them."""
    before = setup.kind.kernel_dirty(setup.guest)
    seen = setup.site.status()
    after = setup.kind.kernel_dirty(setup.guest)
    assert seen["mode"] == "write-back" and seen["clean"] is False, seen
    assert after <= seen["dirty_bytes"] <= before, (before, seen, after)
    assert seen["dirty_bytes"] > 0


def check_progress(stderr: str) -> list[Progress]:
    """Dirty data falls to zero, never rises (no new write is cached dirty), and every reading
    taken while the drain was under way shows its rate and ETA."""
    lines = [p for p in map(progress_line, stderr.splitlines()) if p is not None]
    assert lines, stderr
    dirty = [line.dirty for line in lines]
    assert dirty == sorted(dirty, reverse=True), dirty
    assert dirty[0] > 0
    assert (lines[-1].dirty, lines[-1].clean, lines[-1].total) == (0, 1, 1)
    for line in lines:
        if 0 < line.dirty < dirty[0]:
            assert line.rate > 0 and line.eta != "?", line
    return lines


def flip_back_and_check_no_byte_lost(setup: Setup) -> None:
    """Back to write-back: the user's settings are the ones in force. Then the cache is stopped
    without a flush of its own, and the backing disk alone holds every byte."""
    done = setup.site.upsguard("cache", "set", "write-back")
    assert done.returncode == 0, done.stderr
    assert setup.kind.user_settings(setup.guest) == setup.user
    assert setup.site.status()["mode"] == "write-back"
    setup.guest.stop_load("reads")
    assert setup.kind.stop_and_hash(setup.guest, setup.disk) == setup.want


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.id)
def test_write_back_destage_restore_and_no_byte_lost(
    clean_guest: Guest, tmp_path: Path, kind: type[Kind]
) -> None:
    setup = build(clean_guest, kind(), tmp_path)
    check_read_as_write_back(setup)

    done = setup.site.upsguard("cache", "set", "write-through", "--wait")
    print(done.stderr)  # the progress lines, for whoever reads the test's output
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{kind.cache}/{kind.target}: ok: {kind.target}: write-through",
        f"clean: {kind.cache}",
    ]
    check_progress(done.stderr)
    setup.kind.kernel_clean(setup.guest)

    flip_back_and_check_no_byte_lost(setup)


class Cli:
    """``upsguard cache set write-through --wait`` running, read line by line as it prints."""

    def __init__(self, site: Site) -> None:
        self.proc = subprocess.Popen(
            site.argv("cache", "set", "write-through", "--wait"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []

    def next_progress(self) -> Progress:
        """Block until the CLI prints its next progress line (stderr, one per poll)."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            progress = progress_line(line)
            if progress is not None:
                return progress
        pytest.fail(f"the CLI ended without progress: {''.join(self.stderr)}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.mark.parametrize("kind", [Bcache, Writecache], ids=lambda k: k.id)
def test_interrupted_destage_resumes_and_reaches_clean(
    clean_guest: Guest, tmp_path: Path, kind: type[Kind]
) -> None:
    """The slow disk holds every write, so the destage stands still with dirty data left while
    the guest's sshd restarts under the CLI (it keeps polling over a new connection) and then the
    CLI is killed. Once the disk lets go, ``cache wait`` (another process) sees the kernel reach
    clean, and puts the user's settings back."""
    guest = clean_guest
    setup = build(guest, kind(), tmp_path)
    guest.hold_writes()
    cli = Cli(setup.site)
    try:
        first = cli.next_progress()
        assert first.dirty > 0 and first.clean == 0
        guest.restart_sshd()
        # a poll or two fail while sshd is away; then the CLI reads the cache again
        after = cli.next_progress()
        while after.dirty == 0 and after.clean == 0:  # a reading that failed counts nothing
            after = cli.next_progress()
        assert after.dirty > 0 and cli.proc.poll() is None
    finally:
        cli.kill()
    assert setup.kind.kernel_dirty(guest) > 0  # it is the disk that holds the destage up
    guest.release_writes()

    done = setup.site.upsguard("cache", "wait")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"clean: {kind.cache}"]
    check_progress(done.stderr)
    setup.kind.kernel_clean(guest)
    flip_back_and_check_no_byte_lost(setup)


def test_lvmcache_flip_outlives_the_cli_and_another_process_restores_the_policy(
    clean_guest: Guest, tmp_path: Path
) -> None:
    """lvmcache's destage is the kernel's alone once ``lvchange --cachepolicy cleaner`` has
    returned: nothing upsguard does can stop it. What a killed CLI could lose is the user's
    policy, and it is kept in an LV tag on the guest: a later ``cache wait`` and ``cache set
    write-back``, other processes after an sshd restart, finish the job."""
    guest = clean_guest
    setup = build(guest, Lvmcache(), tmp_path)
    cli = Cli(setup.site)
    try:
        cli.next_progress()  # flipped: it polls
    finally:
        cli.kill()
    tags = guest.check("lvs --noheadings -o lv_tags vg/origin").strip()
    assert tags == "upsguard.policy:smq"
    guest.restart_sshd()

    done = setup.site.upsguard("cache", "wait")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["clean: dmcache"]
    setup.kind.kernel_clean(guest)
    flip_back_and_check_no_byte_lost(setup)


def test_a_device_that_is_not_there_is_one_line_naming_it(
    clean_guest: Guest, tmp_path: Path
) -> None:
    caches = [
        {"name": "nas-ssd", "provider": "bcache", "targets": ["bcache7"]},
        {"name": "pmem", "provider": "writecache", "targets": ["nope"]},
        {"name": "dmcache", "provider": "lvmcache", "targets": ["vg9/missing"]},
    ]
    caches[0]["state_dir"] = str(tmp_path)
    site = write_site(clean_guest, tmp_path, caches)
    done = site.upsguard("cache", "status", "--format", "json", "--sample", "0")
    assert done.returncode == 1
    errors = {row["cache"]: row["error"] for row in json.loads(done.stdout)}
    where = f"{clean_guest.host}:"
    assert errors["nas-ssd"].startswith(f"cache 'nas-ssd' {where}bcache7: not a bcache device")
    assert errors["pmem"] == (f"cache 'pmem' {where}nope: dmsetup status: Device does not exist.")
    assert errors["dmcache"] == (
        f"cache 'dmcache' {where}vg9/missing (not an active cached LV?): dmsetup status: "
        "Device does not exist."
    )
    assert all("\n" not in error for error in errors.values())
