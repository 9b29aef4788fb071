"""Two ``upsguard run`` processes as an active/standby pair, on real peers on loopback.

The pair shares three etcd members (``tests.peers.etcd``), one UPS on a real upsd whose
stand-in driver logs the instant commands it is sent (``tests.peers.nut_driver``), and
upsguard-vcsim (``tests.peers.vcsim``), whose guests take a while to shut down. The web VMs,
the plan's first, are ``held``: a test that catches a shutdown in the middle starts the
outage with them held (``outage(held=True)``), so that the run waits for them however slow
the machine, and lets them go (``release_guests``) once it acted. Each controller runs on a
VM of the lab (``mgmt-a``, ``mgmt-b``): its own is ``runs_upsguard``, the other's is
``ha.peer_machine``; the controllers' machines are the last two steps of the plan.

One step is a ``command`` resource, ``backups``, which ``dc01`` needs (so it runs once dc01
is down, while the hosts go): its command appends the name of the controller that ran it
to a log file of the lab.

What the tests count is counted at the peers: the guest shutdowns and host shutdowns vcsim
posted as events (in its own order), the commands the UPS's driver received, and the lines
of the command step's log.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.peers.etcd import EtcdSite
from tests.peers.link import Link
from tests.peers.nut import NutServer
from tests.peers.nut_driver import DRIVER_COMMANDS
from tests.peers.service import ServiceProcess, write_site
from tests.peers.vcsim import LAB_ARGS, EventRecorder, Vcsim, VmSpec, create_vm, wait_for_tools
from tests.peers.webhook import WebhookServer
from upsguard.journal.rows import EventRow, RunRow, StepRow

TTL_S = 2
"""The lease of the tests' pairs: etcd's floor is about 1.5 s."""
NAMES = ("ctl-a", "ctl-b")
MACHINES = {"ctl-a": "mgmt-a", "ctl-b": "mgmt-b"}
HOSTS = ("DC0_C0_H0", "DC0_C0_H1")
#: Every VM the shutdown stops, with its host; the controllers' VMs run on a third host.
VMS = {
    "dc01": "DC0_C0_H0",
    "sql01": "DC0_C0_H1",
    "web-01": "DC0_C0_H0",
    "web-02": "DC0_C0_H1",
    "mgmt-a": "DC0_C0_H2",
    "mgmt-b": "DC0_C0_H2",
}
GUEST_SHUTDOWN_MS = 1500
HELD = ("web-01", "web-02")
"""The VMs whose guests shut down only once the test lets them (``PairLab.release_guests``)."""
ONLINE = (
    "ups.status: OL\nbattery.charge: 100\nbattery.runtime: 1800\nups.load: 30\ninput.voltage: 230\n"
)
ON_BATTERY = (
    "ups.status: OB DISCHRG\nbattery.charge: 60\nbattery.runtime: 120\nups.load: 30\n"
    "input.voltage: 0\n"
)
WATCHED = ("VmGuestShutdownEvent", "VmPoweredOffEvent", "HostShutdownEvent")
COMMAND_LOG = "command-step.log"
"""In the lab's directory: one line per run of the command step, the controller's name."""


def start_lab(vcsim_factory: Callable[..., Vcsim], guest_ms: int = GUEST_SHUTDOWN_MS) -> Vcsim:
    sim = vcsim_factory(*LAB_ARGS, "-guest-shutdown-ms", str(guest_ms))
    for vm, host in VMS.items():
        create_vm(sim, VmSpec(vm, host, guest_shutdown="held" if vm in HELD else None))
    wait_for_tools(sim)
    return sim


def start_nut(nut_factory: Callable[..., NutServer]) -> NutServer:
    server: NutServer = nut_factory(
        {"ups1": ONLINE}, ext="dev", fake_drivers={"ups1": DRIVER_COMMANDS}
    )
    return server


@dataclass
class PairLab:
    """The two controllers and the peers they share."""

    etcd: EtcdSite
    nut: NutServer
    vc: Vcsim
    webhook: WebhookServer
    """Where both controllers send their notifications."""
    lab_dir: Path
    controllers: dict[str, ServiceProcess] = field(default_factory=dict)
    recorder: EventRecorder | None = None
    links: dict[str, Link] = field(default_factory=dict)
    """The controllers that reach upsd through a link the test can cut."""
    store_links: dict[str, list[Link]] = field(default_factory=dict)
    """The controllers that reach the etcd members through links the test can cut, one
    per member."""
    ha: dict[str, Any] = field(default_factory=dict)
    """More of both site files' ``ha:`` section (``configure``)."""
    vc_settings: dict[str, Any] = field(default_factory=dict)
    """More of both site files' vCenter platform (``configure``)."""
    unanswered: dict[str, str] = field(default_factory=dict)
    """Why each controller's status last failed to answer (``role``), for a wait's message."""

    # -- the controllers ------------------------------------------------------------------

    def configure(self, vc: dict[str, Any] | None = None, **ha: Any) -> None:
        """Both site files again, with more of the ``ha:`` section and of the vCenter
        platform (``vc``: ``max_parallel``) (before ``start``)."""
        self.ha, self.vc_settings = ha, vc or {}
        for name in NAMES:
            self._write_site(name)

    def _write_site(self, name: str) -> None:
        link = self.links.get(name)
        store = self.store_links.get(name)
        self.controllers[name] = site_of(
            self.lab_dir,
            name,
            self.etcd,
            self.nut,
            self.vc,
            self.webhook,
            ups_port=link.port if link is not None else None,
            endpoints=[s.url for s in store] if store is not None else None,
            vc_settings=self.vc_settings,
            **self.ha,
        )

    def link_to_ups(self, name: str) -> Link:
        """``name`` reaches upsd through a link of its own, which the test can cut (before
        ``start``); the other controller keeps its direct path."""
        link = self.links[name] = Link(self.nut.port)
        self._write_site(name)
        return link

    def link_to_store(self, name: str) -> list[Link]:
        """``name`` reaches each etcd member through a link of its own, which the test can
        cut and restore (before ``start``); the other controller keeps its direct paths."""
        ports = [member.client_port for member in self.etcd.cluster.members]
        links = self.store_links[name] = [Link(port) for port in ports]
        self._write_site(name)
        return links

    def cut_from_store(self, name: str) -> None:
        """Every path from ``name`` to etcd cut (``link_to_store``): its machine's network
        to the members is down, the members and the other controller are not."""
        for link in self.store_links[name]:
            link.cut()

    def restore_store(self, name: str) -> None:
        for link in self.store_links[name]:
            link.restore()

    def start(self, *names: str) -> None:
        for name in names or NAMES:
            self.controllers[name].start()

    def pause(self, name: str) -> None:
        """SIGSTOP: the process stands still, as in a frozen VM, holding its sockets."""
        proc = self.controllers[name].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)

    def wake(self, name: str) -> None:
        """SIGCONT after ``pause``: the process goes on where it stood."""
        proc = self.controllers[name].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGCONT)

    def status(self, name: str) -> dict[str, Any]:
        return self.controllers[name].status()

    def role(self, name: str) -> str | None:
        """The controller's role, None while it does not answer."""
        proc = self.controllers[name].proc
        if proc is None or proc.poll() is not None:
            return None
        try:
            ha = self.status(name)["ha"]
        except Exception as exc:  # not answering (stopped, starting): no role to read
            self.unanswered[name] = f"{type(exc).__name__}: {exc}"[:500]
            return None
        self.unanswered.pop(name, None)
        return str(ha["role"]) if ha else None

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.1)
        logs = "\n".join(
            f"--- {n}:\n{c.log.read_text()[-3000:] if c.log.exists() else ''}"
            + (f"\n(its status last failed: {self.unanswered[n]})" if n in self.unanswered else "")
            for n, c in self.controllers.items()
        )
        pytest.fail(f"timed out waiting for {what}:\n{logs}")

    def leader(self, timeout: float = 30.0) -> str:
        """The controller that leads, once the other is its standby."""

        def roles() -> str | None:
            seen = {name: self.role(name) for name in self.controllers}
            leaders = [n for n, r in seen.items() if r == "leader"]
            others = [r for n, r in seen.items() if n not in leaders]
            if len(leaders) == 1 and all(r == "standby" for r in others):
                return leaders[0]
            return None

        found: str = self.wait(roles, "one leader and one standby", timeout)
        return found

    def events(self, name: str) -> list[EventRow]:
        """The events ``name`` journaled, oldest first."""
        journal = self.controllers[name].read_journal()
        try:
            return journal.read.events(limit=100_000)
        finally:
            journal.close()

    def run(self, name: str, run: str) -> RunRow | None:
        """``run`` as ``name`` journaled it."""
        journal = self.controllers[name].read_journal()
        try:
            return journal.read.run(run)
        finally:
            journal.close()

    def steps(self, name: str, run: str) -> list[StepRow]:
        """The steps of ``run`` ``name`` journaled (each attempt)."""
        journal = self.controllers[name].read_journal()
        try:
            return journal.read.steps(run)
        finally:
            journal.close()

    def other(self, name: str) -> str:
        return next(n for n in self.controllers if n != name)

    def stop(self) -> None:
        for controller in self.controllers.values():
            controller.stop()
        for link in [*self.links.values(), *(s for ls in self.store_links.values() for s in ls)]:
            link.cut()

    # -- the outage and what the peers saw --------------------------------------------------

    def outage(self, held: bool = False) -> None:
        """The mains go: the shutdown is due at once (runtime 2 min < plan + 10 min).
        ``held``: the web VMs' guests do not shut down until ``release_guests``."""
        self.recorder = EventRecorder(self.vc, *WATCHED)
        if not held:
            self.release_guests()
        self.nut.write("ups1", ON_BATTERY)

    def release_guests(self) -> None:
        """The web VMs' guests, held since ``outage(held=True)``, shut down."""
        self.vc.release_guests()

    def mains_back(self) -> None:
        """The mains return: the UPS on line again, charged."""
        self.nut.write("ups1", ONLINE)

    def seen(self) -> list[tuple[str, str]]:
        assert self.recorder is not None, "outage() first"
        return self.recorder.read()

    def asked(self, event: str) -> dict[str, int]:
        """How many times vcsim saw ``event`` for each VM or host."""
        counts: dict[str, int] = {}
        for kind, name in self.seen():
            if kind == event:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def notified(self, event: str) -> list[dict[str, Any]]:
        """The notifications of ``event`` (its kind) the webhook received, in order."""
        return [body for body in self.webhook.received if body.get("event") == event]

    def ups_commands(self) -> list[str]:
        return self.nut.commands_received("ups1")

    def command_step_runs(self) -> list[str]:
        """Which controller ran the command step, each time one did."""
        log = self.lab_dir / COMMAND_LOG
        return log.read_text().split() if log.exists() else []

    def shutdown_done(self, name: str) -> bool:
        """``name`` says the shutdown ended done (its last run)."""
        try:
            status = self.status(name)
        except Exception:
            return False
        last = status.get("last_run") or {}
        return status["run"] is None and last.get("kind") == "shutdown" and last["state"] == "done"

    def finisher(self) -> str | None:
        """The controller whose last run is the shutdown, done. A leader hands the run over
        before its own machine; on a busy machine the other's campaign may go out after the
        leader's quiet, and the leader then takes the run back and finishes it itself
        (docs/ha.md). Either way the one that finishes stops its own machine last."""
        return next((name for name in NAMES if self.shutdown_done(name)), None)

    def assert_each_stopped_once_in_order(self, last: str) -> None:
        """Every VM got one guest shutdown and every host one host shutdown; what needs a
        thing stopped before it; the controllers' machines last, ``last`` the very last."""
        assert self.asked("VmGuestShutdownEvent") == dict.fromkeys(VMS, 1)
        assert self.asked("HostShutdownEvent") == dict.fromkeys(HOSTS, 1)
        order = [name for kind, name in self.seen() if kind != "VmGuestShutdownEvent"]
        off = {name: order.index(name) for name in (*VMS, *HOSTS)}
        assert max(off["web-01"], off["web-02"]) < off["sql01"] < off["dc01"]
        for vm, host in VMS.items():
            if host in HOSTS:
                assert off[vm] < off[host], f"{vm} went down after its host {host}"
        machines = sorted(MACHINES.values(), key=lambda m: off[m])
        assert all(off[m] > max(off[h] for h in HOSTS) for m in machines)
        assert machines[-1] == last
        assert len(self.command_step_runs()) == 1, self.command_step_runs()


