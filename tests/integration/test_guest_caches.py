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

from tests.peers.guest import Guest
from tests.peers.guest_caches import (
    DATA_MB,
    KINDS,
    RAW_OFFSET,
    SSH_ATTEMPTS,
    Bcache,
    Kind,
    Lvmcache,
    Writecache,
    bcache_writethrough_alone,
    destage_through_provider,
    ssh_settings,
)
from tests.peers.service import CLI
from upsguard.config.types import parse_bytes

#: pytest's net over a whole test is as long as its longest step's own (a guest command's
#: 900 s; a CLI call's CLI_TIMEOUT): on an emulated guest beside two busy loops, building
#: bcache, writing, destaging 102 MiB, flipping back and hashing took longer than the
#: suite's 300 s, with no step late. test_guest_outage's is the same.
pytestmark = [pytest.mark.guest, pytest.mark.timeout(900)]

CLI_TIMEOUT = 600.0  # a safety net for one CLI call, never a measure
WRITE_DELAY_MS = 500  # the slow backing disk's
#: The kinds whose destage the slow disk can hold still: lvm's flip itself waits on the disk.
HELD_DESTAGE: list[type[Kind]] = [Bcache, Writecache]


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
    ssh = ssh_settings(guest)
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
    site = write_site(guest, tmp_path, [kind.site_entry(tmp_path / "state")])
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
    assert setup.kind.stop_and_hash(setup.guest, setup.disk, RAW_OFFSET) == setup.want


class Cli:
    """``upsguard cache set write-through --wait`` running, read line by line as it prints."""

    def __init__(self, site: Site) -> None:
        self.proc = subprocess.Popen(
            site.argv("cache", "set", "write-through", "--wait"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
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

    def finish(self) -> tuple[int, str, str]:
        """Wait for the CLI to end: its exit status, whole stdout and stderr. The pipes are read
        through their own buffers (``communicate`` would miss what the reader has buffered),
        stderr first: stdout holds two lines and cannot fill its pipe."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.stderr.append(self.proc.stderr.read())
        out = self.proc.stdout.read()
        returncode = self.proc.wait(timeout=CLI_TIMEOUT)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return returncode, out, "".join(self.stderr)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)  # reads to the end and closes both pipes


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.id)
def test_write_back_destage_restore_and_no_byte_lost(
    clean_guest: Guest, tmp_path: Path, kind: type[Kind]
) -> None:
    """Where the slow disk can be held (not under lvm, whose flip waits on the disk), it is held
    until the CLI's first reading, so that the reading is taken with dirty data left, whatever
    the machine's speed; then the destage runs to its end."""
    setup = build(clean_guest, kind(), tmp_path)
    check_read_as_write_back(setup)

    held = kind in HELD_DESTAGE
    if held:
        setup.guest.hold_writes()
    cli = Cli(setup.site)
    try:
        first = cli.next_progress()
    finally:
        if held:
            setup.guest.release_writes()
    returncode, stdout, stderr = cli.finish()
    print(stderr)  # the progress lines, for whoever reads the test's output
    assert returncode == 0, stderr
    assert stdout.splitlines() == [
        f"{kind.cache}/{kind.target}: ok: {kind.target}: write-through",
        f"clean: {kind.cache}",
    ]
    check_progress(stderr)
    assert first.dirty > 0 or not held
    setup.kind.kernel_clean(setup.guest)

    flip_back_and_check_no_byte_lost(setup)


@pytest.mark.parametrize("kind", HELD_DESTAGE, ids=lambda k: k.id)
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
    for _ in range(SSH_ATTEMPTS):  # the emulated guest, on a busy machine, may not answer SSH
        done = site.upsguard("cache", "status", "--format", "json", "--sample", "0")
        assert done.returncode == 1
        errors = {row["cache"]: row["error"] for row in json.loads(done.stdout)}
        if not any("no SSH answer" in error for error in errors.values()):
            break
    where = f"{clean_guest.host}:"
    assert errors["nas-ssd"].startswith(f"cache 'nas-ssd' {where}bcache7: not a bcache device")
    assert errors["pmem"] == (f"cache 'pmem' {where}nope: dmsetup status: Device does not exist.")
    assert errors["dmcache"] == (
        f"cache 'dmcache' {where}vg9/missing (not an active cached LV?): dmsetup status: "
        "Device does not exist."
    )
    assert all("\n" not in error for error in errors.values())


TRICKLE_WINDOW_S = 15.0  # how long the trickle is watched: what it measures is printed only


def test_bcache_trap_writethrough_alone_trickles_where_the_providers_settings_drain(
    clean_guest: Guest, tmp_path: Path
) -> None:
    """The trap, for real, in one run on one device with the kernel's defaults (10 %, 30 s)
    and the VMs' light read load: ``cache_mode`` writethrough alone leaves the writeback rate
    controller at its floor, because the dirty data is below its target; the provider's
    settings then drain the same device to clean. Both rates are printed; what is asserted is
    what the kernel says of itself, the data, and the defaults put back."""
    guest = clean_guest
    disk, fast, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    bcache = Bcache()
    bcache.create(guest, disk, fast, tuned=False)
    assert bcache.user["writeback_percent"] == "10" and bcache.user["writeback_delay"] == "30"
    guest.check(f"dd if={source} of={bcache.device} bs=1M count={DATA_MB} oflag=direct status=none")
    guest.start_load(
        "reads", f"dd if={bcache.device} of=/dev/null bs=4k count=1 iflag=direct status=none; "
        "sleep 0.2"
    )  # fmt: skip

    alone = bcache_writethrough_alone(guest, TRICKLE_WINDOW_S)
    assert alone.writeback_rate == alone.minimum  # the controller's floor, 8 sectors/s
    assert 0 < alone.dirty < alone.target  # because what is dirty is below its target

    provider = destage_through_provider(guest, bcache, tmp_path / "state", poll_interval=0.5)
    mb = 1e6
    print(
        f"bcache, {DATA_MB} MiB in 1 MiB extents, light read load: writethrough alone "
        f"{alone.rate / mb:.2f} MB/s (kernel writeback_rate {alone.writeback_rate} B/s); "
        f"with upsguard's settings {provider.rate / mb:.1f} MB/s: "
        f"{provider.rate / max(alone.rate, 1.0):.0f} times faster"
    )
    bcache.kernel_clean(guest)  # clean, and the defaults are back
    guest.stop_load("reads")
    assert bcache.stop_and_hash(guest, disk, 0) == want
