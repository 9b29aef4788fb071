"""Secrets stay where the site file put them: URLs are shown without them, children start
without the service's environment, and the site file refuses them written inline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from upsguard.secrecy import child_env, program_name, redact_url

SECRET = "Zq7-SECRET-41"
CLI = [sys.executable, "-m", "upsguard"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"http://admin:{SECRET}@nas01:8080/api/health?token={SECRET}&v=2",
            "http://***@nas01:8080/api/health?token=***&v=***",
        ),
        (f"https://{SECRET}@hooks.lab/x", "https://***@hooks.lab/x"),
        (f"https://nas01/ready?{SECRET}", "https://nas01/ready?***"),
        (f"https://nas01/ready#{SECRET}", "https://nas01/ready#***"),
        ("https://[::1]:8443/ok", "https://[::1]:8443/ok"),
        (f"nas01:{SECRET}@host?x={SECRET}", "***"),
        (f"http://u:{SECRET}@nas01:notaport/", "http://***"),
    ],
)
def test_a_url_is_shown_without_credentials_or_query_values(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert SECRET not in redact_url(url)


def test_a_webhook_url_whose_path_is_the_secret_shows_its_origin_alone() -> None:
    url = f"https://hooks.chat.example:8443/services/T000/B000/{SECRET}?x=1"
    assert redact_url(url, origin_only=True) == "https://hooks.chat.example:8443"


def test_a_child_gets_the_basics_and_what_its_settings_name_nothing_else() -> None:
    service_env = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "NUT_PASSWORD": SECRET,
        "ASKED_FOR": "yes",
    }
    env = child_env(["ASKED_FOR", "NOT_SET"], {"UPSGUARD_EVENT": "x"}, environ=service_env)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "ASKED_FOR": "yes",
        "UPSGUARD_EVENT": "x",
    }


def _validate(tmp_path: Path, site: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return subprocess.run(
        [*CLI, "validate", "-c", str(path)], capture_output=True, text=True, timeout=60
    )


def _site(**sections: Any) -> dict[str, Any]:
    site: dict[str, Any] = {
        "site": "s",
        "ups": [{"name": "u1", "nut": {"host": "127.0.0.1", "ups": "x"}}],
        "resources": [{"id": "a", "kind": "command", "platform": "command", "shutdown": "true"}],
    }
    site.update(sections)
    return site


@pytest.mark.parametrize(
    "health",
    [
        {"http": f"http://admin:{SECRET}@nas01/api"},
        {"http": {"url": f"https://admin:{SECRET}@nas01/api"}},
    ],
)
def test_credentials_in_a_health_url_are_refused_without_echoing_them(
    tmp_path: Path, health: dict[str, Any]
) -> None:
    res = {"id": "a", "kind": "command", "platform": "command", "shutdown": "true"}
    result = _validate(tmp_path, _site(resources=[{**res, "health": health}]))
    assert result.returncode == 2
    assert "credentials in the URL are not accepted" in result.stderr
    assert "password_file" in result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_credentials_in_the_webhook_url_are_refused(tmp_path: Path) -> None:
    notify = {"webhook": {"url": f"https://bot:{SECRET}@hooks.lab/x"}}
    result = _validate(tmp_path, _site(service={"notify": notify}))
    assert result.returncode == 2
    assert "service.notify.webhook.url" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_credentials_in_a_bmc_address_are_refused(tmp_path: Path) -> None:
    rf = {"type": "redfish", "host": f"https://admin:{SECRET}@bmc1", "user": "admin"}
    result = _validate(tmp_path, _site(platforms={"rf": rf}))
    assert result.returncode == 2
    assert "platforms.rf.host: credentials in the address are not accepted" in result.stderr
    assert SECRET not in result.stderr + result.stdout


@pytest.mark.parametrize("key", ["password", "api_token", "secret", "community", "priv_key"])
def test_an_inline_secret_for_a_third_party_platform_is_refused(tmp_path: Path, key: str) -> None:
    site = _site(platforms={"ext": {"type": "acme-pdu", "host": "pdu1", key: SECRET}})
    result = _validate(tmp_path, site)
    assert result.returncode == 2
    assert f"platforms.ext: inline '{key}' is not accepted" in result.stderr
    assert f"{key}_file" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_an_inline_secret_for_a_third_party_cache_is_refused(tmp_path: Path) -> None:
    cache = {"name": "c1", "provider": "acme-cache", "carries": ["a"], "password": SECRET}
    result = _validate(tmp_path, _site(caches=[cache]))
    assert result.returncode == 2
    assert "caches[0]: inline 'password' is not accepted" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_a_remote_upsd_in_clear_is_a_warning_unless_accepted(tmp_path: Path) -> None:
    nut = {"host": "10.0.0.5", "ups": "x", "user": "mon", "password_env": "NUT_PW"}
    result = _validate(tmp_path, _site(ups=[{"name": "u1", "nut": nut}]))
    assert result.returncode == 0, result.stderr
    assert "warning: ups[0].nut: UPS u1: upsd at 10.0.0.5 is not on this machine" in result.stderr
    assert "starttls: true" in result.stderr and "allow_plaintext: true" in result.stderr
    for quiet in ({"starttls": True}, {"allow_plaintext": True}, {"host": "localhost"}):
        entry = {"name": "u1", "nut": {**nut, **quiet}}
        result = _validate(tmp_path, _site(ups=[entry]))
        assert result.returncode == 0, result.stderr
        assert "warning" not in result.stderr, quiet


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("true --user admin --password hunter2", "true"),
        ("PDU_TOKEN=s3cret A=b /opt/pdu/bin/pductl --password x", "pductl"),
        ("'/opt/my tools/stop' 'unbalanced", "my"),  # not shell words: the first word's name
        ("/sbin/shutdown -h now", "shutdown"),
        ("   ", "?"),
    ],
)
def test_a_command_line_is_shown_as_its_programs_name(command: str, shown: str) -> None:
    assert program_name(command) == shown
