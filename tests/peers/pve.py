"""A stand-in of the Proxmox VE API (``api2/json``) on loopback, with state, checked against
PVE's published API description.

No runnable Proxmox VE exists for tests (it is a whole Debian-based distribution with a
cluster filesystem and QEMU), so this is a TEST DOUBLE: a small HTTPS server answering the
paths and JSON shapes of the PVE API as the API viewer (pve-docs ``api-viewer/apidata.js``)
describes them and as a real node answers them:

- ``access/ticket`` (ticket + CSRFPreventionToken, 401 on a wrong password) and
  ``PVEAPIToken`` headers; ``access/permissions?path=`` (the login's privileges in force on
  the path: those of its ACLs there and above, as propagated ACLs give them);
- ``cluster/resources?type=vm``, ``cluster/status`` (the quorum), ``nodes``,
  ``nodes/{node}/status`` (``command=shutdown``: the node goes offline a moment later);
- ``nodes/{node}/{qemu|lxc}/{vmid}/status/{current,shutdown,stop,start}`` (actions answer
  a ``UPID:`` task id), ``nodes/{node}/tasks?source=active&vmid=`` (a guest's
  ``qmshutdown``/``vzshutdown`` until it is off), ``agent/ping`` (500 "QEMU guest agent is
  not running" until it runs);
- HA: ``cluster/ha/resources`` (and PUT ``cluster/ha/resources/{sid}`` with ``state``; an
  unknown one answers 500 "service 'vm:999' not defined"), ``cluster/ha/status/current``
  (its ``fencing`` entry's ``armed-state``: ``armed``, ``disarming``, ``disarmed``,
  ``standby`` with no resource), ``cluster/ha/status/disarm-ha`` and ``arm-ha`` (PVE 9.1
  and later; ``ha_disarm: False`` serves a PVE before 9.1 without them);
- Ceph: ``cluster/ceph/flags`` (GET the flags, PUT ``flag=1|0``) and ``cluster/ceph/status``
  (Ceph's own status as PVE composes it), served by the ``ceph`` CLI against REAL monitors
  and OSDs (``tests.peers.ceph``): the flags are set and read at the monitor, and the OSDs
  up are those whose daemon runs.

The cluster's quorum is its nodes online against its nodes (more than half): without it
the cluster's writes (``cluster/*`` PUT and POST, guest starts) answer 500 as pmxcfs does
when read-only ("cluster not ready - no quorum?").

Every request is checked against ``tests/fixtures/pve/apidata.json`` (``apidata.js`` trimmed
to the paths used): a path or method it lacks, a parameter it does not know where it allows
no others, a required parameter missing, a value outside its enum or type is answered 400
and kept in ``refused``; the ``pve_api`` fixture fails the test that made one.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ceph import CephCliError, CephMonitor
from tests.peers.redfish import make_certificate

SCHEMA_FILE = Path(__file__).parent.parent / "fixtures" / "pve" / "apidata.json"
PLATFORM_LOG = "upsguard.plugins.platforms.proxmox"
SAID_WITHIN_S = 60.0
"""A bound on a wait for the platform to say something, never a measure of it."""
PASSWORD = "pve-s3cret"
TOKEN = "6f1c0d2e-upsguard-token"
TICKET = "PVE:root@pam:6745A1B2::c2lnbmF0dXJl"
CSRF = "6745A1B2:Y3NyZg"
NO_QUORUM = "cluster not ready - no quorum? (500)"
EVERY_PRIVILEGE = (
    "VM.Audit",
    "VM.PowerMgmt",
    "VM.GuestAgent.Audit",
    "Sys.Audit",
    "Sys.PowerMgmt",
    "Sys.Console",
    "Sys.Modify",
)
"""What the API token of the docs' role holds (the stand-in's default: all of it on ``/``)."""


class Schema:
    """The published API description of the paths used: each request is checked against it."""

    def __init__(self, path: Path = SCHEMA_FILE) -> None:
        self.paths: dict[str, dict[str, Any]] = json.loads(path.read_text())["paths"]
        self._patterns = [
            (re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(p)) + "$"), p)
            for p in self.paths
        ]

    def refusal(self, method: str, path: str, params: dict[str, str]) -> str | None:
        """Why PVE would refuse ``method path`` with ``params``; None when it accepts it."""
        for pattern, template in self._patterns:
            match = pattern.match(path)
            if match is None:
                continue
            described = self.paths[template].get(method)
            if described is None:
                return f"{method} {template}: no such method in the API description"
            given = {**params, **match.groupdict()}
            return _check_params(f"{method} {template}", described, given)
        return f"{method} {path}: no such path in the API description"


def _check_params(where: str, described: dict[str, Any], given: dict[str, str]) -> str | None:
    props: dict[str, dict[str, Any]] = described["properties"]
    if not described.get("additionalProperties", 1):
        unknown = sorted(set(given) - set(props))
        if unknown:
            return f"{where}: property is not defined in schema: {', '.join(unknown)}"
    for name, prop in props.items():
        if name not in given:
            if not prop.get("optional") and "default" not in prop:
                return f"{where}: property is missing and it is not optional: {name}"
            continue
        bad = _bad_value(prop, given[name])
        if bad:
            return f"{where}: {name}: {bad}"
    return None


def _bad_value(prop: dict[str, Any], value: str) -> str | None:
    if "enum" in prop and value not in prop["enum"]:
        return f"value '{value}' does not have a value in the enumeration"
    kind = prop.get("type")
    if kind == "boolean" and value not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        return f"type check ('boolean') failed - got '{value}'"
    if kind == "integer" and not re.fullmatch(r"-?\d+", value):
        return f"type check ('integer') failed - got '{value}'"
    return None


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
    node: str = "pve1"
    actions: list[str] = field(default_factory=list)
    active: list[dict[str, Any]] = field(default_factory=list)  # its node's running tasks


@dataclass
class FakePve:
    """The cluster's state: what the stand-in answers from, and what tests set and read."""

    guests: dict[int, Guest]
    nodes: dict[str, str]
    """Node name: ``online`` or ``offline``."""
    ha_resources: dict[str, str] = field(default_factory=dict)
    """HA resource id (``vm:101``): its requested state (``started``, ``ignored``...)."""
    armed: str = "armed"
    """The HA stack: ``armed``, ``disarming``, ``disarmed`` (``standby`` with no resource)."""
    ha_disarm: bool = True
    """PVE 9.1 and later: ``disarm-ha``/``arm-ha`` and the ``fencing`` status entry exist."""
    ceph: CephMonitor | None = None
    ceph_status_error: str | None = None
    """When set, ``GET cluster/ceph/status`` answers 500 with it instead of Ceph's status (PVE's
    own call to the monitors failed)."""
    ceph_status_garbage: Any = None
    """When set, the data ``GET cluster/ceph/status`` answers instead of Ceph's status."""
    privileges: dict[str, set[str]] = field(default_factory=lambda: {"/": set(EVERY_PRIVILEGE)})
    """The login's privileges by the path of their ACL, each propagated to the paths below."""
    calls: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    """Every UPID the stand-in answered, in order."""

    def later(self, delay: float, fn: Any) -> None:
        threading.Timer(delay, fn).start()

    @property
    def quorate(self) -> bool:
        online = sum(1 for s in self.nodes.values() if s == "online")
        return online * 2 > len(self.nodes)

    @property
    def armed_state(self) -> str:
        if self.armed == "armed" and not self.ha_resources:
            return "standby"
        return self.armed

    def upid(self, node: str, kind: str, ident: str) -> str:
        upid = f"UPID:{node}:000A1B2C:0123ABCD:6745A1B2:{kind}:{ident}:root@pam:"
        self.tasks.append(upid)
        return upid


