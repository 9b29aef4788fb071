"""govmomi's vCenter simulator on loopback, with the project's extension (tests/vcsim_ext).

``upsguard-vcsim`` embeds vcsim v0.46.3 and adds what stock vcsim lacks for shutdown tests
(ShutdownHost_Task, Tools-aware ShutdownGuest that takes time or hangs, maintenance mode
that waits for VMs, a BMC stand-in to power hosts back on). The fixture builds it with the
machine's Go when it is missing or older than its source, serves it with a certificate made
here (so TLS is verified as in production), and lays out a small, fixed inventory through
the vSphere API itself.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyVim.connect import Disconnect, SmartConnect
from pyVmomi import vim

from tests.peers.ports import free_port
from tests.peers.tls import self_signed

EXT_DIR = Path(__file__).resolve().parent.parent / "vcsim_ext"
BINARY = "upsguard-vcsim"
USER = "administrator@vsphere.local"
PASSWORD = "vcsim-Secret-1"


def _gobin() -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.fail("Go is not installed: run scripts/setup (it builds upsguard-vcsim)")
    gopath = subprocess.run([go, "env", "GOPATH"], capture_output=True, text=True, check=True)
    return Path(gopath.stdout.strip()) / "bin"


def source_digest() -> str:
    """A digest of the extension's source: each version gets a binary of its own, so that
    worktrees (and CI jobs) with different sources never run each other's build."""
    digest = hashlib.sha256()
    for path in sorted(p for p in EXT_DIR.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def vcsim_binary() -> Path:
    """The extension's binary for this source, built when missing (atomically: another test
    session may build the same one at the same time)."""
    target = _gobin() / f"{BINARY}-{source_digest()}"
    if target.exists():
        return target
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    build = subprocess.run(
        ["go", "build", "-o", str(partial), "."], cwd=EXT_DIR, capture_output=True, text=True
    )
    if build.returncode != 0:
        pytest.fail(f"building {BINARY} failed (run scripts/setup):\n{build.stderr[-2000:]}")
    partial.replace(target)
    return target


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path

    @property
    def ca_file(self) -> Path:
        return self.cert


def make_tls(directory: Path) -> Tls:
    """A self-signed certificate for 127.0.0.1 that doubles as its own CA bundle."""
    return Tls(*self_signed(directory, "vcsim", "vcsim.test"))


@dataclass
class Vcsim:
    """One running simulator: where it listens, how to log in, and a few test helpers."""

    port: int
    tls: Tls
    process: subprocess.Popen[str]
    user: str = USER
    password: str = PASSWORD
    esx: bool = False
    _si: Any = field(default=None, repr=False)

    host = "127.0.0.1"

    def settings_dict(
        self, directory: Path, password: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        """A ``vsphere`` platform entry for a site file; the password goes to a file."""
        secret = directory / "vc.pw"
        secret.write_text((password or self.password) + "\n")
        return {
            "type": "vsphere",
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password_file": str(secret),
            "ca_file": str(self.tls.ca_file),
            **extra,
        }

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.tls.ca_file))

    def connect(self) -> Any:
        """A pyvmomi ServiceInstance for the test's own checks (shared, logged in once)."""
        if self._si is None:
            self._si = SmartConnect(
                host=self.host,
                port=self.port,
                user=self.user,
                pwd=self.password,
                sslContext=self.ssl_context(),
            )
        return self._si

    def content(self) -> Any:
        return self.connect().RetrieveContent()

    def all(self, kind: type) -> list[Any]:
        content = self.content()
        view = content.viewManager.CreateContainerView(content.rootFolder, [kind], True)
        try:
            return list(view.view)
        finally:
            view.Destroy()

    def all_hosts(self) -> list[Any]:
        return self.all(vim.HostSystem)

    def vm(self, name: str) -> Any:
        return next(v for v in self.all(vim.VirtualMachine) if v.name == name)

    def host_system(self, name: str) -> Any:
        return next(h for h in self.all(vim.HostSystem) if h.name == name)

    def power_on_host(self, name: str) -> None:
        """The BMC stand-in: what IPMI or Redfish would do after the outage."""
        self._post(f"host-power-on?name={name}")

    def release_guests(self) -> None:
        """The guests made ``held`` (``VmSpec.guest_shutdown``) shut down from now on."""
        self._post("release-guests")

    def _post(self, path: str) -> None:
        url = f"https://{self.host}:{self.port}/upsguard/{path}"
        request = urllib.request.Request(url, method="POST")
        with urllib.request.urlopen(request, context=self.ssl_context(), timeout=10):
            pass

    def stop(self) -> None:
        if self._si is not None:
            with contextlib.suppress(Exception):  # the simulator may already be gone
                Disconnect(self._si)
            self._si = None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:  # read up to GOVC_URL, then left
            self.process.stdout.close()


