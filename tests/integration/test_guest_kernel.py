"""The QEMU guest proves it can host the real kernel caches: it boots Debian's kernel, answers
over SSH with a checked host key, and can build bcache, lvmcache (dm-cache) and dm-writecache
devices in write-back mode on its scratch disks.

Each test asserts what the guest's kernel and tools report, never how long anything took.
The provider tests (bcache, lvmcache, writecache) build on these and on the facts recorded in
docs/real-kernel-caches.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.peers.guest import SLOW_NAME, Guest

pytestmark = pytest.mark.guest

MIB = 1024 * 1024


def _bcache_writeback(guest: Guest, backing: str, cache: str) -> str:
    """Make ``backing`` a bcache device cached by ``cache`` in write-back mode, the way an
    operator would without udev: format each, register each, attach by cache-set UUID.
    Returns the sysfs directory of the bcache device."""
    guest.check(f"make-bcache -B {backing} && make-bcache -C {cache}")
    guest.check(
        f"echo {backing} > /sys/fs/bcache/register && echo {cache} > /sys/fs/bcache/register"
    )
    cset = guest.check("cd /sys/fs/bcache && ls -d *-*-*-*-*").split()
    assert len(cset) == 1, cset
    sysfs = "/sys/block/bcache0/bcache"
    assert guest.check(f"cat {sysfs}/state").strip() == "no cache"
    guest.check(f"echo {cset[0]} > {sysfs}/attach")
    guest.check(f"echo writeback > {sysfs}/cache_mode")
    return sysfs


def test_guest_boots_debian_kernel_and_answers_over_ssh(guest: Guest) -> None:
    status, out, _ = guest.run("uname -r; id -u; cat /proc/cmdline")
    release, uid, cmdline = out.splitlines()
    assert status == 0
    assert re.fullmatch(r"6\.1\.0-\d+-amd64", release)
    assert uid == "0"
    assert "console=ttyS0" in cmdline
    assert guest.check("ls /dev/vda /dev/vdb /dev/vdc").split() == list(guest.disks)


def test_guest_host_key_is_checked(guest: Guest, tmp_path: Path) -> None:
    """The known_hosts file the fixture writes is what lets ssh in: a file naming another
    key for the same address is refused, as the project's SSH runner must refuse it."""
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    key_type, key = other.with_suffix(".pub").read_text().split()[:2]
    wrong = tmp_path / "known_hosts.wrong"
    wrong.write_text(f"[{guest.host}]:{guest.port} {key_type} {key}\n")
    argv = [
        "ssh",
        "-i",
        str(guest.key_file),
        "-p",
        str(guest.port),
        "-o",
        f"UserKnownHostsFile={wrong}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        f"{guest.user}@{guest.host}",
        "true",
    ]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 255
    assert "Host key verification failed" in refused.stderr


def test_kernel_has_bcache_and_device_mapper_cache_targets(guest: Guest) -> None:
    assert "register" in guest.check("ls /sys/fs/bcache").split()
    targets = {line.split()[0] for line in guest.check("dmsetup targets").splitlines()}
    assert {"cache", "writecache"} <= targets
    modules = {line.split()[0] for line in guest.check("cat /proc/modules").splitlines()}
    assert {"bcache", "dm_mod", "dm_cache", "dm_cache_smq", "dm_writecache"} <= modules


def test_bcache_device_in_writeback_mode_holds_dirty_data(clean_guest: Guest) -> None:
    guest = clean_guest
    backing, cache, _ = guest.disks
    sysfs = _bcache_writeback(guest, backing, cache)
    assert "[writeback]" in guest.check(f"cat {sysfs}/cache_mode")
    assert guest.check(f"cat {sysfs}/state").strip() == "clean"
    # Sequential writes bypass the cache unless sequential_cutoff is 0 (docs/real-kernel-caches.md).
    guest.check(f"echo 0 > {sysfs}/sequential_cutoff")
    guest.check("dd if=/dev/urandom of=/dev/bcache0 bs=1M count=16 oflag=direct status=none")
    assert guest.check(f"cat {sysfs}/state").strip() == "dirty"
    dirty = guest.check(f"cat {sysfs}/dirty_data").strip()
    assert dirty.endswith("M") and float(dirty[:-1]) > 0, dirty


