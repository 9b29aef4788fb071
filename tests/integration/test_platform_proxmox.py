"""The proxmox platform through proxmoxer against a recorded Proxmox VE API on loopback.

No runnable Proxmox VE exists for tests (it is a whole Debian-based distribution
with a cluster filesystem and QEMU), so this file serves a TEST DOUBLE: a small
HTTPS server answering the paths and JSON shapes of the PVE 8 REST API as the
PVE API viewer (pve-docs/api-viewer, ``api2/json``) documents and as a real node
answers them: ``access/ticket`` (ticket + CSRFPreventionToken, 401 on a wrong
password), ``PVEAPIToken`` headers, ``cluster/resources?type=vm``, ``nodes``,
``nodes/{node}/{qemu|lxc}/{vmid}/status/{current,shutdown,stop,start}``
(actions answer a ``UPID:`` task id), ``nodes/{node}/tasks?source=active&vmid=``
(the tasks still running: a guest's ``qmshutdown``/``vzshutdown`` until it is off),
``agent/ping`` (500 "QEMU guest agent is not running" until it runs) and
``nodes/{node}/status`` (``command=shutdown``). Its guests change state as real ones
do: a shutdown takes a moment, a hung guest ignores it (its task runs on), an agent
answers some time after the VM starts.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.peers.redfish import make_certificate
from tests.runs import executor_for
from tests.sites import site_from
from upsguard.clock import SystemClock
from upsguard.config.platforms import ProxmoxSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import AuthenticationError, PermanentError
from upsguard.events import Event
from upsguard.models import PlatformName, PowerState, ResourceKind, StepState, StopMethod
from upsguard.plugins import registry
from upsguard.runbooks.planner import Planner

PASSWORD = "pve-s3cret"
TOKEN = "6f1c0d2e-upsguard-token"
TICKET = "PVE:root@pam:6745A1B2::c2lnbmF0dXJl"
CSRF = "6745A1B2:Y3NyZg"


@dataclass
class Guest:
    vmid: int
    name: str
    kind: str = "qemu"
    running: bool = True
    tags: str = ""
    agent: bool = False
    ignores_shutdown: bool = False
    shutdown_s: float = 0.2
    agent_up_at: float = 0.0
    actions: list[str] = field(default_factory=list)
    active: list[dict[str, Any]] = field(default_factory=list)  # its node's running tasks


@dataclass
class FakePve:
    guests: dict[int, Guest]
    nodes: dict[str, str]
    calls: list[str] = field(default_factory=list)

    def later(self, delay: float, fn: Any) -> None:
        threading.Timer(delay, fn).start()


def off(guest: Guest) -> None:
    """The guest is off: its shutdown task, if any, has ended."""
    guest.running = False
    guest.active.clear()


def _handler(pve: FakePve) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None: ...

        def _send(self, code: int, data: Any, message: str = "") -> None:
            body = json.dumps({"data": data} if code == 200 else {"data": None}).encode()
            self.send_response(code, message or None)
            self.send_header("Content-Type", "application/json;charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self, post: bool) -> bool:
            token = self.headers.get("Authorization", "")
            if token == f"PVEAPIToken=root@pam!upsguard={TOKEN}":
                return True
            cookie = self.headers.get("Cookie", "")
            csrf_ok = not post or self.headers.get("CSRFPreventionToken") == CSRF
            ticket_ok = urllib.parse.unquote(cookie) == f"PVEAuthCookie={TICKET}"
            return ticket_ok and csrf_ok

        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            parts = url.path.removeprefix("/api2/json/").strip("/").split("/")
            if not self._authorized(post=False):
                return self._send(401, None, "No ticket")
            pve.calls.append(f"GET {'/'.join(parts)}")
            if parts == ["version"]:
                return self._send(200, {"version": "8.2.4", "release": "8.2", "repoid": "faa83925"})
            if parts == ["nodes"]:
                return self._send(200, [{"node": n, "status": s} for n, s in pve.nodes.items()])
            if parts == ["cluster", "resources"]:
                return self._send(200, [self._resource(g) for g in pve.guests.values()])
            if len(parts) == 3 and parts[2] == "tasks":
                query = urllib.parse.parse_qs(url.query)
                if query.get("source") != ["active"]:
                    return self._send(400, None, "this double serves source=active only")
                vmid = query.get("vmid", [None])[0]
                active = [t for g in pve.guests.values() for t in g.active]
                return self._send(200, [t for t in active if vmid in (None, t["id"])])
            if len(parts) == 6 and parts[4:] == ["status", "current"]:
                guest = pve.guests[int(parts[3])]
                status = "running" if guest.running else "stopped"
                data = {
                    "vmid": guest.vmid,
                    "name": guest.name,
                    "status": status,
                    "qmpstatus": status,
                }
                if guest.agent:
                    data["agent"] = 1
                return self._send(200, data)
            return self._send(501, None, f"Method 'GET /{url.path}' not implemented")

        def _resource(self, guest: Guest) -> dict[str, Any]:
            return {
                "id": f"{guest.kind}/{guest.vmid}",
                "type": guest.kind,
                "vmid": guest.vmid,
                "name": guest.name,
                "node": "pve1",
                "status": "running" if guest.running else "stopped",
                "tags": guest.tags,
                "template": 0,
            }

        def do_POST(self) -> None:
            url = urllib.parse.urlparse(self.path)
            parts = url.path.removeprefix("/api2/json/").strip("/").split("/")
            length = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            if parts == ["access", "ticket"]:
                if form.get("password") != [PASSWORD]:
                    return self._send(401, None, "authentication failure")
                data = {"ticket": TICKET, "CSRFPreventionToken": CSRF, "username": "root@pam"}
                return self._send(200, data)
            if not self._authorized(post=True):
                return self._send(401, None, "No ticket")
            pve.calls.append(f"POST {'/'.join(parts)}")
            if parts[:1] == ["nodes"] and parts[2:] == ["status"]:
                pve.later(0.2, lambda: pve.nodes.__setitem__(parts[1], "offline"))
                return self._send(200, None)
            guest = pve.guests[int(parts[3])]
            action = parts[-1]
            guest.actions.append(action)
            if parts[4:] == ["agent", "ping"]:
                if guest.running and time.monotonic() >= guest.agent_up_at:
                    return self._send(200, {})
                return self._send(500, None, "QEMU guest agent is not running")
            kind = ("qm" if guest.kind == "qemu" else "vz") + action
            upid = f"UPID:pve1:000A1B2C:0123ABCD:6745A1B2:{kind}:{guest.vmid}:root@pam:"
            task = {"upid": upid, "node": "pve1", "type": kind, "id": str(guest.vmid)}
            if action == "shutdown":
                guest.active.append({**task, "user": "root@pam", "starttime": int(time.time())})
                if not guest.ignores_shutdown:
                    pve.later(guest.shutdown_s, lambda: off(guest))
            elif action == "stop":
                off(guest)
            elif action == "start":
                guest.running = True
                guest.agent_up_at = time.monotonic() + 1.0
            return self._send(200, upid)

    return Handler


@pytest.fixture
def fake_pve(tmp_path: Path) -> Iterator[tuple[FakePve, int, Path]]:
    pve = FakePve(
        guests={
            101: Guest(101, "dc01", tags="infra"),
            102: Guest(102, "app01", running=False, agent=True, tags="prod"),
            103: Guest(103, "hung01", ignores_shutdown=True, tags="prod"),
            201: Guest(201, "ct-dns", kind="lxc", tags="infra"),
        },
        nodes={"pve1": "online"},
    )
    cert, key = make_certificate(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(pve))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield pve, server.server_address[1], cert
    server.shutdown()
    server.server_close()


def settings_of(fake: tuple[FakePve, int, Path], tmp_path: Path, **extra: Any) -> dict[str, Any]:
    _, port, cert = fake
    secret = tmp_path / "pve.pw"
    secret.write_text(PASSWORD + "\n")
    return {
        "type": "proxmox",
        "host": "127.0.0.1",
        "port": port,
        "user": "root@pam",
        "password_file": str(secret),
        "ca_file": str(cert),
        "poll_interval": "0.1s",
        **extra,
    }


def platform(fake: tuple[FakePve, int, Path], tmp_path: Path, **extra: Any) -> Any:
    settings = settings_of(fake, tmp_path, **extra)
    return registry.load("platform", "proxmox")(
        PlatformName("pve"), ProxmoxSettings.model_validate(settings), SystemClock()
    )


def guest(name: str, kind: str = "vm", **extra: Any) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": f"res-{name}", "kind": kind, "platform": "pve", "vm": name, **extra}
    )


def test_shutdown_falls_back_to_stop_for_a_hung_guest(fake_pve: Any, tmp_path: Path) -> None:
    pve = fake_pve[0]

    async def scenario() -> list[bool]:
        px = platform(fake_pve, tmp_path)
        [dc, hung] = [(await px.resolve(guest(n)))[0] for n in ("dc01", "hung01")]
        await px.stop(dc, StopMethod.GRACEFUL)
        await px.stop(hung, StopMethod.GRACEFUL)
        seen = [
            await px.wait_for(dc, PowerState.OFF, 5),
            await px.wait_for(hung, PowerState.OFF, 0.5),
        ]
        await px.stop(hung, StopMethod.HARD)
        seen.append(await px.wait_for(hung, PowerState.OFF, 5))
        return seen

    assert asyncio.run(scenario()) == [True, False, True]
    assert pve.guests[101].actions == ["shutdown"]
    assert pve.guests[103].actions == ["shutdown", "stop"]


def test_start_waits_for_the_guest_agent(fake_pve: Any, tmp_path: Path) -> None:
    pve = fake_pve[0]

    async def scenario() -> list[bool]:
        px = platform(fake_pve, tmp_path)
        [app] = await px.resolve(guest("app01"))
        await px.start(app)
        seen = [await px.wait_for(app, PowerState.ON, 5), await px.healthy(app)]
        async with asyncio.timeout(30):  # a bound against a hang, never a measure
            while not await px.healthy(app):
                await asyncio.sleep(0.1)
        return [*seen, True]

    assert asyncio.run(scenario()) == [True, False, True]
    assert pve.guests[102].actions[0] == "start" and pve.guests[102].actions[-1] == "ping"


def test_groups_by_tag_and_name_include_containers(fake_pve: Any, tmp_path: Path) -> None:
    px = platform(fake_pve, tmp_path)
    infra = ResourceConfig.model_validate(
        {"id": "infra", "kind": "vm_group", "platform": "pve", "select": {"tag": "infra"}}
    )
    named = ResourceConfig.model_validate(
        {"id": "h", "kind": "vm_group", "platform": "pve", "select": {"name": "*01"}}
    )
    by_tag = asyncio.run(px.resolve(infra))
    assert [(t.name, t.ref) for t in by_tag] == [
        ("dc01", "pve1/qemu/101"),
        ("ct-dns", "pve1/lxc/201"),
    ]
    assert [t.name for t in asyncio.run(px.resolve(named))] == ["dc01", "app01", "hung01"]


def test_a_node_shuts_down_but_cannot_be_powered_on(fake_pve: Any, tmp_path: Path) -> None:
    node = ResourceConfig.model_validate(
        {"id": "pve1", "kind": "host", "platform": "pve", "host": "pve1"}
    )

    async def scenario() -> bool:
        px = platform(fake_pve, tmp_path)
        [target] = await px.resolve(node)
        assert target.kind is ResourceKind.HOST
        await px.stop(target, StopMethod.GRACEFUL)
        down: bool = await px.wait_for(target, PowerState.OFF, 5)
        with pytest.raises(PermanentError, match="set power_on_via"):
            await px.start(target)
        return down

    assert asyncio.run(scenario()) is True


def test_api_token_authentication(fake_pve: Any, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    px = platform(fake_pve, tmp_path, token_name="upsguard", token_file=str(token))
    [dc] = asyncio.run(px.resolve(guest("101")))
    assert dc.name == "dc01"


def test_wrong_password_and_untrusted_certificate(fake_pve: Any, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    with pytest.raises(AuthenticationError, match="user 'root@pam' was refused"):
        asyncio.run(platform(fake_pve, tmp_path, password_file=str(wrong)).open())
    with pytest.raises(PermanentError, match="TLS certificate is not trusted"):
        asyncio.run(platform(fake_pve, tmp_path, ca_file=None).open())


def test_a_guest_action_under_way_is_found_among_its_nodes_active_tasks(
    fake_pve: Any, tmp_path: Path
) -> None:
    pve = fake_pve[0]

    async def scenario() -> list[str | None]:
        px = platform(fake_pve, tmp_path)
        [dc, hung] = [(await px.resolve(guest(n)))[0] for n in ("dc01", "hung01")]
        await px.stop(hung, StopMethod.GRACEFUL)
        return [
            await px.in_flight(hung, PowerState.OFF),
            await px.in_flight(hung, PowerState.ON),
            await px.in_flight(dc, PowerState.OFF),
        ]

    shutdown, toward_on, idle = asyncio.run(scenario())
    upid = "UPID:pve1:000A1B2C:0123ABCD:6745A1B2:qmshutdown:103:root@pam:"
    assert (shutdown, toward_on, idle) == (f"Proxmox task {upid}", None, None)
    assert "GET nodes/pve1/tasks" in pve.calls


def test_a_resumed_shutdown_waits_for_the_guest_shutdowns_under_way(
    fake_pve: Any, tmp_path: Path
) -> None:
    """A controller asked dc01 and hung01 to shut down, then died; the resumed run asks
    neither again: it waits for dc01's task, and powers hung01 off after its timeout."""
    pve = fake_pve[0]
    pve.guests[101].shutdown_s = 1.0
    quick = {"guest_timeout": "1s"}
    site = site_from(
        tmp_path,
        {
            "site": "pve",
            "ups": [{"name": "ups1", "simulated": {}}],
            "platforms": {"pve": settings_of(fake_pve, tmp_path)},
            "resources": [
                {"id": "dc01", "kind": "vm", "platform": "pve", "vm": "dc01"},
                {"id": "hung01", "kind": "vm", "platform": "pve", "vm": "hung01", **quick},
            ],
        },
    )
    events: list[Event] = []

    async def scenario() -> dict[str, tuple[StepState, str]]:
        died = platform(fake_pve, tmp_path)
        for name in ("dc01", "hung01"):
            [target] = await died.resolve(guest(name))
            await died.stop(target, StopMethod.GRACEFUL)
        px = platform(fake_pve, tmp_path)
        await px.open()
        plan = Planner(site).plan("shutdown")
        pve_platforms = {PlatformName("pve"): px}
        run = executor_for(plan, pve_platforms, SystemClock(), events.append, resumed=True)
        result = await run.run()
        return {str(o.step): (o.state, o.detail) for o in result.outcomes.values()}

    outcomes = asyncio.run(scenario())
    assert pve.guests[101].actions == ["shutdown"]
    assert pve.guests[103].actions == ["shutdown", "stop"]
    assert outcomes["stop:hung01"][0] is StepState.DONE
    assert "qmshutdown:103" in outcomes["stop:hung01"][1]
    assert outcomes["stop:hung01"][1].endswith("; powered off")
    assert outcomes["stop:dc01"][0] is StepState.DONE
