"""``systemctl reload upsguard`` (SIGHUP) reads the site file again, in the real service.

Defect this reproduces (it failed before the fix): SIGHUP killed the service (exit 129),
as Python's default for the signal does; an outage that began meanwhile had no controller
until systemd started it again.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import yaml

from tests.peers.service import ServiceProcess, write_site


def site(resources: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "site": "reload",
        "ups": [{"name": "u1", "simulated": {}}],
        "platforms": {"sim": {"type": "simulated"}},
        "resources": resources,
        "policies": {"poll_interval": "1s"},
    }


VM = {"id": "vm1", "kind": "vm", "platform": "sim", "runs_on": ["h1"]}
HOST = {"id": "h1", "kind": "host", "platform": "sim"}


def notices(svc: ServiceProcess, words: str) -> list[str]:
    journal = svc.read_journal()
    try:
        return [e.text for e in journal.read.events(after=0, limit=10_000) if words in e.text]
    finally:
        journal.close()


def rewrite(svc: ServiceProcess, resources: list[dict[str, Any]] | None, text: str = "") -> None:
    data = yaml.safe_load(svc.site.read_text())
    if resources is not None:
        data["resources"] = resources
    svc.site.write_text(text or yaml.safe_dump(data, sort_keys=False))


def test_sighup_reads_the_site_file_again_and_a_bad_one_changes_nothing(tmp_path: Path) -> None:
    svc = write_site(tmp_path, site([VM, HOST]))
    svc.start()
    try:
        assert svc.cli("plan", "shutdown").returncode == 0
        rewrite(svc, [VM, HOST, {"id": "vm2", "kind": "vm", "platform": "sim", "runs_on": ["h1"]}])
        assert svc.proc is not None
        svc.proc.send_signal(signal.SIGHUP)
        reloaded = svc.wait(lambda: notices(svc, "reloaded: 3 resources"), "the reload")
        assert reloaded == [f"WARNING: site file {svc.site} reloaded: 3 resources"]
        assert svc.proc.poll() is None  # still serving
        assert svc.status()["service"]["running"]

        good = svc.site.read_text()
        rewrite(svc, None, good.replace("kind: vm", "kind: vmm", 1))
        svc.proc.send_signal(signal.SIGHUP)
        refused = svc.wait(lambda: notices(svc, "not reloaded"), "the refusal")
        assert len(refused) == 1 and refused[0].startswith(
            f"ERROR: site file {svc.site} not reloaded, the one in force stays: resources[0].kind:"
        )
        assert svc.proc.poll() is None
    finally:
        svc.stop()