def test_lvmcache_pool_in_writeback_on_two_disks(clean_guest: Guest) -> None:
    guest = clean_guest
    slow, fast, _ = guest.disks
    guest.check(f"pvcreate -q {slow} {fast} && vgcreate -q vg {slow} {fast}")
    guest.check(f"lvcreate -q -y -n origin -L 512M vg {slow}")
    guest.check(f"lvcreate -q -y --type cache-pool -n fast -L 256M vg {fast}")
    guest.check("lvconvert -q -y --type cache --cachepool vg/fast --cachemode writeback vg/origin")
    report = guest.check(
        "lvs --noheadings --separator , -o lv_name,segtype,cache_mode,cache_policy,"
        "cache_dirty_blocks vg/origin"
    )
    assert report.strip().split(",") == ["origin", "cache", "writeback", "smq", "0"]
    table = guest.check("dmsetup table vg-origin").split()
    assert table[2] == "cache" and "writeback" in table
    assert guest.check("ls /dev/vg/origin /dev/mapper/vg-origin").split()


def test_dm_writecache_device(clean_guest: Guest) -> None:
    guest = clean_guest
    origin, cache, _ = guest.disks
    sectors = int(guest.check(f"blockdev --getsz {origin}"))
    guest.check(f"dmsetup create wc --table '0 {sectors} writecache s {origin} {cache} 4096 0'")
    guest.check("dd if=/dev/urandom of=/dev/mapper/wc bs=1M count=16 oflag=direct status=none")
    # <start> <length> writecache <error> <blocks> <free blocks> <blocks under writeback> ...
    status = guest.check("dmsetup status wc").split()
    assert status[:3] == ["0", str(sectors), "writecache"]
    error, blocks, free = int(status[3]), int(status[4]), int(status[5])
    assert error == 0
    assert blocks - free >= 16 * MIB // 4096


# --- No data lost: each kernel cache, destaged the way docs/real-kernel-caches.md records,
# --- gives back on its origin exactly what was written through it.

DATA_MB = 32


def test_bcache_destage_at_full_speed_keeps_every_byte(clean_guest: Guest) -> None:
    guest = clean_guest
    backing, cache, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    sysfs = _bcache_writeback(guest, backing, cache)
    guest.check(f"echo 0 > {sysfs}/sequential_cutoff")
    guest.check(f"dd if={source} of=/dev/bcache0 bs=1M count={DATA_MB} oflag=direct status=none")
    assert guest.check(f"cat {sysfs}/dirty_data").strip() != "0.0k"
    guest.check(
        f"echo writethrough > {sysfs}/cache_mode && echo 0 > {sysfs}/writeback_percent && "
        f"echo 0 > {sysfs}/writeback_delay && echo 1 > {sysfs}/writeback_running"
    )
    assert guest.wait_for(f"cat {sysfs}/dirty_data", "0.0k") == "0.0k"
    guest.check(f"echo 1 > {sysfs}/detach")
    assert guest.wait_for(f"cat {sysfs}/state", "no cache") == "no cache"
    super_block = guest.check(f"bcache-super-show {backing}")
    first = re.search(r"dev\.data\.first_sector\s+(\d+)", super_block)
    assert first, super_block
    assert guest.sha256(backing, DATA_MB, skip_bytes=int(first.group(1)) * 512) == want


def test_lvmcache_writethrough_returns_clean_and_uncache_keeps_every_byte(
    clean_guest: Guest,
) -> None:
    guest = clean_guest
    slow, fast, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    guest.check(f"pvcreate -q {slow} {fast} && vgcreate -q vg {slow} {fast}")
    guest.check(f"lvcreate -q -y -n origin -L 256M vg {slow}")
    guest.check(f"lvcreate -q -y --type cache-pool -n fast -L 128M vg {fast}")
    guest.check("lvconvert -q -y --type cache --cachepool vg/fast --cachemode writeback vg/origin")
    guest.check(f"dd if={source} of=/dev/vg/origin bs=1M count={DATA_MB} oflag=direct status=none")
    # lvchange waits until the cache is clean (it loads the cleaner policy while it waits).
    guest.check("lvchange -q --cachemode writethrough vg/origin")
    report = guest.check(
        "lvs --noheadings --separator , -o cache_mode,cache_policy,cache_dirty_blocks vg/origin"
    )
    assert report.strip().split(",") == ["writethrough", "smq", "0"]
    guest.check("lvconvert -q -y --uncache vg/origin")
    assert guest.sha256("/dev/vg/origin", DATA_MB) == want


def test_dm_writecache_cleaner_message_drains_and_keeps_every_byte(clean_guest: Guest) -> None:
    guest = clean_guest
    origin, cache, source = guest.disks
    want = guest.fill_random(source, DATA_MB)
    sectors = int(guest.check(f"blockdev --getsz {origin}"))
    guest.check(f"dmsetup create wc --table '0 {sectors} writecache s {origin} {cache} 4096 0'")
    guest.check(f"dd if={source} of=/dev/mapper/wc bs=1M count={DATA_MB} oflag=direct status=none")
    status = guest.check("dmsetup status wc").split()
    blocks, free = int(status[4]), int(status[5])
    assert blocks - free >= DATA_MB * MIB // 4096  # below the high watermark: nothing drains
    guest.check("dmsetup message wc 0 cleaner")
    # Drained: every block free again and none under writeback.
    fields = "dmsetup status wc | cut -d' ' -f5-7"
    assert guest.wait_for(fields, f"{blocks} {blocks} 0") == f"{blocks} {blocks} 0"
    guest.check("dmsetup remove wc")
    assert guest.sha256(origin, DATA_MB) == want


