"""The whole outage loop against real write-back caches: ``upsguard run`` with a real upsd
(tests/faults/lab.py) watches the QEMU guest's bcache, dm-writecache and lvmcache; the UPS goes
on battery with its battery low; the service flips the three caches to write-through, waits
for the kernel to destage them, and "powers off" the guest as the storage step.

The guest plays the storage system ``nas1`` that the host ``h1`` depends on; the caches live on
it and carry ``db``, so ``h1`` and ``nas1`` are the steps that must wait for clean caches. The
steps' own commands ask the guest's kernel, as they start, how much dirty data it still holds:
that is what must be nothing. The slow backing disk of bcache and dm-writecache is held until
the test has seen ``h1`` waiting, so the wait is real whatever the machine's speed; lvmcache
drains on its own slow disk. After the poweroff the guest boots again with no cache set up,
and the raw backing disk must hold, at each cache's place, exactly the data written through it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import ONLINE, Lab
from tests.peers.guest import MIB, SLOW_OFFSET, Guest, GuestVm
from tests.peers.guest_caches import (
    BCACHE,
    KINDS,
    Bcache,
    Kind,
    Lvmcache,
    Writecache,
    ssh_settings,
)
from upsguard.events import DestageProgress
from upsguard.journal import Journal

pytestmark = [pytest.mark.guest, pytest.mark.nut, pytest.mark.timeout(900)]

DATA_MB = 64  # per cache
MIB_SECTORS = 2048
#: Where each cache lives, in MiB: bcache's and writecache's backing regions on the held slow
#: disk (itself from vda's second MiB), their caches on vdb; lvmcache on a slow disk of its own.
REGIONS = {"bcache": 0, "writecache": 600}
REGION_MB = 600
LVM_START_MB = 1 + 2 * REGION_MB
LVM_MB = 800
OUTAGE = "ups.status: OB DISCHRG LB\nbattery.charge: 50\nbattery.runtime: 900\ninput.voltage: 0\n"

PROBE = """\
#!/bin/sh
# probe STEP: what the guest's kernel says of its caches' dirty data as STEP starts
dir=$(dirname "$0")
out=$({ssh} 'cat {bcache}; dmsetup status wc; dmsetup status vg-origin' 2>&1)
printf '== %s\\n%s\\n' "$1" "$out" >> "$dir/kernel.log"
"""


def linear(guest: Guest, name: str, device: str, start_mb: int, size_mb: int) -> str:
    table = f"0 {size_mb * MIB_SECTORS} linear {device} {start_mb * MIB_SECTORS}"
    guest.check(f"dmsetup create {name} --table '{table}'")
    return f"/dev/mapper/{name}"


def build_caches(guest: Guest) -> dict[str, tuple[Kind, int, str]]:
    """The three caches, each holding DATA_MB of its own random data, dirty. Returns, per
    kind, the cache, the data's offset on the raw vda, and its sha256."""
    disk, fast, source = guest.disks
    guest.check(f"dd if=/dev/urandom of={source} bs=1M count={3 * DATA_MB} oflag=direct")
    slow = guest.slow_disk(disk, 500, sectors=2 * REGION_MB * MIB_SECTORS)
    slow_lvm = guest.slow_disk(
        disk, 500, name="slowlvm", start=LVM_START_MB * MIB_SECTORS, sectors=LVM_MB * MIB_SECTORS
    )
    placed: dict[str, tuple[Kind, int, str]] = {}
    for index, kind_class in enumerate(KINDS):
        kind = kind_class()
        if isinstance(kind, Lvmcache):
            fast_part = linear(guest, "lf", fast, 2 * REGION_MB, LVM_MB)
            kind.create(guest, slow_lvm, fast_part)
            pe_start = int(
                guest.check("pvs --noheadings --units b --nosuffix -o pe_start /dev/mapper/slowlvm")
            )
            ranges = guest.check("lvs -a --noheadings -o lv_name,seg_pe_ranges vg")
            assert re.search(r"\[origin_corig\]\s+/dev/mapper/slowlvm:0-", ranges), ranges
            offset = LVM_START_MB * MIB + pe_start
        else:
            start = REGIONS[kind.id]
            backing = linear(guest, f"{kind.id}-backing", slow, start, REGION_MB)
            kind.create(guest, backing, linear(guest, f"{kind.id}-fast", fast, start, REGION_MB))
            offset = SLOW_OFFSET * 512 + start * MIB
            if isinstance(kind, Bcache):
                # Writeback paused, as a user may leave it, until the provider's flip turns it
                # on: else bcache destages on its own once the cache set is idle a while, and
                # beside two busy loops building the other caches took that long (0 dirty).
                guest.check(f"echo 0 > {BCACHE}/writeback_running")
                shown = guest.check(f"bcache-super-show {backing}")
                first = re.search(r"dev\.data\.first_sector\s+(\d+)", shown)
                assert first, shown
                offset += int(first.group(1)) * 512
        want = guest.sha256(source, DATA_MB, skip_bytes=index * DATA_MB * MIB)
        guest.check(
            f"dd if={source} of={kind.device} bs=1M count={DATA_MB} skip={index * DATA_MB} "
            "oflag=direct status=none"
        )
        placed[kind.id] = (kind, offset, want)
    return placed


