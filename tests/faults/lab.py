"""A small site for fault injection: real upsd + dummy-ups, and resources on the ``command``
platform whose scripts log every call, so a test reads what a sysadmin would check:
which resources were stopped, in which order, and how often.

``bin/dev ACTION ID`` is the device behind every resource. ``stop`` logs ``stop ID`` when it
begins and ``stopped ID`` when it ends; while a file ``hold-ID`` exists it waits between
the two, so a test can catch a step in flight without racing the clock. ``status`` exits 0
while the device is on. ``start`` logs ``start ID``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.peers.nut import NutServer
from tests.peers.service import ServiceProcess, write_site

DEVICE_SCRIPT = """\
#!/bin/sh
# dev ACTION ID: one device of the fault-injection lab (tests/faults/lab.py)
dir=$(dirname "$0")
case "$1" in
  stop)
    echo "stop $2" >> "$dir/calls.log"
    polls=0  # held 6,000 polls at most (5 min, the per-test limit): never left polling for ever
    while [ -e "$dir/hold-$2" ]; do
      polls=$((polls + 1)); [ "$polls" -le 6000 ] || exit 1
      sleep 0.05
    done
    echo "stopped $2" >> "$dir/calls.log"
    touch "$dir/off-$2" ;;
  start)
    rm -f "$dir/off-$2"
    echo "start $2" >> "$dir/calls.log" ;;
  status)
    [ ! -e "$dir/off-$2" ] ;;
esac
"""

ONLINE = "ups.status: OL\nbattery.charge: 100\nbattery.runtime: 1800\ninput.voltage: 230\n"
LOW_BATTERY = (
    "ups.status: OB DISCHRG LB\nbattery.charge: 5\nbattery.runtime: 90\ninput.voltage: 0\n"
)

#: web needs db; both run on h1; h1 needs nas1. Shutdown order: web, db, h1, nas1.
RESOURCES: list[dict[str, Any]] = [
    {"id": "web", "kind": "vm", "depends_on": ["db"], "runs_on": ["h1"]},
    {"id": "db", "kind": "vm", "runs_on": ["h1"]},
    {"id": "h1", "kind": "host", "depends_on": ["nas1"]},
    {"id": "nas1", "kind": "storage"},
]
ORDER = [("web", "db"), ("db", "h1"), ("h1", "nas1")]


@dataclass
class Lab:
    """The devices' folder and the site around them."""

    root: Path
    nut: NutServer
    resources: list[dict[str, Any]] = field(default_factory=lambda: [dict(r) for r in RESOURCES])

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def __post_init__(self) -> None:
        self.bin.mkdir(parents=True, exist_ok=True)
        script = self.bin / "dev"
        script.write_text(DEVICE_SCRIPT)
        script.chmod(0o755)

    def resource_entries(self) -> list[dict[str, Any]]:
        dev = self.bin / "dev"
        return [
            {
                **r,
                "platform": r.get("platform", "cmd"),
                "shutdown": f"{dev} stop {r['id']}",
                "startup": f"{dev} start {r['id']}",
                "status": f"{dev} status {r['id']}",
                "guest_timeout": "60s",
            }
            for r in self.resources
        ]

    def site(self, **changes: Any) -> dict[str, Any]:
        """The site file as a dict; ``changes`` replace top-level sections."""
        site: dict[str, Any] = {
            "site": "faults",
            "ups": [self.ups("ups1")],
            "platforms": {"cmd": {"type": "command", "poll_interval": "200ms"}},
            "resources": self.resource_entries(),
            "policies": {
                "poll_interval": "500ms",
                "on_battery": {"after": "1s"},
                "shutdown": {"when_any": ["low_battery", "fsd"]},
                "power_returns": {"online_for": "2s"},
                "startup": {"online_for": "3s", "charge_above": 0},
            },
        }
        site.update(changes)
        return site

    def ups(self, name: str, nut_name: str | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "nut": {"host": "127.0.0.1", "port": self.nut.port, "ups": nut_name or name},
            **extra,
        }

    def service(self, tmp: Path, **changes: Any) -> ServiceProcess:
        return write_site(tmp, self.site(**changes))

    # -- reading what happened ------------------------------------------------------------

    def calls(self) -> list[str]:
        log = self.bin / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def stopped(self) -> list[str]:
        """The devices whose stop ran to its end, in order."""
        return [line.split()[1] for line in self.calls() if line.startswith("stopped ")]

    def begun(self, rid: str) -> bool:
        return f"stop {rid}" in self.calls()

    def is_off(self, rid: str) -> bool:
        return (self.bin / f"off-{rid}").exists()

    def hold(self, rid: str) -> None:
        """The next stop of ``rid`` waits until ``release``."""
        (self.bin / f"hold-{rid}").touch()

    def release(self, rid: str) -> None:
        (self.bin / f"hold-{rid}").unlink(missing_ok=True)

    def release_all(self) -> None:
        """Let every held stop end (a test's teardown: one that failed while holding a device
        leaves no stop waiting on the service it killed)."""
        for hold in self.bin.glob("hold-*"):
            hold.unlink(missing_ok=True)

    def order_violations(self) -> list[str]:
        """Each dependency whose later stop began before the earlier one ended."""
        calls = self.calls()
        found = []
        for first, then in ORDER:
            ended = [i for i, c in enumerate(calls) if c == f"stopped {first}"]
            began = [i for i, c in enumerate(calls) if c == f"stop {then}"]
            if began and (not ended or min(began) < min(ended)):
                found.append(f"{then} began before {first} was down")
        return found

    def outage(self, text: str = LOW_BATTERY, ups: str = "ups1") -> None:
        self.nut.write(ups, text)

    def wait_all_off(self, svc: ServiceProcess, timeout: float = 60.0) -> None:
        svc.wait(
            lambda: all(self.is_off(r["id"]) for r in self.resources), "every device off", timeout
        )


