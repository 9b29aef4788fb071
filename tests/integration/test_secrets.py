"""No secret in any output, file or child process.

One site plants a distinctive secret in every field that can hold one: the NUT password
(right for one UPS, wrong for another, on a real upsd), SNMP community and v3 keys, the
IPMI and Redfish passwords (wrong, against a real fake BMC and sushy-emulator), a Proxmox
token and a vCenter password (nobody listening), an FVP login, a health check's basic
password, header value and URL query, the webhook's bearer token and URL path. The
service then runs for real: its platforms fail to connect, a shutdown and a startup run,
a health check fails, the hook and the webhook hear of it. Every output (validate, plan,
simulate, the service's log, status, history, events, metrics, cache and UPS status,
inventory, the report and run book), the journal
file, the webhook's bodies and the environments of every child (the hook, the command
resources, the health command, FVP's pwsh) are searched for every secret: zero hits.
Where a secret must go, it does: the health server receives its credentials.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import stat
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

import tests.peers.nut as nut_peer
from tests.faults.lab import ONLINE
from tests.peers.ports import free_port
from tests.peers.redfish import RedfishBmc
from tests.peers.service import ServiceProcess, write_site

pytestmark = [pytest.mark.nut, pytest.mark.timeout(240)]

#: Every secret the site holds, each findable on its own.
SECRETS = {
    "nut": "Kx1-nut-password-SECRET",
    "nut_wrong": "Kx2-nut-wrong-password-SECRET",
    "community": "Kx3-snmp-community-SECRET",
    "snmp_auth": "Kx4-snmp-auth-key-SECRET",
    "snmp_priv": "Kx5-snmp-priv-key-SECRET",
    "ipmi": "Kx6-ipmi-password-SECRET",
    "redfish": "Kx7-redfish-password-SECRET",
    "proxmox": "Kx8-proxmox-token-SECRET",
    "vcenter": "Kx9-vcenter-password-SECRET",
    "esxi": "Kx10-esxi-password-SECRET",
    "fvp": "Kx11-fvp-password-SECRET",
    "health_pw": "Kx12-health-password-SECRET",
    "health_key": "Kx13-health-header-SECRET",
    "health_query": "Kx14-health-query-SECRET",
    "bearer": "Kx15-webhook-bearer-SECRET",
    "webhook_path": "Kx16-webhook-path-SECRET",
}
BASIC = base64.b64encode(f"monitor:{SECRETS['health_pw']}".encode()).decode()
#: What must never show: the secrets, and the one a header carries encoded.
FORBIDDEN = (*SECRETS.values(), BASIC)

#: The variables the service runs with; none may reach a child.
SERVICE_ENV = {
    "UPSG_NUT_PW": SECRETS["nut"],
    "UPSG_SNMP_AUTH": SECRETS["snmp_auth"],
    "UPSG_SNMP_PRIV": SECRETS["snmp_priv"],
    "UPSG_IPMI_PW": SECRETS["ipmi"],
    "UPSG_RF_PW": SECRETS["redfish"],
    "UPSG_PVE_TOKEN": SECRETS["proxmox"],
    "UPSG_VC_PW": SECRETS["vcenter"],
    "UPSG_FVP_PW": SECRETS["fvp"],
    "UPSG_HEALTH_KEY": SECRETS["health_key"],
    "UPSG_PASSED": "harmless-and-asked-for",
}

DEVICE = """\
#!/bin/sh
# dev ACTION ID: a device that keeps its state in a file and dumps its environment
dir=$(dirname "$0")
env > "$dir/env-$1-$2"
case "$1" in
  stop) touch "$dir/off-$2" ;;
  start) rm -f "$dir/off-$2" ;;
  status) [ ! -e "$dir/off-$2" ] ;;