def off(guest: Guest) -> None:
    """The guest is off: its shutdown task, if any, has ended."""
    guest.running = False
    guest.active.clear()


CEPH_FLAGS = (
    "nobackfill",
    "nodeep-scrub",
    "nodown",
    "noin",
    "noout",
    "norebalance",
    "norecover",
    "noscrub",
    "notieragent",
    "noup",
    "pause",
)


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _handler(pve: FakePve, schema: Schema) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None: ...

        def _send(self, code: int, data: Any, message: str = "") -> None:
            body = json.dumps({"data": data} if code == 200 else {"data": None}).encode()
            self.send_response(code, message or None)
            self.send_header("Content-Type", "application/json;charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self, write: bool) -> bool:
            token = self.headers.get("Authorization", "")
            if token == f"PVEAPIToken=root@pam!upsguard={TOKEN}":
                return True
            cookie = self.headers.get("Cookie", "")
            csrf_ok = not write or self.headers.get("CSRFPreventionToken") == CSRF
            ticket_ok = urllib.parse.unquote(cookie) == f"PVEAuthCookie={TICKET}"
            return ticket_ok and csrf_ok

        def _handle(self, method: str) -> None:
            url = urllib.parse.urlparse(self.path)
            path = "/" + url.path.removeprefix("/api2/json/").strip("/")
            if method == "GET":
                query = dict(urllib.parse.parse_qsl(url.query))
            else:
                length = int(self.headers.get("Content-Length") or 0)
                query = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
            refusal = schema.refusal(method, path, query)
            if refusal is not None:
                pve.refused.append(refusal)
                return self._send(400, None, f"Parameter verification failed: {refusal}")
            if path == "/access/ticket":
                return self._ticket(query)
            if not self._authorized(write=method != "GET"):
                return self._send(401, None, "No ticket")
            pve.calls.append(f"{method} {path.lstrip('/')}")
            try:
                data = _answer(pve, method, path.strip("/").split("/"), query)
            except _Refused as exc:
                return self._send(exc.code, None, exc.message)
            return self._send(200, data)

        def _ticket(self, form: dict[str, str]) -> None:
            if form.get("password") != PASSWORD:
                return self._send(401, None, "authentication failure")
            data = {"ticket": TICKET, "CSRFPreventionToken": CSRF, "username": "root@pam"}
            return self._send(200, data)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PUT(self) -> None:
            self._handle("PUT")

    return Handler


def _answer(pve: FakePve, method: str, parts: list[str], query: dict[str, str]) -> Any:
    """The data of one request the schema accepted; raises ``_Refused`` for PVE's errors."""
    writes = method != "GET"
    if parts[0] == "cluster" and writes and not pve.quorate:
        raise _Refused(500, NO_QUORUM)
    if parts == ["version"]:
        return {"version": "9.1.2", "release": "9.1", "repoid": "faa83925"}
    if parts == ["nodes"]:
        return [{"node": n, "status": s} for n, s in pve.nodes.items()]
    if parts == ["access", "permissions"]:
        path = query.get("path", "/")
        above = [
            acl for acl in pve.privileges if path == acl or path.startswith(acl.rstrip("/") + "/")
        ]
        return {path: {p: 1 for acl in above for p in pve.privileges[acl]}}
    if parts == ["cluster", "resources"]:
        return [_resource(g) for g in pve.guests.values()]
    if parts == ["cluster", "status"]:
        return _cluster_status(pve)
    if parts[:2] == ["cluster", "ha"]:
        return _ha(pve, method, parts[2:], query)
    if parts[:2] == ["cluster", "ceph"]:
        return _ceph(pve, method, parts[2], query)
    if parts[0] == "nodes" and parts[2:] == ["status"]:
        node = parts[1]
        pve.later(0.2, lambda: pve.nodes.__setitem__(node, "offline"))
        return None
    if parts[0] == "nodes" and parts[2:] == ["tasks"]:
        if query.get("source") != "active":
            raise _Refused(501, "this stand-in serves source=active only")
        vmid = query.get("vmid")
        active = [t for g in pve.guests.values() for t in g.active]
        return [t for t in active if vmid in (None, t["id"])]
    return _guest_call(pve, method, parts)


def _resource(guest: Guest) -> dict[str, Any]:
    return {
        "id": f"{guest.kind}/{guest.vmid}",
        "type": guest.kind,
        "vmid": guest.vmid,
        "name": guest.name,
        "node": guest.node,
        "status": "running" if guest.running else "stopped",
        "tags": guest.tags,
        "template": 0,
    }


def _cluster_status(pve: FakePve) -> list[dict[str, Any]]:
    cluster = {
        "id": "cluster",
        "type": "cluster",
        "name": "lab",
        "nodes": len(pve.nodes),
        "quorate": int(pve.quorate),
        "version": 3,
    }
    nodes = [
        {"id": f"node/{n}", "type": "node", "name": n, "online": int(s == "online")}
        for n, s in pve.nodes.items()
    ]
    return [cluster, *nodes]


def _ha(pve: FakePve, method: str, rest: list[str], query: dict[str, str]) -> Any:
    if rest == ["resources"]:
        return [
            {"sid": sid, "state": state, "type": sid.split(":")[0]}
            for sid, state in pve.ha_resources.items()
        ]
    if rest[0] == "resources" and len(rest) == 2 and method == "PUT":
        sid = urllib.parse.unquote(rest[1])
        if sid not in pve.ha_resources:
            raise _Refused(500, f"service '{sid}' not defined")
        state = query.get("state", "started")
        pve.ha_resources[sid] = "started" if state == "enabled" else state
        return None
    if rest in (["status", "disarm-ha"], ["status", "arm-ha"]) and not pve.ha_disarm:
        raise _Refused(501, f"Method 'POST /cluster/ha/{'/'.join(rest)}' not implemented")
    if rest == ["status", "disarm-ha"]:
        if pve.armed != "disarmed":
            pve.armed = "disarming"
            pve.later(0.2, lambda: setattr(pve, "armed", "disarmed"))
        return None
    if rest == ["status", "arm-ha"]:
        pve.armed = "armed"
        return None
    if rest == ["status", "current"]:
        master = next((n for n, s in pve.nodes.items() if s == "online"), "")
        entries: list[dict[str, Any]] = [
            {
                "id": "quorum",
                "type": "quorum",
                "node": master,
                "status": "OK",
                "quorate": int(pve.quorate),
            },
            {"id": "master", "type": "master", "node": master, "status": "active"},
        ]
        if pve.ha_disarm:
            entries.append(
                {
                    "id": "fencing",
                    "type": "fencing",
                    "node": master,
                    "status": pve.armed_state,
                    "armed-state": pve.armed_state,
                    "resource_mode": "ignore",
                }
            )
        entries += [
            {
                "id": f"service:{sid}",
                "type": "service",
                "sid": sid,
                "node": master,
                "status": state,
                "request_state": state,
            }
            for sid, state in pve.ha_resources.items()
        ]
        return entries
    raise _Refused(501, f"{method} cluster/ha/{'/'.join(rest)}: not served by this stand-in")


def _ceph(pve: FakePve, method: str, path: str, query: dict[str, str]) -> Any:
    """``/cluster/ceph/flags`` and ``/cluster/ceph/status`` through the ``ceph`` CLI at a real
    monitor."""
    if pve.ceph is None:
        raise _Refused(500, "binary not installed: /usr/bin/ceph-mon")
    if path == "status" and pve.ceph_status_error is not None:
        raise _Refused(500, pve.ceph_status_error)
    if path == "status" and pve.ceph_status_garbage is not None:
        return pve.ceph_status_garbage
    try:
        if path == "status":
            return pve.ceph.status()
        if method == "GET":
            found = pve.ceph.flags()
            return [{"name": f, "value": int(f in found), "description": f} for f in CEPH_FLAGS]
        for flag, value in query.items():
            pve.ceph.set_flag(flag, value in ("1", "true", "yes", "on"))
    except CephCliError as exc:
        raise _Refused(500, f"got timeout or error from ceph: {exc}") from exc
    node = next(n for n, s in pve.nodes.items() if s == "online")
    return pve.upid(node, "cephsetflags", "")


def _guest_call(pve: FakePve, method: str, parts: list[str]) -> Any:
    guest = pve.guests.get(int(parts[3])) if len(parts) > 3 and parts[3].isdigit() else None
    if guest is None:
        raise _Refused(500, f"{method} {'/'.join(parts)}: no such guest")
    if method == "GET":
        status = "running" if guest.running else "stopped"
        data: dict[str, Any] = {
            "vmid": guest.vmid,
            "name": guest.name,
            "status": status,
            "qmpstatus": status,
        }
        if guest.agent:
            data["agent"] = 1
        return data
    action = parts[-1]
    guest.actions.append(action)
    if parts[4:] == ["agent", "ping"]:
        if guest.running and time.monotonic() >= guest.agent_up_at:
            return {}
        raise _Refused(500, "QEMU guest agent is not running")
    if action == "start" and not pve.quorate:
        raise _Refused(500, NO_QUORUM)
    kind = ("qm" if guest.kind == "qemu" else "vz") + action
    upid = pve.upid(guest.node, kind, str(guest.vmid))
    task = {"upid": upid, "node": guest.node, "type": kind, "id": str(guest.vmid)}
    if action == "shutdown":
        guest.active.append({**task, "user": "root@pam", "starttime": int(time.time())})
        if not guest.ignores_shutdown:
            pve.later(guest.shutdown_s, lambda: off(guest))
    elif action == "stop":
        off(guest)
    elif action == "start":
        guest.running = True
        guest.agent_up_at = time.monotonic() + 1.0
    return upid


@dataclass(frozen=True)
class PveApi:
    """A running stand-in: its state, its port, and the certificate its clients must trust."""

    pve: FakePve
    port: int
    cert: Path


def serve(pve: FakePve, tmp_path: Path) -> tuple[http.server.ThreadingHTTPServer, PveApi]:
    cert, key = make_certificate(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(pve, Schema()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, PveApi(pve, server.server_address[1], cert)


def standalone() -> FakePve:
    """One node, ``pve1``, its guests as the platform tests know them; no HA resource."""
    return FakePve(
        guests={
            101: Guest(101, "dc01", tags="infra"),
            102: Guest(102, "app01", running=False, agent=True, tags="prod"),
            103: Guest(103, "hung01", ignores_shutdown=True, tags="prod"),
            201: Guest(201, "ct-dns", kind="lxc", tags="infra"),
        },
        nodes={"pve1": "online"},
    )


@pytest.fixture
def pve_api(tmp_path: Path) -> Iterator[PveApi]:
    """The stand-in with ``standalone()``'s state; a test changes ``pve_api.pve`` as it needs.
    A request the API description refuses fails the test."""
    server, api = serve(standalone(), tmp_path)
    yield api
    server.shutdown()
    server.server_close()
    assert_all_accepted(api.pve)


def assert_all_accepted(pve: FakePve) -> None:
    """Fail the test when the stand-in received a request PVE's API description refuses."""
    if pve.refused:
        pytest.fail("requests PVE's API description refuses: " + "; ".join(pve.refused))


def settings_of(api: PveApi, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A ``proxmox`` platform's site-file settings for the stand-in (password login)."""
    secret = tmp_path / "pve.pw"
    secret.write_text(PASSWORD + "\n")
    return {
        "type": "proxmox",
        "host": "127.0.0.1",
        "port": api.port,
        "user": "root@pam",
        "password_file": str(secret),
        "ca_file": str(api.cert),
        "poll_interval": "0.1s",
        **extra,
    }


def platform_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the proxmox platform said in its log (``caplog`` at INFO for ``PLATFORM_LOG``)."""
    return [r.getMessage() for r in caplog.records if r.name == PLATFORM_LOG]


async def platform_said(caplog: pytest.LogCaptureFixture, words: str) -> None:
    """Until the proxmox platform has said ``words`` in its log, as an operator reads it; the
    test fails naming what it said instead after ``SAID_WITHIN_S``."""
    try:
        async with asyncio.timeout(SAID_WITHIN_S):
            while not any(words in line for line in platform_lines(caplog)):
                await asyncio.sleep(0.05)
    except TimeoutError:
        said = platform_lines(caplog)
        pytest.fail(f"the platform did not say {words!r} within {SAID_WITHIN_S:g}s: {said}")
