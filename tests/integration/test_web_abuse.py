"""The web page's listener against a hostile network, on a real ``upsguard run``: whatever the
page's clients do, the power watch, the steps and the local API keep their descriptors.

Connections are opened by hand on raw sockets, as an attacker on the same network would.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service import SIMULATED_SITE
from tests.peers.ports import free_port
from tests.peers.service import write_site
from upsguard.controller.web.auth import hash_password

FLOOD = 490
"""Idle connections, as many as took a service limited to 512 open files to its limit."""
JOBS = [f"job{i}" for i in range(7)]


def web_site(port: int) -> dict[str, Any]:
    return {
        **SIMULATED_SITE,
        "platforms": {**SIMULATED_SITE["platforms"], "cmd": {"type": "command"}},
        "resources": [
            *SIMULATED_SITE["resources"],
            *({"id": j, "kind": "command", "platform": "cmd", "shutdown": "true"} for j in JOBS),
        ],
        "policies": {"poll_interval": "1s"},
        "web": {
            "port": port,
            "users": [
                {"name": "ana", "role": "operator", "password_hash": hash_password("ana's pw")}
            ],
        },
    }


def test_a_flood_of_idle_connections_to_the_page_leaves_the_steps_and_the_api_their_descriptors(
    tmp_path: Path,
) -> None:
    """490 connections that send nothing, against a service limited to 300 open files: the page
    turns the ones it cannot afford away, ``status`` answers, a shutdown's steps all run."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FLOOD + 200:
        pytest.skip(f"this test opens {FLOOD} sockets; the hard open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, FLOOD + 200), hard))
    port = free_port()
    svc = write_site(tmp_path, web_site(port))
    svc.prefix = ["prlimit", "--nofile=300", "--"]
    clients: list[socket.socket] = []
    try:
        svc.start()
        assert svc.proc is not None
        pid = svc.proc.pid
        clients = flood(port, FLOOD)
        held = svc.wait(lambda: settled(pid), "the descriptors to settle")
        assert svc.status()["phase"] == "normal"
        out = svc.cli("trigger", "shutdown", "--only", *JOBS, "--yes", "--reason", "flood test")
        assert "started run shutdown-" in out.stdout
        svc.wait(lambda: svc.status()["run"] is None, "the run to finish")
        (run,) = svc.api().get("/history?limit=1")["runs"]
        assert run["state"] == "done" and len(run["steps"]) == len(JOBS), run
        assert "Too many open files" not in svc.log.read_text()
        assert held < 300 - 64, held  # the API's own ceiling still fits under the limit
    finally:
        for sock in clients:
            sock.close()
        svc.stop()


def flood(port: int, count: int) -> list[socket.socket]:
    """``count`` TCP connections to the page that never send a byte; each connect is retried
    for a second while the listen backlog is full (one the server closes at once is fine)."""
    clients = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        clients.append(sock)
        deadline = time.monotonic() + 1.0
        while True:
            try:
                sock.connect(("127.0.0.1", port))
            except (BlockingIOError, InterruptedError):
                pass  # under way: the kernel completes it from the backlog
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(0.001)
                    continue
            break
    return clients


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled(pid: int) -> int | None:
    """The service's open descriptors once they stop changing for a moment."""
    first = open_descriptors(pid)
    time.sleep(0.5)
    second = open_descriptors(pid)
    return second if second == first else None