esac
"""
HOOK = '#!/bin/sh\ndir=$(dirname "$0")\nenv > "$dir/env-hook"\ncat >> "$dir/hook-stdin"\n'
PWSH = """\
#!/bin/sh
dir=$(dirname "$0")
env > "$dir/env-pwsh"
cat > /dev/null
echo "Connect-PrnxServer : Authentication failed for fvpadmin" >&2
exit 1
"""


@dataclass
class WebPeer:
    """An aiohttp server in a thread: the health checks' target and the webhook."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    redirect_to: str = ""

    async def health_basic(self, request: web.Request) -> web.Response:
        self.requests.append({"path": request.path, "auth": request.headers.get("Authorization")})
        return web.Response(status=503, text="not ready")

    async def health_key(self, request: web.Request) -> web.Response:
        ok = request.headers.get("X-Api-Key") == SECRETS["health_key"]
        return web.Response(status=200 if ok else 401)

    async def hook(self, request: web.Request) -> web.Response:
        self.requests.append(
            {
                "path": request.path,
                "auth": request.headers.get("Authorization"),
                "body": await request.text(),
            }
        )
        raise web.HTTPFound(f"{self.redirect_to}/collect?from=hook")

    async def anything(self, request: web.Request) -> web.Response:
        self.requests.append({"path": request.path, "auth": request.headers.get("Authorization")})
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health/basic", self.health_basic)
        app.router.add_get("/health/key", self.health_key)
        app.router.add_post("/services/{tail:.*}", self.hook)
        app.router.add_route("*", "/{tail:.*}", self.anything)
        return app


@pytest.fixture
def web_peers() -> Iterator[tuple[WebPeer, WebPeer]]:
    """The health/webhook server and another origin its redirect points to."""
    loop = asyncio.new_event_loop()
    main, elsewhere = WebPeer(), WebPeer()
    runners = []
    for peer in (main, elsewhere):
        port = free_port()
        runner = web.AppRunner(peer.app())
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        peer.url = f"http://127.0.0.1:{port}"
        runners.append(runner)
    main.redirect_to = elsewhere.url
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield main, elsewhere
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    for runner in runners:
        loop.run_until_complete(runner.cleanup())
    loop.close()


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _secret_file(directory: Path, name: str) -> str:
    path = directory / f"{name}.secret"
    path.write_text(SECRETS[name] + "\n")
    path.chmod(0o600)
    return str(path)


