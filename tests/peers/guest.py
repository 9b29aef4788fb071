"""A real Linux kernel in a QEMU guest, reached over SSH, for the kernel cache providers.

This machine's own kernel has no device-mapper and no bcache and loads no modules, so tests of
bcache, dm-writecache and lvmcache (dm-cache) boot Debian's kernel under QEMU (TCG: nested KVM
is far slower here) from the image ``scripts/guest-image`` builds and caches.

Fixtures (register ``tests.peers.guest`` in tests/conftest.py's ``pytest_plugins``):

* ``guest_vm`` (session): the one QEMU guest of the session (``GuestVm``), booted when a test
  first asks for it, and booted again if a test powered it off.
* ``guest`` (function): the running ``Guest``. Useful attributes: ``host``, ``port``, ``user``
  (root), ``key_file``, ``known_hosts`` (vouches for the guest's real host key), ``disks``
  (the guest's raw scratch disks, ``/dev/vda``...), ``run(cmd)`` -> ``(exit, stdout, stderr)``
  and ``check(cmd)`` -> stdout (fails the test on a non-zero exit). ``host``, ``port``,
  ``user``, ``key_file`` and ``known_hosts`` are what ``upsguard.plugins.remote.SshTarget``
  asks for, so a provider under test can be pointed at the guest as it is.
* ``clean_guest`` (function): the same guest, with every background load, bcache device,
  device-mapper device and volume group stopped and the scratch disks wiped before the test,
  so tests sharing one boot never see each other's caches.

``booted(folder)`` boots a guest outside pytest (the benchmarks).

Commands run as root through the guest's ``/bin/sh`` (dash, as on a Debian host). The guest
has no udev: ``/dev`` is a devtmpfs, bcache devices are registered by writing to
``/sys/fs/bcache/register``, and lvm2 creates its own device nodes.
If QEMU is missing or the image cannot be built the fixture fails and says why.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peers.ports import free_port
from tests.peers.process import spawn, wait_started

REPO = Path(__file__).resolve().parents[2]
GUEST_IMAGE = REPO / "scripts" / "guest-image"
DISK_NAMES = ("vda", "vdb", "vdc")
DISK_BYTES = 2 * 1024**3  # sparse: only what a test writes takes space on the host
# A safety net, not a measurement: a TCG boot takes about 15 s on 2 busy cores.
BOOT_WITHIN = 300.0
BUILD_WITHIN = 900.0
COMMAND_TIMEOUT = 900.0
MIB = 1024 * 1024
#: Where background loads keep their pid files, in the guest (a tmpfs).
LOAD_DIR = "/run/test-loads"
#: The slow backing disk of ``Guest.slow_disk``: its device-mapper name and where it starts on
#: the raw disk, in sectors (1 MiB).
SLOW_NAME = "slow"
SLOW_OFFSET = 2048

# Stops whatever a test left behind, innermost first (bcache devices and dm devices hold the
# disks open), then wipes every signature: without udev nothing registers a disk again unless
# a test does.
_RESET = r"""
set -u
for dev in $(dmsetup info -c --noheadings -o name 2>/dev/null); do
    dmsetup resume "$dev" 2>/dev/null
