"""``upsguard run`` as a real process, and the override CLI against it over the unix socket.

The site uses the built-in simulated UPS (always on line) and simulated
platform, so these tests need no peer; the kill -9 resume test with real
BMCs is in test_service_resume.py, the NUT and vcsim chains in
test_end_to_end.py.
"""

from __future__ import annotations

import functools
import grp
import http.server
import json
import re
import stat
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ports import free_port
from tests.peers.process import Lines
from tests.peers.service import CLI, ServiceProcess, write_site

SIMULATED_SITE: dict[str, Any] = {
    "site": "svc",
    "ups": [{"name": "ups1", "simulated": {"start_charge": 95}}],
    "platforms": {
        "sim": {
            "type": "simulated",
            "guest_shutdown": "1s",
            "host_shutdown": "2s",
            "power_on": "1s",
            "host_power_on": "1s",
        }
    },
    "resources": [
        {"id": "web", "kind": "vm", "platform": "sim", "runs_on": ["h1"], "depends_on": ["db"]},
        {"id": "db", "kind": "vm", "platform": "sim", "runs_on": ["h1"]},
        {"id": "h1", "kind": "host", "platform": "sim"},
    ],
    "policies": {"poll_interval": "500ms"},
}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    svc = write_site(tmp_path, {**SIMULATED_SITE, "service": {"socket_group": "daemon"}})
    yield svc
    svc.stop()


def test_the_socket_is_0660_for_the_configured_group_and_sigterm_is_clean(
    service: ServiceProcess,
) -> None:
    service.start()
    info = service.socket.stat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o660
    assert info.st_gid == grp.getgrnam("daemon").gr_gid
    st = service.status()
    assert st["phase"] == "normal" and st["ups"][0]["status"] == "OL"
    for name in (service.journal, Path(f"{service.journal}-wal")):  # the group may read it
        journal = name.stat()
        assert (stat.S_IMODE(journal.st_mode), journal.st_gid) == (0o640, info.st_gid), name
    assert service.terminate() == 0
    assert not service.socket.exists()
    assert "Traceback" not in service.log.read_text()


@pytest.fixture
def gated_service(tmp_path: Path) -> Iterator[tuple[ServiceProcess, Path]]:
    """The simulated site plus a ``gate`` that h1 waits for: its shutdown command ends only once
    the test creates the file it names (or when the step is cancelled), so a whole-site shutdown
    stays in progress until the test lets it go, however slow or fast the machine is."""
    release = tmp_path / "release-gate"
    gate = {
        "id": "gate",
        "kind": "command",
        "platform": "cmd",
        "shutdown": f"until [ -e '{release}' ]; do sleep 0.1; done",
        "depends_on": ["h1"],  # gate needs h1 running: it stops before h1 does
    }
    site = {
        **SIMULATED_SITE,
        "platforms": {**SIMULATED_SITE["platforms"], "cmd": {"type": "command"}},
        "resources": [*SIMULATED_SITE["resources"], gate],
        "service": {"socket_group": "daemon"},
    }
    svc = write_site(tmp_path, site)
    yield svc, release
    release.touch()
    svc.stop()


def test_override_cli_hold_trigger_history_events_abort(
    gated_service: tuple[ServiceProcess, Path],
) -> None:
    service, _ = gated_service
    service.start()
    assert "held: generator test" in service.cli("hold", "--reason", "generator test").stdout
    st = service.status()
    assert st["held"]["reason"] == "generator test" and st["held"]["who"] == "root"
    text = service.cli("status").stdout
    assert "HOLD by root: generator test" in text
    service.cli("release", "--reason", "test over")
    assert service.status()["held"] is None
    polls = service.status()["service"]["polls"]
    assert service.api().post("/poll", {}) == {"phase": "normal"}  # what NOTIFYCMD calls
    assert service.status()["service"]["polls"] > polls

    started = service.cli("trigger", "shutdown", "--only", "web", "--yes", "--reason", "patching")
    assert "started run shutdown-" in started.stdout
    service.wait(lambda: service.status()["run"] is None, "the partial run to finish")
    history = json.loads(service.cli("history", "--format", "json").stdout)
    run = history["runs"][0]
    assert (run["origin"], run["only"], run["state"]) == ("manual", ["web"], "done")
    assert [s["step"] for s in run["steps"]] == ["stop:web"]
    assert history["overrides"][0]["action"] == "trigger shutdown"
    assert history["overrides"][0]["reason"] == "patching"
    events = service.cli("events", "-n", "50").stdout
    assert "override: trigger shutdown by root: patching (only web)" in events
    assert "done      stop:web: web shut down" in events

    service.cli("trigger", "shutdown", "--yes", "--reason", "whole site")
    service.wait(lambda: _running(service) == ["stop:gate"], "the run to wait at the gate alone")
    st = service.status()
    assert st["phase"] == "shutting_down" and st["run"]["origin"] == "manual"
    busy = service.cli("trigger", "startup", "--yes", check=False)
    assert busy.returncode == 1 and "is in progress" in busy.stderr
    aborted = service.cli("abort", "--yes", "--reason", "wrong button").stdout
    assert aborted.startswith("aborted run shutdown-")
    st = service.status()
    assert st["run"] is None and st["held"]["reason"].startswith("abort by root")
    assert st["phase"] == "recovering"
    assert service.terminate() == 0