def site(tmp: Path, nut: Any, bmc: Any, redfish: RedfishBmc, web_peer: WebPeer) -> dict[str, Any]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    dev = _script(bin_dir / "dev", DEVICE)
    hook = _script(bin_dir / "hook", HOOK)
    pwsh = _script(bin_dir / "pwsh", PWSH)
    keys = tmp / "keys"
    keys.mkdir()

    def device(rid: str, kind: str, **extra: Any) -> dict[str, Any]:
        return {
            "id": rid,
            "kind": kind,
            "platform": "cmd",
            "shutdown": f"{dev} stop {rid}",
            "startup": f"{dev} start {rid}",
            "status": f"{dev} status {rid}",
            "retries": 0,
            "watts": 300,  # the simulated batteries run down within the hour
            **extra,
        }

    def unused(rid: str, kind: str, platform: str) -> dict[str, Any]:
        return {"id": rid, "kind": kind, "platform": platform, "stop": False, "start": False}

    nut_entry = {"host": "127.0.0.1", "port": nut.port, "user": "guard", "monitor": "secondary"}
    battery = {"runtime_at": {"minutes": 30, "load_watts": 400}}
    query = f"token={SECRETS['health_query']}&verbose=1"
    return {
        "site": "secrets",
        "ups": [
            {
                "name": "ups1",
                "nut": {**nut_entry, "ups": "ups1", "password_env": "UPSG_NUT_PW"},
                **battery,
            },
            {
                **battery,
                "name": "ups2",
                "nut": {
                    **nut_entry,
                    "ups": "ups2",
                    "password_file": _secret_file(keys, "nut_wrong"),
                },
            },
            {
                **battery,
                "name": "ups3",
                "snmp": {
                    "host": "127.0.0.1",
                    "port": free_port(socket.SOCK_DGRAM),
                    "version": "3",
                    "user": "upsguard",
                    "auth_key_env": "UPSG_SNMP_AUTH",
                    "priv_key_env": "UPSG_SNMP_PRIV",
                    "timeout": "300ms",
                    "retries": 0,
                },
            },
            {
                **battery,
                "name": "ups4",
                "snmp": {
                    "host": "127.0.0.1",
                    "port": free_port(socket.SOCK_DGRAM),
                    "community_file": _secret_file(keys, "community"),
                    "timeout": "300ms",
                    "retries": 0,
                },
            },
        ],
        "platforms": {
            "cmd": {"type": "command", "poll_interval": "200ms", "pass_env": ["UPSG_PASSED"]},
            "bmc": _with_env(bmc.settings_dict(), "UPSG_IPMI_PW"),
            "rf": _with_env(redfish.settings_dict(), "UPSG_RF_PW"),
            "pve": {
                "type": "proxmox",
                "host": "127.0.0.1",
                "port": free_port(),
                "user": "upsguard@pve",
                "token_name": "guard",
                "token_env": "UPSG_PVE_TOKEN",
            },
            "vc": {
                "type": "vsphere",
                "host": "127.0.0.1",
                "port": free_port(),
                "user": "upsguard@vsphere.local",
                "password_env": "UPSG_VC_PW",
                "direct_hosts": {"user": "root", "password_file": _secret_file(keys, "esxi")},
            },
        },
        "caches": [
            {
                "name": "fvp1",
                "provider": "fvp",
                "carries": ["app"],
                "fvp_server": "fvp.lab",
                "user": "fvpadmin",
                "password_env": "UPSG_FVP_PW",
                "pwsh_command": str(pwsh),
                "state_dir": str(tmp / "state"),
                "destage_timeout": "1s",
                "on_timeout": "continue",
            }
        ],
        "resources": [
            device("app", "vm"),
            device(
                "nas",
                "storage",
                health={
                    "http": {
                        "url": f"{web_peer.url}/health/basic?{query}",
                        "user": "monitor",
                        "password_file": _secret_file(keys, "health_pw"),
                    },
                    "platform": False,
                    # long enough for a loaded machine's check to be answered (503) before
                    # it: the step's failure must name the URL, not "no answer within"
                    "timeout": "10s",
                    "interval": "200ms",
                },
            ),
            device(
                "nas2",
                "storage",
                health={
                    "http": {
                        "url": f"{web_peer.url}/health/key",
                        "header": "X-Api-Key",
                        "value_env": "UPSG_HEALTH_KEY",
                    },
                    "command": f"env > {bin_dir}/env-health",
                    "pass_env": ["UPSG_PASSED"],
                    "platform": False,
                    "timeout": "20s",
                    "interval": "200ms",
                },
            ),
            unused("hw-ipmi", "host", "bmc"),
            unused("hw-rf", "host", "rf"),
            unused("vm-pve", "vm", "pve"),
            unused("vm-vc", "vm", "vc"),
        ],
        "policies": {
            "poll_interval": "500ms",
            "on_battery": {"after": "1s"},
            "shutdown": {"when_any": ["low_battery", "fsd"]},
            "startup": {"online_for": "1h", "charge_above": 0},
        },
        "service": {
            "metrics_port": free_port(),
            "notify": {
                "command": [str(hook)],
                "pass_env": ["UPSG_PASSED"],
                "on": ["phase", "step_failed", "run", "risk", "override", "alert"],
                "webhook": {
                    "url": f"{web_peer.url}/services/T0/B0/{SECRETS['webhook_path']}",
                    "bearer_token_file": _secret_file(keys, "bearer"),
                    "timeout": "5s",
                },
            },
        },
    }


@dataclass
class Outputs:
    """Everything upsguard printed, by where it came from."""

    forbidden: tuple[str, ...] = FORBIDDEN
    seen: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, text: str | bytes) -> str:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        self.seen[name] = self.seen.get(name, "") + text
        return text

    def cli(self, svc: ServiceProcess, *args: str, check: bool = True) -> str:
        result = svc.cli(*args, check=check)
        self.add(f"upsguard {' '.join(args)}", result.stdout + result.stderr)
        return result.stdout

    def leaks(self) -> list[str]:
        return [
            f"{name}: holds {secret!r}"
            for name, text in self.seen.items()
            for secret in self.forbidden
            if secret in text
        ]