def site_changes(lab: Lab, guest: Guest) -> dict[str, Any]:
    """The lab's site with the guest's three caches on nas1, carrying db; h1's and nas1's
    commands probe the guest's kernel first, and nas1's powers the guest off last."""
    ssh = shlex.join(guest.ssh_argv())
    probe = lab.bin / "probe"
    probe.write_text(PROBE.format(ssh=ssh, bcache="/sys/block/bcache0/bcache/dirty_data"))
    probe.chmod(0o755)
    resources = lab.resource_entries()
    for entry in resources:
        if entry["id"] in ("h1", "nas1"):
            entry["shutdown"] = f"{probe} {entry['id']} && {entry['shutdown']}"
        if entry["id"] == "nas1":
            entry["shutdown"] += f" && {{ {ssh} poweroff || true; }}"
    common = {"ssh": ssh_settings(guest), "lives_on": "nas1", "carries": ["db"]}
    caches = [
        {**kind().site_entry(lab.root / "state"), **common, "poll_interval": "500ms",
         "destage_timeout": "5m"}
        for kind in KINDS
    ]  # fmt: skip
    return {"resources": resources, "caches": caches}


def kernel_at_step_start(lab: Lab, placed: dict[str, tuple[Kind, int, str]]) -> dict[str, int]:
    """Per step that probed, the dirty bytes the kernel held, all caches together."""
    found: dict[str, int] = {}
    text = (lab.bin / "kernel.log").read_text()
    for block in text.split("== ")[1:]:
        step, *lines = block.strip().splitlines()
        assert len(lines) == len(KINDS), block
        kinds = [placed[k.id][0] for k in (Bcache, Writecache, Lvmcache)]
        found[step] = sum(kind.parse_dirty(line) for kind, line in zip(kinds, lines, strict=True))
    return found


def test_the_outage_loop_destages_real_caches_before_the_storage_goes_down(
    guest_vm: GuestVm, nut_factory: Any, tmp_path: Path
) -> None:
    guest = guest_vm.ensure_running()
    guest.reset()
    placed = build_caches(guest)
    guest.hold_writes()  # bcache's and writecache's destage cannot end until the test says
    lab = Lab(tmp_path / "lab", nut_factory({"ups1": ONLINE}, ext="dev"))
    svc = lab.service(tmp_path, **site_changes(lab, guest))
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "ups1 read")
        lab.outage(OUTAGE)
        svc.wait(lambda: "stopped db" in lab.calls(), "the VMs down", timeout=120)

        def waiting_on_caches() -> bool:
            """A step waits on a cache that is still dirty: the journal says so."""
            journal = Journal(svc.journal)
            try:
                rows = journal.read.events(limit=1000)
            finally:
                journal.close()
            return any(
                row.kind == DestageProgress.__name__ and " 0 B dirty" not in row.text
                for row in rows
            )

        svc.wait(waiting_on_caches, "h1 waiting for dirty caches", timeout=120)
        assert not lab.begun("h1")
        assert placed["bcache"][0].kernel_dirty(guest) > 0
        assert placed["writecache"][0].kernel_dirty(guest) > 0
        guest.release_writes()

        assert guest_vm.wait_powered_off() == 0  # nas1's step: the guest is off
        lab.wait_all_off(svc, timeout=120)
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
        assert lab.order_violations() == []
    finally:
        svc.stop()
    # What each hardware step's own command found in the kernel as it started: nothing dirty.
    assert kernel_at_step_start(lab, placed) == {"h1": 0, "nas1": 0}

    guest = guest_vm.ensure_running()  # boots again: no cache is set up, the disks are raw
    disk = guest.disks[0]
    for kind, offset, want in placed.values():
        assert guest.sha256(disk, DATA_MB, skip_bytes=offset) == want, kind.id
