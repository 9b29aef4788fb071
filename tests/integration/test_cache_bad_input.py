"""A cache whose SSH key is malformed: one clear line, never a traceback, in the CLI and in
the service (where it is that cache's failure, logged as a warning and notified)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.peers.ports import free_port
from tests.peers.service import CLI, write_site

MALFORMED = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n"


def bad_key_cache(tmp_path: Path) -> dict[str, object]:
    key = tmp_path / "id_broken"
    key.write_text(MALFORMED)
    return {
        "name": "flash",
        "provider": "bcache",
        "ssh": {"host": "127.0.0.1", "port": free_port(), "key_file": str(key)},
    }


def test_cache_status_with_a_malformed_key_names_the_key(tmp_path: Path) -> None:
    svc = write_site(
        tmp_path,
        {"site": "t", "ups": [{"name": "u", "simulated": {}}], "caches": [bad_key_cache(tmp_path)]},
    )
    done = subprocess.run(
        [*CLI, "cache", "status", "-c", str(svc.site)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert "cannot read the private key" in done.stdout and "ssh.key_file" in done.stdout


def test_a_failed_write_through_is_a_warning_and_notified(tmp_path: Path) -> None:
    hook_out = tmp_path / "hook.out"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ncat >> {hook_out}; echo >> {hook_out}\n")
    hook.chmod(0o755)
    svc = write_site(
        tmp_path,
        {
            "site": "t",
            "ups": [{"name": "u", "simulated": {}}],
            "caches": [bad_key_cache(tmp_path)],
            "service": {"notify": {"command": [str(hook)]}},
        },
    )
    try:
        svc.start()
        svc.cli("trigger", "shutdown", "--yes", "--reason", "drill")  # flips the caches first
        svc.wait(lambda: hook_out.exists() and "FAILED" in hook_out.read_text(), "the notice")
    finally:
        svc.stop()
    log = svc.log.read_text()
    line = next(x for x in log.splitlines() if "flash" in x and "FAILED" in x)
    assert " WARNING " in line and "Traceback" not in log