def start_vcsim(tls: Tls, *args: str, esx: bool = False, port: int | None = None) -> Vcsim:
    """Start upsguard-vcsim on a free loopback port; ready once it prints GOVC_URL."""
    port = port or free_port()
    cmd = [
        str(vcsim_binary()),
        "-l",
        f"127.0.0.1:{port}",
        "-username",
        USER,
        "-password",
        PASSWORD,
        "-tlscert",
        str(tls.cert),
        "-tlskey",
        str(tls.key),
        *(["-esx"] if esx else []),
        *args,
    ]
    env = {**os.environ, "GOTRACEBACK": "single"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "GOVC_URL" not in line:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        pytest.fail(f"{BINARY} did not start ({' '.join(cmd[1:])}): {line!r}")
    return Vcsim(port=port, tls=tls, process=proc, esx=esx)


# --- inventory layout through the API ------------------------------------------------------


def wait_task(task: Any, timeout: float = 30.0) -> Any:
    """Poll a vcsim task (pyVim's WaitForTask chokes on vcsim's task names)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = task.info.state
        if state == "success":
            return task.info.result
        if state == "error":
            raise RuntimeError(task.info.error.msg or type(task.info.error).__name__)
        time.sleep(0.02)
    raise TimeoutError("vcsim task did not finish")


def folder_path(sim: Vcsim, path: str) -> Any:
    """The VM folder at ``path`` under the first datacenter, made if missing."""
    content = sim.content()
    dc = content.rootFolder.childEntity[0]
    folder = dc.vmFolder
    for part in [p for p in path.split("/") if p]:
        child = next(
            (c for c in folder.childEntity if isinstance(c, vim.Folder) and c.name == part),
            None,
        )
        folder = child or folder.CreateFolder(part)
    return folder


@dataclass(frozen=True)
class VmSpec:
    name: str
    host: str
    folder: str = ""
    tools: bool = True
    guest_shutdown: str | None = None
    """Milliseconds, "hang" (never), or "held" (once ``Vcsim.release_guests``)."""
    attributes: dict[str, str] = field(default_factory=dict)
    power_on: bool = True


def create_vm(sim: Vcsim, spec: VmSpec) -> Any:
    """A VM made through CreateVM_Task on a chosen host, folder and attributes."""
    host = sim.host_system(spec.host)
    pool = host.parent.resourcePool
    extra = []
    if not spec.tools:
        extra.append(vim.option.OptionValue(key="upsguard.tools", value="none"))
    if spec.guest_shutdown is not None:
        extra.append(
            vim.option.OptionValue(key="upsguard.guestShutdownMs", value=spec.guest_shutdown)
        )
    config = vim.vm.ConfigSpec(
        name=spec.name,
        guestId="otherGuest",
        files=vim.vm.FileInfo(vmPathName="[LocalDS_0]"),
        extraConfig=extra,
    )
    folder = folder_path(sim, spec.folder)
    vm = wait_task(folder.CreateVM_Task(config=config, pool=pool, host=host))
    fields = sim.content().customFieldsManager
    for key, value in spec.attributes.items():
        existing = {f.name for f in fields.field or []}
        if key not in existing:
            fields.AddCustomFieldDef(name=key, moType=vim.VirtualMachine)
        vm.setCustomValue(key=key, value=value)
    if spec.power_on:
        wait_task(vm.PowerOnVM_Task())
    return vm


def wait_for_tools(sim: Vcsim, timeout: float = 20.0) -> None:
    """Until every powered-on VM with Tools reports them running (they start after boot)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = [
            vm.name
            for vm in sim.all(vim.VirtualMachine)
            if vm.runtime.powerState == "poweredOn"
            and not any(o.key == "upsguard.tools" for o in vm.config.extraConfig)
            and not vm.name.startswith("vCLS")
            and vm.guest.toolsRunningStatus != "guestToolsRunning"
        ]
        if not pending:
            return
        time.sleep(0.1)
    raise TimeoutError(f"VMware Tools did not start in {pending}")


def tag_vms(sim: Vcsim, category: str, tag: str, vm_names: list[str]) -> None:
    """Attach a vSphere tag through the tagging REST API (tags are not in the SOAP API)."""
    root = f"https://{sim.host}:{sim.port}/rest/com/vmware/cis"
    basic = base64.b64encode(f"{sim.user}:{sim.password}".encode()).decode()

    def call(method: str, path: str, body: Any, auth: dict[str, str]) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", **auth}
        request = urllib.request.Request(root + path, data, headers, method=method)
        with urllib.request.urlopen(request, context=sim.ssl_context(), timeout=10) as answer:
            data = json.loads(answer.read() or b"null")
            return data["value"] if data else None

    token = {
        "vmware-api-session-id": call("POST", "/session", None, {"Authorization": "Basic " + basic})
    }
    spec = {"name": category, "description": "", "cardinality": "SINGLE", "associable_types": []}
    category_id = call("POST", "/tagging/category", {"create_spec": spec}, token)
    spec = {"name": tag, "description": "", "category_id": category_id}
    tag_id = call("POST", "/tagging/tag", {"create_spec": spec}, token)
    for name in vm_names:
        ref = {"object_id": {"id": sim.vm(name)._moId, "type": "VirtualMachine"}}
        call("POST", f"/tagging/tag-association/id:{tag_id}?~action=attach", ref, token)


LIMITED_USER = "limited@vsphere.local"
LIMITED_PASSWORD = "limited-Secret-1"


def grant(
    sim: Vcsim,
    principal: str,
    role: str,
    privileges: list[str],
    entity: Any | None = None,
    propagate: bool = True,
) -> None:
    """A role with ``privileges`` for ``principal`` on ``entity`` (the root folder), through
    the API as an administrator would; upsguard-vcsim answers privilege questions from it."""
    content = sim.content()
    manager = content.authorizationManager
    manager.AddAuthorizationRole(name=role, privIds=privileges)
    role_id = next(r.roleId for r in manager.roleList if r.name == role)
    permission = vim.AuthorizationManager.Permission(
        principal=principal, group=False, roleId=role_id, propagate=propagate
    )
    manager.SetEntityPermissions(entity=entity or content.rootFolder, permission=[permission])


def host_names(sim: Vcsim) -> list[str]:
    return sorted(h.name for h in sim.all(vim.HostSystem))


# --- reading what happened, in order -------------------------------------------------------


class EventRecorder:
    """Event collectors made before acting: the simulator's own record of what went down when."""

    def __init__(self, sim: Vcsim, *event_types: str) -> None:
        content = sim.content()
        spec = vim.event.EventFilterSpec(
            eventTypeId=list(event_types),
            time=vim.event.EventFilterSpec.ByTime(beginTime=sim.connect().CurrentTime()),
        )
        self._collector = content.eventManager.CreateCollectorForEvents(spec)
        self._events: list[Any] = []

    def read(self) -> list[tuple[str, str]]:
        """(event type, VM or host name) in the order the simulator posted them."""
        while True:
            page = self._collector.ReadNextEvents(maxCount=200)
            if not page:
                break
            self._events.extend(page)
        ordered = sorted(self._events, key=lambda e: e.key)
        return [(type(e).__name__.split(".")[-1], _subject(e)) for e in ordered]

    def names(self, event_type: str) -> list[str]:
        return [name for kind, name in self.read() if kind == event_type]


def _subject(event: Any) -> str:
    if getattr(event, "vm", None) is not None:
        return str(event.vm.name)
    if getattr(event, "host", None) is not None:
        return str(event.host.name)
    return ""


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def vcsim_tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("vcsim-tls"))


