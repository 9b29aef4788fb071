"""The notify hook and the webhook, against a real hook script and real HTTP(S) servers on
loopback: what reaches them, and that no secret reaches anything else."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.peers.tls import self_signed
from upsguard.config.service import NotifySettings
from upsguard.controller.notify import Notifier
from upsguard.events import PhaseChanged
from upsguard.models import Phase

TOKEN = "Wb9-bearer-SECRET"
PATH_TOKEN = "Pt3-path-SECRET"
ENV_SECRET = "Ev5-env-SECRET"
EVENT = PhaseChanged(datetime(2026, 1, 1, tzinfo=UTC), Phase.NORMAL, Phase.ON_BATTERY, "mains")


@dataclass
class Hooked:
    """What one HTTP server received: (path, Authorization header, body) per request."""

    url: str
    got: list[tuple[str, str | None, bytes]] = field(default_factory=list)


def _handler(hooked: Hooked, answer: int, location: str | None) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            hooked.got.append((self.path, self.headers.get("Authorization"), body))
            self.send_response(answer)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _any

        def log_message(self, *args: Any) -> None: ...

    return Handler


def _serve(answer: int = 204, location: str | None = None, tls: Any = None) -> Iterator[Hooked]:
    hooked = Hooked("")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hooked, answer, location))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    hooked.url = f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hooked
    server.shutdown()
    server.server_close()


@pytest.fixture
def other_host() -> Iterator[Hooked]:
    """Another origin a redirect could point to."""
    yield from _serve()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "webhook.token"
    path.write_text(TOKEN + "\n")
    return path


def notify(settings: dict[str, Any]) -> Notifier:
    notifier = Notifier(NotifySettings.model_validate({"on": ["phase"], **settings}), "hq")

    async def send() -> None:
        notifier.observe(EVENT)
        await notifier.drain()

    asyncio.run(send())
    return notifier


def test_the_webhook_gets_the_event_with_its_bearer_token(token_file: Path) -> None:
    for hooked in _serve():
        url = f"{hooked.url}/services/T0/B0/{PATH_TOKEN}"
        notifier = notify({"webhook": {"url": url, "bearer_token_file": str(token_file)}})
        assert notifier.sent == 1 and notifier.failed == 0
        ((path, auth, body),) = hooked.got
        assert path.endswith(PATH_TOKEN) and auth == f"Bearer {TOKEN}"
        assert json.loads(body)["new"] == "on_battery"


def test_a_failed_send_logs_the_origin_alone(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for hooked in _serve(answer=500):
        url = f"{hooked.url}/services/T0/B0/{PATH_TOKEN}?key={PATH_TOKEN}"
        with caplog.at_level(logging.WARNING):
            notifier = notify({"webhook": {"url": url, "bearer_token_file": str(token_file)}})
        assert notifier.failed == 1
        assert f"webhook {hooked.url}: HTTP 500" in caplog.text
        assert PATH_TOKEN not in caplog.text and TOKEN not in caplog.text


def test_a_redirect_is_not_followed_with_the_token(
    token_file: Path, other_host: Hooked, caplog: pytest.LogCaptureFixture
) -> None:
    for hooked in _serve(answer=302, location=f"{other_host.url}/collect?t=1"):
        with caplog.at_level(logging.WARNING):
            notifier = notify(
                {"webhook": {"url": f"{hooked.url}/hook", "bearer_token_file": str(token_file)}}
            )
        assert notifier.failed == 1
        assert len(hooked.got) == 1 and other_host.got == []
        assert f"HTTP 302, redirected to {other_host.url} (not followed)" in caplog.text


def test_the_webhook_trusts_its_ca_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = self_signed(tmp_path / "tls", "hooks", "hooks")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    for hooked in _serve(tls=tls):
        notifier = notify({"webhook": {"url": f"{hooked.url}/h", "ca_file": str(cert)}})
        assert notifier.sent == 1 and len(hooked.got) == 1
        with caplog.at_level(logging.WARNING):
            notifier = notify({"webhook": {"url": f"{hooked.url}/h"}})
        assert notifier.failed == 1 and len(hooked.got) == 1
        assert "TLS certificate not trusted" in caplog.text and "set ca_file" in caplog.text


def test_the_hook_gets_the_event_and_no_secret_of_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump, stdin = tmp_path / "env", tmp_path / "stdin"
    hook = tmp_path / "hook"
    hook.write_text(f"#!/bin/sh\nenv > {dump}\ncat > {stdin}\n")
    hook.chmod(0o755)
    monkeypatch.setenv("NUT_PASSWORD", ENV_SECRET)
    monkeypatch.setenv("HOOK_CHANNEL", "#ops")
    notifier = notify({"command": [str(hook)], "pass_env": ["HOOK_CHANNEL"]})
    assert notifier.sent == 1
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert env["UPSGUARD_EVENT"] == "PhaseChanged" and env["UPSGUARD_PHASE"] == "on_battery"
    assert env["HOOK_CHANNEL"] == "#ops" and env["PATH"] == os.environ["PATH"]
    assert "NUT_PASSWORD" not in env and ENV_SECRET not in dump.read_text()
    assert json.loads(stdin.read_text())["site"] == "hq"