def _running(service: ServiceProcess) -> list[str]:
    run = service.status()["run"] or {}
    return [step["step"] for step in run.get("running", [])]


def test_events_follow_prints_new_events_as_they_happen(service: ServiceProcess) -> None:
    """The follower prints the last event first: once it has, it follows, and the hold made
    then is new to it (a hold made before its first request, as a second's sleep allowed on a
    busy machine, was old news that ``-n 0`` does not print, and the test waited for ever)."""
    service.start()
    with subprocess.Popen(
        [*CLI, "events", "-f", "-n", "1", "-c", str(service.site)],
        stdout=subprocess.PIPE,
        text=True,
    ) as follower:
        try:
            assert follower.stdout is not None
            lines = Lines(follower.stdout)
            assert lines.next("the follower's last event")
            service.cli("hold", "--reason", "watching")
            line = lines.next("the follower, after the hold")
            while line and "override: hold" not in line:  # what the start still announced
                line = lines.next("the follower, after the hold")
            assert "override: hold by root: watching" in line
        finally:
            follower.kill()


def test_without_a_service_the_cli_acts_directly_after_confirmation(
    service: ServiceProcess,
) -> None:
    refused = service.cli("hold", "--reason", "x", check=False)
    assert refused.returncode == 1
    assert "service is not running" in refused.stderr and "--yes" in refused.stderr
    service.cli("hold", "--reason", "storm coming", "--yes")
    text = service.cli("status").stdout
    assert "service: NOT RUNNING" in text and "HOLD by root: storm coming" in text
    assert "UPS ups1: OL" in text
    out = service.cli("trigger", "shutdown", "--only", "web", "--yes", "--reason", "direct")
    assert "done      stop:web" in out.stdout
    journal = service.read_journal()
    (run,) = journal.read.runs()
    assert (run.state, run.only, run.origin) == ("done", ("web",), "manual")
    journal.close()
    service.start()  # the service takes up the hold journaled while it was stopped
    assert service.status()["held"]["reason"] == "storm coming"


@dataclass
class Webhook:
    """A webhook receiver on loopback; ``received`` holds each body with its ``auth`` header."""

    url: str
    received: list[dict[str, Any]]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    received: list[dict[str, Any]] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            received.append(
                {"auth": self.headers.get("Authorization"), **json.loads(self.rfile.read(length))}
            )
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Webhook(f"http://127.0.0.1:{server.server_port}/hook", received)
    server.shutdown()
    server.server_close()