done
for pid_file in LOAD_DIR/*.pid; do [ -e "$pid_file" ] && kill "$(cat "$pid_file")" 2>/dev/null; done
rm -f LOAD_DIR/*.pid
for dev in /sys/block/bcache*/bcache; do [ -e "$dev/stop" ] && echo 1 > "$dev/stop"; done
for cset in /sys/fs/bcache/*-*-*-*-*; do [ -e "$cset/stop" ] && echo 1 > "$cset/stop"; done
i=0
while ls -d /sys/block/bcache* /sys/fs/bcache/*-*-*-*-* >/dev/null 2>&1 && [ $i -lt 300 ]; do
    sleep 0.1; i=$((i + 1))
done
vgchange -an >/dev/null 2>&1
dmsetup remove_all --force >/dev/null 2>&1
# lvm's /dev/VG links, left behind when a test removed an LV's device itself
for link in /dev/*/*; do [ -L "$link" ] && [ ! -e "$link" ] && rm -f "$link"; done
for dir in /dev/*/; do rmdir "$dir" 2>/dev/null; done
for disk in DISKS; do
    wipefs -a -q "$disk" || exit 1
    dd if=/dev/zero of="$disk" bs=1M count=8 oflag=direct status=none || exit 1
done
rm -rf /etc/lvm/backup /etc/lvm/archive /run/lvm/*
ls -d /sys/block/bcache* /sys/fs/bcache/*-*-*-*-* 2>/dev/null && exit 1
[ -z "$(dmsetup ls | grep -v 'No devices found')" ] || exit 1
exit 0
"""


@dataclass
class Guest:
    host: str
    port: int
    user: str
    key_file: Path
    known_hosts: Path
    disks: tuple[str, ...]
    console_log: Path
    image_dir: Path
    control_path: Path
    boot_seconds: float = (
        0.0  # from starting QEMU to the first SSH command: reported, never asserted
    )

    def ssh_argv(self, *extra: str) -> list[str]:
        """The ``ssh`` command line for this guest; one multiplexed connection serves every
        call (a fresh key exchange costs about a second of emulated CPU)."""
        return [
            "ssh",
            "-i",
            str(self.key_file),
            "-p",
            str(self.port),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self.control_path}",
            "-o",
            "ControlPersist=yes",
            "-o",
            "ServerAliveInterval=15",
            *extra,
            f"{self.user}@{self.host}",
        ]

    def run(
        self, cmd: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT
    ) -> tuple[int, str, str]:
        """Run ``cmd`` with the guest's shell; return its exit status, stdout and stderr.

        A non-zero status is a result for the caller to judge; 255 means ssh itself failed.
        """
        done = subprocess.run(
            [*self.ssh_argv(), cmd],
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr

    def check(self, cmd: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT) -> str:
        """Run ``cmd`` and return its stdout; fail the test, showing both streams, if it exits
        non-zero."""
        status, out, err = self.run(cmd, input=input, timeout=timeout)
        if status != 0:
            pytest.fail(f"guest: `{cmd}` exited {status}\nstdout: {out[-2000:]}\nstderr: {err}")
        return out

    def reset(self) -> None:
        """Stop every background load, cache and device-mapper device; wipe the scratch disks."""
        script = _RESET.replace("DISKS", " ".join(self.disks)).replace("LOAD_DIR", LOAD_DIR)
        self.check("sh -s", input=script)

    def fill_random(self, disk: str, mib: int) -> str:
        """Fill the start of ``disk`` with random data and return its sha256: the data to write
        through a cache comes from a disk outside it, so its hash is known without holding it."""
        self.check(f"dd if=/dev/urandom of={disk} bs=1M count={mib} oflag=direct status=none")
        return self.sha256(disk, mib)

    def sha256(self, device: str, mib: int, skip_bytes: int = 0) -> str:
        """The sha256 of ``mib`` MiB of ``device`` from ``skip_bytes`` on, read past any page
        cache (``iflag=direct``): what the disk holds, not what the guest remembers."""
        flags = "direct,skip_bytes,count_bytes"
        out = self.check(
            f"dd if={device} bs=1M iflag={flags} skip={skip_bytes} count={mib * MIB} "
            "status=none | sha256sum"
        )
        return out.split()[0]

    def wait_for(self, cmd: str, done: str, within: float = 600.0) -> str:
        """Poll ``cmd`` in the guest until its output, stripped, equals ``done``; return it.
        The loop runs in the guest (one SSH call); ``within`` is a safety net, never a measure."""
        script = (
            f"i=0; while [ $i -lt {int(within * 2)} ]; do out=$({cmd}); "
            f'[ "$out" = "{done}" ] && echo "$out" && exit 0; sleep 0.5; i=$((i+1)); done; '
            'echo "$out"; exit 1'
        )
        return self.check(script).strip()

    def slow_disk(
        self,
        disk: str,
        write_delay_ms: int,
        name: str = SLOW_NAME,
        start: int = SLOW_OFFSET,
        sectors: int | None = None,
    ) -> str:
        """``disk`` from sector ``start`` on (its second MiB by default; ``sectors`` long, or to
        its end) behind dm-delay: reads at once, each write after ``write_delay_ms`` (flushes
        at once). A slow backing disk, as a spindle behind an SSD cache is, makes a destage
        last long enough to be watched; ``hold_writes`` stops it where it is. Returns the
        device's path. Starting past the first MiB keeps what is written to it (an LVM label)
        off the raw disk's first sectors, where a scan of ``/dev`` would find it twice."""
        if sectors is None:
            sectors = int(self.check(f"blockdev --getsz {disk}")) - start
        at = f"{disk} {start}"
        table = f"0 {sectors} delay {at} 0 {at} {write_delay_ms} {at} 0"  # device-mapper/delay.rst
        self.check(f"dmsetup create {name} --table '{table}'")
        return f"/dev/mapper/{name}"

    def hold_writes(self, name: str = SLOW_NAME) -> None:
        """Suspend a slow disk: whatever was delayed goes out now, and every later I/O waits
        until ``release_writes``. A destage under way stops where it is, for as long as a test
        needs, whatever the machine's speed."""
        self.check(f"dmsetup suspend {name}")

    def release_writes(self, name: str = SLOW_NAME) -> None:
        self.check(f"dmsetup resume {name}")

    def restart_sshd(self) -> None:
        """Kill every sshd process, the sessions' too (every SSH connection to the guest drops),
        and wait until init has started sshd again (it says so on the console) and it answers."""
        listening = "Server listening on 0.0.0.0"
        before = self.console_log.read_text(errors="replace").count(listening)
        self.run("nohup sh -c 'sleep 0.5; kill $(pidof sshd)' >/dev/null 2>&1 </dev/null &")
        deadline = time.monotonic() + BOOT_WITHIN
        while time.monotonic() < deadline:
            restarted = self.console_log.read_text(errors="replace").count(listening) > before
            if restarted and self.run("true")[0] == 0:
                return
            time.sleep(0.2)
        pytest.fail(f"guest: sshd did not come back within {BOOT_WITHIN:g}s")

    def start_load(self, name: str, loop_body: str) -> None:
        """Run ``loop_body`` over and over in the background until ``stop_load`` or ``reset``:
        the I/O that VMs keep doing on battery, which changes how the caches destage."""
        script = f"while :; do {loop_body}; done"
        self.check(
            f"mkdir -p {LOAD_DIR}; nohup sh -c {shlex.quote(script)} >/dev/null 2>&1 </dev/null & "
            f"echo $! > {LOAD_DIR}/{name}.pid",
        )

    def stop_load(self, name: str) -> None:
        pid_file = f"{LOAD_DIR}/{name}.pid"
        self.check(
            f"[ -e {pid_file} ] && kill $(cat {pid_file}) 2>/dev/null; rm -f {pid_file}; true"
        )

    def close(self) -> None:
        """End the shared SSH connection (its master runs in the background)."""
        subprocess.run([*self.ssh_argv("-O", "exit")], capture_output=True, timeout=30, check=False)


def build_image() -> Path:
    """The cached image's directory; ``scripts/guest-image`` builds it the first time."""
    try:
        done = subprocess.run(
            [str(GUEST_IMAGE)], capture_output=True, text=True, timeout=BUILD_WITHIN, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/guest-image did not finish within {BUILD_WITHIN:g}s")
    if done.returncode != 0:
        pytest.fail(f"scripts/guest-image failed ({done.returncode}): {done.stderr[-3000:]}")
    image = Path(done.stdout.strip().splitlines()[-1])
    for name in ("vmlinuz", "initrd.cpio", "id_ed25519", "ssh_host_ed25519_key.pub"):
        if not (image / name).is_file():
            pytest.fail(f"scripts/guest-image left no {name} in {image}")
    return image


def _greets(port: int) -> bool:
    """True once the guest's sshd sends its banner. QEMU's user network accepts on the host
    port at once and closes when the guest refuses, so only the banner proves sshd is up."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.settimeout(2)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


class GuestVm:
    """The QEMU process behind a ``Guest``: boots it, and boots it again after a test powered
    it off (the outage test's storage step does). Disks, port and keys stay the same."""

    def __init__(self, base: Path) -> None:
        qemu = shutil.which("qemu-system-x86_64")
        if qemu is None:
            pytest.fail("qemu-system-x86_64 is missing: run scripts/setup --tests")
        image = build_image()
        port = free_port()
        known_hosts = base / "known_hosts"
        key_type, key = (image / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        known_hosts.write_text(f"[127.0.0.1]:{port} {key_type} {key}\n")
        drives: list[str] = []
        for name in DISK_NAMES:
            disk = base / f"{name}.img"
            with disk.open("wb") as file:
                file.truncate(DISK_BYTES)
            drives += ["-drive", f"file={disk},if=virtio,format=raw,cache=unsafe"]
        self.argv = [
            qemu,
            "-accel",
            "tcg",
            "-m",
            "768",
            "-smp",
            "1",
            "-nographic",
            "-no-reboot",
            "-kernel",
            str(image / "vmlinuz"),
            "-initrd",
            str(image / "initrd.cpio"),
            "-append",
            # quiet: every console character costs the emulated CPU; warnings still show.
            "console=ttyS0 panic=-1 quiet",
            *drives,
            "-nic",
            f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{port}-:22",
            "-device",
            "virtio-rng-pci",
        ]
        self.guest = Guest(
            host="127.0.0.1",
            port=port,
            user="root",
            key_file=image / "id_ed25519",
            known_hosts=known_hosts,
            disks=tuple(f"/dev/{name}" for name in DISK_NAMES),
            console_log=base / "console.log",
            image_dir=image,
            control_path=base / "ssh.ctl",
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_running(self) -> Guest:
        """The guest, booted first if it is not running (never booted, or powered off)."""
        if self.running:
            return self.guest
        self.guest.close()  # a master connection to a guest that is gone
        console = self.guest.console_log
        self.proc = spawn(self.argv, console, stdin=subprocess.DEVNULL)
        port = self.guest.port
        started = time.monotonic()
        wait_started(self.proc, console, lambda: _greets(port), "QEMU guest", BOOT_WITHIN, 0.5)
        if "MODPROBE FAILED" in console.read_text(errors="replace"):
            pytest.fail(f"guest: kernel modules did not load: {console.read_text()[-3000:]}")
        self.guest.check("true")
        self.guest.boot_seconds = time.monotonic() - started
        return self.guest

    def wait_powered_off(self, within: float = BOOT_WITHIN) -> int:
        """QEMU's exit status once the guest powered itself off (``-no-reboot``)."""
        assert self.proc is not None
        return self.proc.wait(timeout=within)

    def stop(self) -> None:
        self.guest.close()
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def booted(base: Path) -> Iterator[GuestVm]:
    """A guest booted in ``base`` (its disks, console log and SSH socket), stopped after."""
    vm = GuestVm(base)
    try:
        vm.ensure_running()
        yield vm
    finally:
        vm.stop()


@pytest.fixture(scope="session")
def guest_vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestVm]:
    """One QEMU guest for the whole session, booted when a test first needs it."""
    vm = GuestVm(tmp_path_factory.mktemp("guest"))
    try:
        yield vm
    finally:
        vm.stop()


@pytest.fixture
def guest(guest_vm: GuestVm) -> Guest:
    return guest_vm.ensure_running()


@pytest.fixture
def clean_guest(guest: Guest) -> Guest:
    guest.reset()
    return guest
