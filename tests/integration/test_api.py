"""The local API against a real ``upsguard run``: bad input gets a 4xx, and no caller starves it.

Requests are written by hand on a raw unix socket, so malformed HTTP reaches the
server as it was sent. After every bad request the service must still answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.integration.test_service import SIMULATED_SITE, gated_service
from tests.peers.service import ServiceProcess, write_site
from upsguard.errors import TemporaryError
from upsguard.status import SiteStatus, StepProgress

__all__ = ["gated_service"]  # a fixture shared with test_service.py

NESTED = b"[" * 30_000 + b"]" * 30_000


def exchange(path: Path, data: bytes, timeout: float = 20.0) -> tuple[int, str]:
    """Send ``data`` as it is and read the answer until the server closes: (status, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        with contextlib.suppress(BrokenPipeError):  # answered before all of a huge request
            sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.") else 0
    return status, body.decode("utf-8", "replace")


def get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()


def post(target: str, body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers) or f"Content-Length: {len(body)}\r\n"
    return f"POST {target} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n".encode() + body


def error_line(body: str) -> str:
    """The reason the server gave: the ``error`` of a JSON answer, else the text itself."""
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.strip()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = write_site(tmp_path_factory.mktemp("api"), SIMULATED_SITE)
    svc.start()
    yield svc
    svc.stop()


BAD_REQUESTS = {
    "negative Content-Length": post("/hold", b"", "Content-Length: -1"),
    "non-numeric Content-Length": post("/hold", b"{}", "Content-Length: two"),
    "a header over 64 KiB": b"GET /status HTTP/1.1\r\nHost: localhost\r\nX-Pad: "
    + b"a" * 70_000
    + b"\r\n\r\n",
    "a body over 64 KiB": post("/hold", b'{"reason": "' + b"x" * 70_000 + b'"}'),
    "JSON nested 30,000 deep": post("/hold", NESTED),
    "a body that is not JSON": post("/hold", b"{reason"),
    "a body that is not an object": post("/hold", b'["why"]'),
    "a reason that is not text": post("/hold", b'{"reason": {"a": 1}}'),
    "only that is not a list": post("/trigger", b'{"direction": "shutdown", "only": "web"}'),
    "limit=nan": get("/history?limit=nan"),
    "limit=inf": get("/history?limit=inf"),
    "limit=-1": get("/history?limit=-1"),
    "limit=10**30": get("/history?limit=" + "1" + "0" * 30),
    "limit=abc": get("/history?limit=abc"),
    "after=nan": get("/events?after=nan"),
    "after=1e300": get("/events?after=1e300"),
    "after=10**30": get("/events?after=" + "1" + "0" * 30),
    "after=-10**30": get("/events?after=-" + "1" + "0" * 30),
    "wait=nan": get("/events?wait=nan"),
    "wait=-5": get("/events?wait=-5"),
}


@pytest.mark.parametrize("request_bytes", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_input_gets_a_4xx_with_a_one_line_reason_and_the_service_goes_on(
    service: ServiceProcess, request_bytes: bytes
) -> None:
    logged = len(service.log.read_text())
    status, body = exchange(service.socket, request_bytes)
    reason = error_line(body)
    assert 400 <= status < 500, (status, body[:300])
    assert reason and "\n" not in reason and len(reason) < 300, body[:300]
    assert service.status()["phase"] == "normal"
    assert "Traceback" not in service.log.read_text()[logged:]


def test_unknown_route_is_404_and_the_answer_is_json(service: ServiceProcess) -> None:
    status, body = exchange(service.socket, get("/nope"))
    assert (status, json.loads(body)) == (404, {"error": "no GET /nope"})
    status, body = exchange(service.socket, get("/history?limit=2"))
    assert status == 200 and set(json.loads(body)) >= {"runs", "phases", "overrides"}


def test_a_reason_is_bounded_and_freed_of_control_characters(service: ServiceProcess) -> None:
    api = service.api()
    reason = "line one\nline two \x1b[31mred\x1b[0m\x07 done\r\u202eevil"
    answer = api.post("/hold", {"reason": reason})
    cleaned = "line one line two [31mred[0m done evil"
    assert answer["reason"] == cleaned
    assert service.status()["held"]["reason"] == cleaned
    api.post("/release", {"reason": "y" * 65_000})
    overrides = api.get("/history?limit=1")["overrides"]
    assert overrides[1]["reason"] == cleaned
    released = overrides[0]["reason"]
    assert released.startswith("yyy") and len(released) == 500 and released.endswith("…")
    claimed = api.post("/hold", {"reason": "x", "who": "mallory\x1b[2J\nroot"})
    assert claimed == {"held": True, "reason": "x"}
    who = api.get("/history?limit=1")["overrides"][0]["who"]
    assert who == "mallory[2J root (as root)"  # the kernel's word stays beside the claim
    api.post("/release", {"reason": ""})


def test_connections_and_long_polls_are_bounded_and_freed_when_callers_leave(
    tmp_path: Path,
) -> None:
    svc = write_site(tmp_path, {**SIMULATED_SITE, "policies": {"poll_interval": "1m"}})
    polls: list[socket.socket] = []
    silent: list[socket.socket] = []
    try:
        svc.start()
        assert svc.proc is not None
        pid = svc.proc.pid
        polls = _flood(svc.socket, get("/events?after=1000000&wait=60"), 20)
        answered = svc.wait(lambda: _answered(polls, 4), "four long-polls to be turned away")
        assert [status for status, _ in answered] == [503] * 4
        assert "16 long-polls waiting already" in error_line(answered[0][1])
        assert svc.status()["phase"] == "normal"  # the other connections stay free

        before = svc.wait(lambda: _settled(pid), "the descriptors to settle")
        silent = _flood(svc.socket, b"", 64 - 16)  # connected, and never a byte sent
        svc.wait(lambda: _open_descriptors(pid) >= before + 64 - 16, "the connections to open")
        with pytest.raises(TemporaryError, match="closed the connection without answering"):
            svc.api().get("/status")

        for sock in polls + silent:
            sock.close()
        svc.wait(lambda: _status_of(svc, "/events?after=1000000&wait=0.1") == 200, "free slots")
    finally:
        for sock in polls + silent:
            sock.close()
        svc.stop()


def _answered(clients: list[socket.socket], count: int) -> list[tuple[int, str]] | None:
    """The answers of the clients whose server has answered and closed, once ``count`` have."""
    answers = []
    for sock in clients:
        try:
            raw = sock.recv(65536, socket.MSG_PEEK)
        except BlockingIOError:
            continue
        head, _, body = raw.partition(b"\r\n\r\n")
        answers.append((int(head.split(b" ", 2)[1]), body.decode()))
    return answers if len(answers) >= count else None


def _status_of(svc: ServiceProcess, target: str) -> int:
    return exchange(svc.socket, get(target))[0]


def test_one_caller_cannot_starve_the_service_of_descriptors(tmp_path: Path) -> None:
    """1,100 long-polls against a service limited to 1,024 open files: it still answers and still
    runs commands, and the descriptors it holds stay bounded."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"this test opens 1,100 sockets; the hard open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
    jobs = [f"job{i}" for i in range(7)]
    site = {
        **SIMULATED_SITE,
        "platforms": {**SIMULATED_SITE["platforms"], "cmd": {"type": "command"}},
        "resources": [
            *SIMULATED_SITE["resources"],
            *({"id": j, "kind": "command", "platform": "cmd", "shutdown": "true"} for j in jobs),
        ],
        "policies": {"poll_interval": "1m"},  # no poll wakes the long-polls up
    }
    svc = write_site(tmp_path, site)
    svc.prefix = ["prlimit", "--nofile=1024", "--"]  # as systemd's LimitNOFILE=1024
    clients: list[socket.socket] = []
    try:
        svc.start()
        assert svc.proc is not None
        pid = svc.proc.pid
        before = _open_descriptors(pid)
        clients = _flood(svc.socket, get("/events?after=1000000&wait=60"), 1100)
        held = svc.wait(lambda: _settled(pid), "the descriptors to settle")
        assert held - before <= 64 + 8, (before, held)
        assert svc.status()["phase"] == "normal"
        out = svc.cli("trigger", "shutdown", "--only", *jobs, "--yes", "--reason", "fd test")
        assert "started run shutdown-" in out.stdout
        svc.wait(lambda: svc.status()["run"] is None, "the run to finish")
        (run,) = svc.api().get("/history?limit=1")["runs"]
        assert run["state"] == "done" and len(run["steps"]) == len(jobs), run
        assert "Too many open files" not in svc.log.read_text()
        assert _open_descriptors(pid) - before <= 64 + 8
    finally:
        for sock in clients:
            sock.close()
        svc.stop()


def _flood(path: Path, request: bytes, count: int) -> list[socket.socket]:
    """``count`` connections sending ``request`` and never reading; each connect is retried for a
    second while the listen backlog is full (a server that closes them at once is fine)."""
    clients = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        clients.append(sock)
        deadline = time.monotonic() + 1.0
        while True:
            try:
                sock.connect(str(path))
                sock.send(request)
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.001)
                    continue
            except OSError:
                pass
            break
    return clients


def _open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settled(pid: int) -> int | None:
    """The service's open descriptors once they stop changing for a moment."""
    first = _open_descriptors(pid)
    time.sleep(0.5)
    second = _open_descriptors(pid)
    return second if second == first else None


def the_model(answer: dict[str, object]) -> SiteStatus:
    """The answer read into the status model, which must keep every field it was sent."""
    status = msgspec.convert(answer, SiteStatus)
    assert msgspec.to_builtins(status) == answer
    return status


def test_status_is_the_status_model_idle_mid_run_and_without_a_service(
    gated_service: tuple[ServiceProcess, Path],
) -> None:
    svc, release = gated_service
    svc.start()
    idle = the_model(svc.api().get("/status"))
    assert idle.service.running and idle.run is None and idle.countdown is not None
    svc.cli("trigger", "shutdown", "--yes", "--reason", "status model")

    def held_at_the_gate() -> SiteStatus | None:
        """The gate alone holds the run: the VMs are down (between web's end and db's start
        the gate runs alone too)."""
        answer = the_model(svc.api().get("/status"))
        if answer.run is None:
            return None
        states = {step.id: step.state for step in answer.run.plan.steps}
        vms_down = states["stop:web"] == states["stop:db"] == StepProgress.DONE
        return answer if vms_down and states["stop:gate"] == StepProgress.RUNNING else None

    busy: SiteStatus = svc.wait(held_at_the_gate, "the run to wait at the gate alone")
    assert busy.run is not None
    assert [s.step for s in busy.run.running] == ["stop:gate"]
    states = {step.id: step.state for step in busy.run.plan.steps}
    assert states["stop:h1"] == StepProgress.WAITING
    assert busy.run.left_s is not None and busy.run.left_s > 0
    release.touch()
    svc.wait(lambda: svc.status()["run"] is None, "the run to finish")
    assert svc.terminate() == 0

    offline = json.loads(svc.cli("status", "--format", "json").stdout)
    status = the_model(offline)
    assert not status.service.running and status.last_run is not None
    assert status.last_run.id == busy.run.id and status.last_run.state == "done"
    assert [u.name for u in status.ups] == [u.name for u in busy.ups]