def polls_pass(svc: ServiceProcess, count: int = 4) -> None:
    """Wait until the service has polled ``count`` more times: how a test shows that
    something did not happen, by events rather than by the clock."""
    start = svc.status()["service"]["polls"]
    svc.wait(lambda: svc.status()["service"]["polls"] >= start + count, f"{count} more polls")


def shutdown_cut_and_resumed(
    svc: ServiceProcess, nut: NutServer, kill: str, begun: Callable[[], object]
) -> None:
    """An outage on ``ups1`` whose shutdown is cut, once ``begun()`` says its step's command
    began, by ``kill`` (``kill9``, or ``sigterm`` to the whole unit as ``systemctl stop``
    sends it); the service started again, until its resumed run ends."""
    nut.write("ups1", ONLINE)
    svc.start()
    nut.write("ups1", LOW_BATTERY)
    svc.wait(begun, "the shutdown command to begin")
    if kill == "kill9":
        svc.kill9()
    else:
        assert svc.terminate(group=True) == 0
    svc.start()
    svc.wait(lambda: svc.status()["phase"] == "down", "the resumed run to finish", 90)


def upsguard_lines(log: Path, last: int = 60) -> str:
    """The service's own lines of its log (a library's chatter left out), the last ones."""
    lines = [line for line in log.read_text().splitlines() if " upsguard." in line]
    return "\n".join(lines[-last:])


def the_only_run(svc: ServiceProcess) -> tuple[str, dict[str, str]]:
    """The state of the one run the service journaled, and of each of its steps."""
    journal = svc.read_journal()
    try:
        runs = journal.read.runs(limit=5)
        phases = [(p.old, p.new, p.reason) for p in reversed(journal.read.phases(limit=10))]
    finally:
        journal.close()
    assert len(runs) == 1, "one run expected; the journal holds " + "; ".join(
        [f"{r.id} {r.state} ({r.reason}): {r.detail}" for r in runs]
        + [f"phases {phases}", "service log:\n" + upsguard_lines(svc.log)]
    )
    (run,) = runs
    return run.state, {s.step: s.state for s in run.steps}