def test_metrics_and_notifications(tmp_path: Path, webhook: Webhook) -> None:
    received = webhook.received
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    hook_out = tmp_path / "hook.jsonl"
    hook = tmp_path / "hook.sh"
    hook.write_text(
        f'#!/bin/sh\n{{ cat; echo "$UPSGUARD_EVENT $UPSGUARD_PHASE"; }} >> {hook_out}\n'
    )
    hook.chmod(0o755)
    port = free_port()
    svc = write_site(
        tmp_path,
        {
            **SIMULATED_SITE,
            "service": {
                "metrics_port": port,
                "notify": {
                    "command": [str(hook)],
                    "webhook": {
                        "url": webhook.url,
                        "bearer_token_file": str(token),
                    },
                    "on": ["phase", "step_failed"],
                },
            },
        },
    )
    try:
        svc.start()
        svc.cli("trigger", "shutdown", "--yes", "--reason", "metrics test")
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down")
        svc.wait(lambda: len(received) >= 2, "two webhook calls")
        assert [(r["old"], r["new"]) for r in received[:2]] == [
            ("normal", "shutting_down"),
            ("shutting_down", "down"),
        ]
        assert received[0]["auth"] == "Bearer t0k3n" and received[0]["site"] == "svc"
        svc.wait(lambda: hook_out.exists() and "PhaseChanged down" in hook_out.read_text(), "hook")
        first = json.loads(hook_out.read_text().splitlines()[0])
        assert first["new"] == "shutting_down"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert 'upsguard_phase{phase="down"} 1.0' in metrics
        assert 'upsguard_feed_at_risk{feed="ups1"} 0.0' in metrics
        assert 'upsguard_ups_charge_percent{ups="ups1"} 95.0' in metrics
        step = 'action="host_shutdown",direction="shutdown",state="done"'
        assert f"upsguard_step_duration_seconds_count{{{step}}} 1.0" in metrics
        assert "t0k3n" not in svc.log.read_text()
        assert svc.terminate() == 0
    finally:
        svc.stop()


def test_what_validate_warns_of_is_an_alert_at_every_start(
    tmp_path: Path, webhook: Webhook
) -> None:
    never_on = "nas can never be powered on by upsguard"
    svc = write_site(
        tmp_path,
        {
            **SIMULATED_SITE,
            "platforms": {**SIMULATED_SITE["platforms"], "cmd": {"type": "command"}},
            "resources": [
                *SIMULATED_SITE["resources"],
                {"id": "nas", "kind": "storage", "platform": "cmd", "shutdown": "true"},
            ],
            "service": {"notify": {"webhook": {"url": webhook.url}, "on": ["alert"]}},
        },
    )
    try:

        def warned(times: int) -> bool:
            return sum(never_on in r["text"] for r in webhook.received) == times

        for start in (1, 2):
            svc.start()
            svc.wait(functools.partial(warned, start), f"the warning of start {start}")
            assert svc.terminate() == 0
        alerts = [r for r in webhook.received if never_on in r["text"]]
        assert [a["event"] for a in alerts] == ["Notice", "Notice"]
        assert "resources[3]" in alerts[0]["text"] and "site.yaml:" in alerts[0]["text"]
        journal = svc.read_journal()
        journaled = [e for e in journal.read.events() if never_on in e.text]
        journal.close()
        assert [e.level for e in journaled] == ["warning", "warning"]
    finally:
        svc.stop()


def test_under_systemd_log_lines_carry_priorities_and_no_timestamps(tmp_path: Path) -> None:
    """With its stderr the journal's stream (``JOURNAL_STREAM`` names it), each line starts
    with its syslog priority (sd-daemon(3)), which journalctl shows and filters by, and has no
    time of its own: the journal stamps each line itself."""
    service = write_site(tmp_path, SIMULATED_SITE)
    service.log.touch()
    stream = service.log.stat()
    service.env = {"JOURNAL_STREAM": f"{stream.st_dev}:{stream.st_ino}"}
    service.start()
    service.cli("hold", "--reason", "generator test")
    assert service.terminate() == 0
    lines = service.log.read_text().splitlines()
    assert "<6>upsguard.events: upsguard serving site svc" in lines
    assert "<4>upsguard.events: override: hold by root: generator test" in lines
    assert [line for line in lines if not re.match(r"<[0-7]>\S+: ", line)] == []
    assert [line for line in lines if re.search(r"\d\d:\d\d:\d\d", line)] == []


def test_elsewhere_log_lines_carry_their_time(tmp_path: Path) -> None:
    """A terminal, or a file the service's stderr was sent to under systemd (``2>file``: the
    journal's stream is not stderr then): each line says when."""
    service = write_site(tmp_path, SIMULATED_SITE)
    service.env = {"JOURNAL_STREAM": "1:1"}
    service.start()
    assert service.terminate() == 0
    (serving,) = [line for line in service.log.read_text().splitlines() if "serving" in line]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO upsguard.events: upsguard serving site svc",
        serving,
    )