def test_lvchange_cachemode_writethrough_flushes_under_the_vg_lock_and_a_kill_undoes_it(
    clean_guest: Guest,
) -> None:
    """What ``lvchange --cachemode writethrough`` does with dirty blocks (lvm2 2.03.16): it
    loads the cleaner policy with lvm's default settings instead of the user's, and waits,
    printing ``Flushing N blocks``, until none is left; meanwhile it holds the VG's lock, so
    ``lvs`` cannot answer; killed, it aborts and puts write-back and the user's policy back.
    The slow disk is held so that the flush cannot end while the test looks (640 MiB dirty is
    more than the cleaner sends out at once, so some is still waiting behind the held disk)."""
    guest = clean_guest
    disk, fast, _ = guest.disks
    slow = guest.slow_disk(disk, 2000)
    guest.check(
        f"pvcreate -q --metadatacopies 0 {slow} && pvcreate -q {fast} && "
        f"vgcreate -q vg {slow} {fast}"
    )
    guest.check(f"lvcreate -q -y -n origin -L 1G vg {slow}")
    guest.check(f"lvcreate -q -y --type cache-pool -n fast -L 768M vg {fast}")
    guest.check("lvconvert -q -y --type cache --cachepool vg/fast --cachemode writeback vg/origin")
    guest.check("lvchange -q --cachesettings migration_threshold=4096 vg/origin")
    user_table = guest.check("dmsetup table vg-origin").split()
    assert user_table[-5:] == ["writeback", "smq", "2", "migration_threshold", "4096"]
    guest.check("dd if=/dev/zero of=/dev/vg/origin bs=1M count=640 oflag=direct status=none")
    log = "/run/lvchange.log"
    # Start it, and hold the slow disk the moment it says it is flushing (one guest script:
    # no round trip between the two).
    guest.check(
        "nohup sh -c 'lvchange --cachemode writethrough vg/origin; echo \"exit status $?\"' "
        f"> {log} 2>&1 < /dev/null & "
        f"until grep -q Flushing {log}; do sleep 0.1; done; dmsetup suspend {SLOW_NAME}"
    )
    try:
        # The cleaner, in writethrough, with none of the user's settings.
        table = guest.check("dmsetup table vg-origin").split()
        assert table[-4:] == ["metadata2", "writethrough", "cleaner", "0"], table
        # Once what was under way when the disk was held has settled, lvchange keeps saying
        # how many blocks the kernel still holds dirty, and does not return.
        settled = (
            "a=-1; b=$(dmsetup status vg-origin | cut -d' ' -f14); "
            'while [ "$a" != "$b" ]; do sleep 1; a=$b; '
            "b=$(dmsetup status vg-origin | cut -d' ' -f14); done; echo $b"
        )
        dirty = int(guest.check(settled))
        assert dirty > 0
        flushing = f"Flushing {dirty} blocks for cache vg/origin."
        assert guest.wait_for(f"tail -n1 {log} | sed 's/^ *//'", flushing) == flushing
        assert "exit status" not in guest.check(f"cat {log}")
        # The VG's lock is held: lvs waits until interrupted (the suspended PV is skipped so
        # that the wait is for the lock, not for the disk). --readonly answers, with the
        # committed metadata: still writeback smq.
        ignore = "--config 'devices { ignore_suspended_devices = 1 }'"
        status, _, err = guest.run(f"timeout -s INT 5 lvs {ignore} vg/origin")
        assert status != 0 and "Giving up waiting for lock." in err, err
        committed = guest.check(
            f"lvs --readonly {ignore} --noheadings -o cache_mode,cache_policy vg/origin"
        )
        assert committed.split() == ["writeback", "smq"]
        # Killed: it aborts, and once the disk lets go it puts the user's table back.
        guest.check("kill -TERM $(pidof lvchange)")
        guest.wait_for(f"grep -c Interrupted {log}", "1")
    finally:
        guest.release_writes()
    guest.wait_for(f"grep -c 'exit status' {log}", "1")
    out = guest.check(f"cat {log}")
    assert "Flushing of vg/origin aborted." in out and "exit status 5" in out
    assert guest.check("dmsetup table vg-origin").split() == user_table
