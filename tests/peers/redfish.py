"""A Redfish BMC on loopback: sushy-tools' ``sushy-emulator`` with its fake driver, over TLS.

The emulator serves the real Redfish API (service root, Systems collection,
``ComputerSystem.Reset``) from Flask; its fake driver keeps each system's power
state and, like real hardware, applies a reset a few seconds later (1 to 11 s,
the driver's own choice). It runs with HTTP basic authentication (a bcrypt
``htpasswd`` file) and a throwaway certificate for 127.0.0.1 whose CA file the
tests pass as ``ca_file``, so TLS is verified as it is by default in production.

Fixtures (register ``tests.peers.redfish`` in tests/conftest.py's ``pytest_plugins``):

* ``redfish_bmc`` (session): a ``RedfishBmc`` with ``url``, ``user``, ``password_file``,
  ``ca_file``, ``systems`` (names of the fake systems, all off at start) and
  ``settings_dict(**extra)`` (the site file's ``platforms:`` entry).

If sushy-emulator is missing the fixture fails and says to run scripts/setup.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peers.ports import free_port
from tests.peers.process import spawn, wait_started
from tests.peers.tls import self_signed

USER = "redfish-admin"
PASSWORD = "redfish-s3cret"
SYSTEMS = ("srv-on", "srv-off", "srv-spare")


@dataclass
class RedfishBmc:
    url: str
    user: str
    password_file: Path
    ca_file: Path
    systems: tuple[str, ...]
    log: Path

    def settings_dict(self, **extra: object) -> dict[str, object]:
        return {
            "type": "redfish",
            "host": self.url,
            "user": self.user,
            "password_file": str(self.password_file),
            "ca_file": str(self.ca_file),
            **extra,
        }

    def power_state(self, system: str) -> str:
        """The system's PowerState as the emulator reports it (read with urllib, not sushy)."""
        import base64
        import json

        context = ssl.create_default_context(cafile=str(self.ca_file))
        token = base64.b64encode(f"{self.user}:{PASSWORD}".encode()).decode()
        request = urllib.request.Request(
            f"{self.url}/redfish/v1/Systems/{system}", headers={"Authorization": f"Basic {token}"}
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return str(json.load(response)["PowerState"])


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for the BMC and its key; the cert is its own CA."""
    return self_signed(directory, "bmc", "upsguard test BMC")


def _write_config(base: Path, port: int) -> Path:
    import bcrypt

    auth = base / "htpasswd"
    digest = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    auth.write_text(f"{USER}:{digest}\n")
    systems: list[dict[str, object]] = [
        {
            "uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "name": name,
            "power_state": "On" if name == "srv-on" else "Off",
            "external_notifier": False,
            "nics": [],
        }
        for name in SYSTEMS
    ]
    config = base / "emulator.conf"
    config.write_text(
        "\n".join(
            [
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
                f"SUSHY_EMULATOR_LISTEN_PORT = {port}",
                f"SUSHY_EMULATOR_AUTH_FILE = {str(auth)!r}",
                f"SUSHY_EMULATOR_STATE_DIR = {str(base / 'state')!r}",
                "SUSHY_EMULATOR_FAKE_DRIVER = True",
                f"SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}",
                "",
            ]
        )
    )
    return config


def _answers(url: str, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(f"{url}/redfish/v1/", context=context, timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redfish_bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishBmc]:
    emulator = shutil.which("sushy-emulator")
    if emulator is None:
        pytest.fail("sushy-emulator is missing: run scripts/setup (installs sushy-tools)")
    base = tmp_path_factory.mktemp("redfish")
    (base / "state").mkdir()
    port = free_port()
    cert, key = make_certificate(base)
    config = _write_config(base, port)
    password_file = base / "password"
    password_file.write_text(PASSWORD + "\n")
    log = base / "emulator.log"
    argv = [emulator, "--config", str(config), "--fake"]
    argv += ["--ssl-certificate", str(cert), "--ssl-key", str(key)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = spawn(argv, log, env=env)
    url = f"https://127.0.0.1:{port}"
    try:
        wait_started(
            proc, log, lambda: _answers(url, cert), f"sushy-emulator on {url}", 30, pause=0.1
        )
        yield RedfishBmc(url, USER, password_file, cert, SYSTEMS, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