def site_of(
    lab_dir: Path,
    name: str,
    etcd: EtcdSite,
    nut: NutServer,
    vc: Vcsim,
    webhook: WebhookServer,
    ups_port: int | None = None,
    endpoints: list[str] | None = None,
    vc_settings: dict[str, Any] | None = None,
    **ha: Any,
) -> ServiceProcess:
    """``ups_port``: where this controller reaches upsd (its own link), if not upsd's port;
    ``endpoints``: where it reaches the etcd members (its own links), if not at theirs;
    ``vc_settings``: more of the vCenter platform's settings."""
    directory = lab_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nut.pw").write_text("upsguard-secret\n")
    (directory / "nut.pw").chmod(0o600)
    own, peer = MACHINES[name], MACHINES[next(n for n in NAMES if n != name)]
    vm: dict[str, Any] = {"kind": "vm", "platform": "vc", "guest_timeout": "60s"}
    backups = f"echo {name} >> {shlex.quote(str(lab_dir / COMMAND_LOG))}"
    resources: list[dict[str, Any]] = [
        {"id": "backups", "kind": "command", "platform": "cmd", "shutdown": backups},
        {"id": "dc01", **vm, "depends_on": ["backups"]},
        {"id": "sql01", **vm, "depends_on": ["dc01"]},
        {
            "id": "web",
            **vm,
            "kind": "vm_group",
            "select": {"name": "web-*"},
            "depends_on": ["sql01"],
        },
        *(
            {"id": host, "kind": "host", "platform": "vc", "maintenance_mode": True}
            for host in HOSTS
        ),
        {"id": own, **vm, "runs_upsguard": True},
        {"id": peer, **vm},
    ]
    settings = {
        "name": name,
        "peer_machine": peer,
        "endpoints": endpoints or etcd.endpoints,
        "lease_ttl": f"{TTL_S}s",
        "fence_margin": "0.5s",
        "request_timeout": "0.5s",
        **ha,
    }
    return write_site(
        directory,
        {
            "site": etcd.site,
            "ups": [
                {
                    "name": "ups1",
                    "nut": {
                        "host": "127.0.0.1",
                        "port": ups_port or nut.port,
                        "ups": "ups1",
                        "user": "upsguard",
                        "password_file": str(directory / "nut.pw"),
                        "monitor": "secondary",
                    },
                    "at_shutdown_end": {"command": "shutdown.return"},
                    "link_grace": "1s",  # a controller cut off from upsd says so soon
                }
            ],
            "platforms": {
                "vc": vc.settings_dict(directory, **(vc_settings or {})),
                "cmd": {"type": "command"},
            },
            "resources": resources,
            "ha": settings,
            "service": {"notify": {"webhook": {"url": webhook.url}}},
            "policies": {
                "poll_interval": "300ms",
                "on_battery": {"after": "0.5s"},
                "shutdown": {"when_any": ["low_battery", "runtime < plan + 10m"]},
            },
        },
    )


@pytest.fixture
def pair_lab(
    tmp_path: Path,
    etcd: EtcdSite,
    nut_factory: Callable[..., NutServer],
    vcsim_factory: Callable[..., Vcsim],
    webhook_server: WebhookServer,
) -> Any:
    """A pair on fresh peers; the controllers are started by the test (``start``)."""
    nut = start_nut(nut_factory)
    vc = start_lab(vcsim_factory)
    lab = PairLab(etcd, nut, vc, webhook_server, tmp_path)
    lab.configure()
    yield lab
    lab.stop()