@pytest.fixture
def vcsim_factory(vcsim_tls: Tls) -> Iterator[Any]:
    """Start as many simulators as a test needs; all are stopped after it."""
    started: list[Vcsim] = []

    def start(*args: str, esx: bool = False) -> Vcsim:
        sim = start_vcsim(vcsim_tls, *args, esx=esx)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


#: The lab used by most tests: one cluster of three hosts, one vCLS VM, no stock VMs.
LAB_ARGS = ("-cluster", "1", "-host", "3", "-standalone-host", "0", "-vm", "0", "-vcls", "1")
LAB_VMS = (
    VmSpec("dc01", "DC0_C0_H0", folder="Infra", attributes={"tier": "infra"}),
    VmSpec("sql01", "DC0_C0_H1", folder="Prod/Db", attributes={"tier": "db"}),
    VmSpec("web-01", "DC0_C0_H0", folder="Prod/Web", attributes={"tier": "web"}),
    VmSpec("web-02", "DC0_C0_H1", folder="Prod/Web", attributes={"tier": "web"}),
    VmSpec("app-01", "DC0_C0_H2", folder="Prod/App", tools=False, attributes={"tier": "app"}),
    VmSpec("stray-01", "DC0_C0_H2"),
)


@pytest.fixture
def lab(vcsim_factory: Any) -> Vcsim:
    """A fresh simulator with the lab inventory above, per test, not per session.

    It costs about half a second (the simulator 0.2-0.4 s, the six VMs 0.2-0.7 s, and almost
    no CPU), which is what a reset through the API would cost too, and a reset could not undo
    everything a test leaves in the simulator: a guest shutdown still sleeping in one of its
    goroutines powers its VM off later (in the next test), a task may be under way, and
    custom fields, tags, folders, sessions and the event history all carry over. Tests that
    need other flags (``-method-delay``) start their own with ``vcsim_factory`` anyway."""
    sim: Vcsim = vcsim_factory(*LAB_ARGS)
    for spec in LAB_VMS:
        create_vm(sim, spec)
    return sim