def _with_env(settings: dict[str, Any], variable: str) -> dict[str, Any]:
    """A peer's platform entry with its password from ``variable`` instead of its file."""
    return {k: v for k, v in settings.items() if k != "password_file"} | {"password_env": variable}


@pytest.fixture
def nut(nut_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(nut_peer.USERS, "guard", (SECRETS["nut"], "upsmon secondary"))
    return nut_factory({"ups1": ONLINE, "ups2": ONLINE}, ext="dev")


def test_no_secret_in_any_output_file_or_child(
    tmp_path: Path,
    nut: Any,
    fake_bmc_factory: Any,
    redfish_bmc: RedfishBmc,
    web_peers: tuple[WebPeer, WebPeer],
) -> None:
    web_peer, elsewhere = web_peers
    bmc = fake_bmc_factory(password="the-bmc-own-password")
    svc = write_site(tmp_path, site(tmp_path, nut, bmc, redfish_bmc, web_peer))
    svc.env = dict(SERVICE_ENV)
    out = Outputs()
    bin_dir = tmp_path / "bin"

    # the commands that read the site file alone
    assert "ok: site 'secrets'" in out.cli(svc, "validate")
    out.cli(svc, "plan", "shutdown")
    out.cli(svc, "plan", "startup", "--format", "json")
    out.cli(svc, "simulate")

    # the service, its platforms failing to log in or to connect
    svc.start()
    try:
        reported = ("platform bmc:", "platform rf:", "platform pve:", "platform 'vc': cannot")
        svc.wait(
            lambda: all(line in svc.log.read_text() for line in reported),
            "every failing platform to be reported",
        )
        out.cli(svc, "trigger", "shutdown", "--yes", "--reason", "secrets drill")
        svc.wait(lambda: svc.status()["run"] is None and svc.status()["phase"] != "normal", "stop")
        out.cli(svc, "trigger", "startup", "--yes", "--reason", "secrets drill")
        svc.wait(lambda: _last_run_over(svc, "startup"), "the startup run to end")
        svc.wait(lambda: len(web_peer.requests) >= 3, "the webhook to be called")
        history = out.cli(svc, "history", "--format", "json")
        out.cli(svc, "history")
        events = out.cli(svc, "events", "-n", "1000")
        out.cli(svc, "status", check=False)  # 1: ups2 and ups3 cannot be read, on purpose
        out.cli(svc, "status", "--format", "json", check=False)
        out.cli(svc, "cache", "status", check=False)  # exit 1: the FVP cache cannot be read
        port = yaml.safe_load(svc.site.read_text())["service"]["metrics_port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            out.add("metrics", answer.read())
    finally:
        svc.terminate()
    # what the CLI does with no service: act on the journal and the UPSes directly
    out.cli(svc, "status", check=False)
    out.cli(svc, "history")
    out.cli(svc, "cache", "status", check=False)
    out.cli(svc, "ups", "status", check=False)
    out.cli(svc, "inventory", check=False)
    # the retrospective and the run book, in both formats
    for fmt in ("md", "html"):
        out.cli(svc, "report", "--format", fmt)
        out.cli(svc, "runbook", "--format", fmt)
    out.cli(svc, "battery")

    # it all happened: failures in their words, where a person reads them
    runs = json.loads(history)["runs"]
    nas = next(s for s in runs[0]["steps"] if s["step"] == "start:nas")
    assert nas["state"] == "failed"
    assert "/health/basic?token=***&verbose=***" in nas["detail"] and "HTTP 503" in nas["detail"]
    assert "platform rf:" in events and "platform bmc:" in events
    assert "UPS ups2:" in events

    # where the secrets must go, they went; the redirect took nothing elsewhere
    assert {r["auth"] for r in web_peer.requests if r["path"] == "/health/basic"} == {
        f"Basic {BASIC}"
    }
    hooks = [r for r in web_peer.requests if r["path"].startswith("/services/")]
    assert hooks and {r["auth"] for r in hooks} == {f"Bearer {SECRETS['bearer']}"}
    assert elsewhere.requests == []
    for request in hooks:
        out.add("webhook bodies", request["body"])

    # the children ran, with what their settings asked for and nothing else
    dumps = sorted(bin_dir.glob("env-*"))
    names = {p.name for p in dumps}
    expected = {"env-stop-app", "env-start-app", "env-start-nas", "env-health", "env-hook"}
    assert expected <= names and "env-pwsh" in names, names
    for dump in dumps:
        env = out.add(f"child environment {dump.name}", dump.read_bytes())
        assert "PATH=" in env
        if dump.name != "env-pwsh":
            assert "UPSG_PASSED=harmless-and-asked-for" in env, dump.name
        assert "UPSG_" not in env.replace("UPSG_PASSED=", ""), dump.name
    out.add("hook stdin", (bin_dir / "hook-stdin").read_bytes())

    # the service's log, the journal's files
    out.add("service log", svc.log.read_bytes())
    for path in tmp_path.glob("journal.sqlite*"):
        out.add(path.name, path.read_bytes())
    assert stat.S_IMODE(svc.journal.stat().st_mode) == 0o600

    assert out.leaks() == []


def _last_run_over(svc: ServiceProcess, direction: str) -> bool:
    st = svc.status()
    if st["run"] is not None:
        return False
    runs = json.loads(svc.cli("history", "--format", "json").stdout)["runs"]
    return bool(runs) and runs[0]["direction"] == direction


def test_secrets_written_inline_are_refused_and_not_repeated(
    tmp_path: Path, nut: Any, fake_bmc_factory: Any, redfish_bmc: RedfishBmc
) -> None:
    """The same site with each secret written where it does not belong."""
    bmc = fake_bmc_factory()
    good = site(tmp_path, nut, bmc, redfish_bmc, WebPeer(url="http://127.0.0.1:9"))
    big_number = 98765432109876543210987654321098765
    out = Outputs(forbidden=(*FORBIDDEN, str(big_number)))
    variants: list[dict[str, Any]] = []
    edits: tuple[Callable[[dict[str, Any]], object], ...] = (
        lambda s: s["platforms"].update(ext={"type": "acme", "password": SECRETS["ipmi"]}),
        lambda s: s["platforms"]["rf"].update(password=SECRETS["redfish"]),
        lambda s: s["ups"][3]["snmp"].update(community=SECRETS["community"]),
        lambda s: s["ups"][0]["nut"].update(password_env=big_number),
        lambda s: s["resources"][1]["health"]["http"].update(
            url=f"http://monitor:{SECRETS['health_pw']}@nas01/health"
        ),
        lambda s: s["service"]["notify"]["webhook"].update(
            url=f"https://bot:{SECRETS['bearer']}@hooks.lab/x"
        ),
    )
    for edit in edits:
        variant = json.loads(json.dumps(good))
        edit(variant)
        variants.append(variant)
    for i, variant in enumerate(variants):
        svc = write_site(tmp_path / f"v{i}", variant)
        svc.env = dict(SERVICE_ENV)
        for command in (["validate"], ["run"]):
            result = svc.cli(*command, check=False)
            assert result.returncode == 2, (command, result.stderr)
            assert "Traceback" not in result.stderr
            out.add(f"variant {i}: upsguard {command[0]}", result.stdout + result.stderr)
    assert out.leaks() == []


def test_a_remote_upsd_in_clear_is_warned_of_when_the_service_starts(tmp_path: Path) -> None:
    """What validate warns of, the service's log says at start (upsd here is a documentation
    address that never answers: the warning comes before any reading)."""
    entry = {"host": "192.0.2.10", "ups": "x", "user": "mon", "password_env": "UPSG_NUT_PW"}
    svc = write_site(
        tmp_path,
        {
            "site": "remote",
            "ups": [{"name": "far", "nut": {**entry, "timeout": "1s"}}],
            "resources": [
                {"id": "a", "kind": "command", "platform": "command", "shutdown": "true"}
            ],
        },
    )
    svc.env = dict(SERVICE_ENV)
    svc.start()
    try:
        svc.wait(lambda: "upsguard serving site remote" in svc.log.read_text(), "the service")
    finally:
        svc.terminate()
    log = svc.log.read_text()
    assert "WARNING" in log and "UPS far: upsd at 192.0.2.10 is not on this machine" in log
    assert SECRETS["nut"] not in log
