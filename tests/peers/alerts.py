"""Where the alerts people read arrive, on loopback: a real SMTP server (aiosmtpd, plain SMTP
with AUTH LOGIN/PLAIN allowed without TLS, one user) and an ntfy-style HTTP endpoint
(aiohttp, keeping each JSON post), each in a thread of its own, one per session; a test
clears what they received.

Fixtures (registered in tests/conftest.py's ``pytest_plugins``):

* ``smtp_peer`` (session): an ``SmtpPeer``; ``port``, ``url(...)`` (an Apprise ``mailto://``
  URL that logs in as ``USER`` with ``PASSWORD``), ``received`` (parsed messages), ``logins``
  (whether each login was good). AUTH is offered, not required: aiosmtpd warns of a server
  that requires it without TLS, and the tests make warnings errors.
* ``ntfy_peer`` (session): an ``NtfyPeer``; ``url(topic)`` (an Apprise ``ntfy://`` URL with
  ``TOKEN``), ``received`` (the JSON posts), ``auth`` (their Authorization headers).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import pytest
from aiohttp import web
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.peers.ports import free_port

USER = "alerts"
PASSWORD = "Sm7-smtp-SECRET"
TOKEN = "tk_Nt4ntfySECRET"


@dataclass
class SmtpPeer:
    port: int = 0
    received: list[EmailMessage] = field(default_factory=list)
    logins: list[bool] = field(default_factory=list)

    def url(self, port: int | None = None) -> str:
        """Plain SMTP (``mailto://``: no TLS) on a custom port, with a login."""
        at = port if port is not None else self.port
        return (
            f"mailto://{USER}:{PASSWORD}@127.0.0.1:{at}"
            "?from=upsguard@example.org&to=ops@example.org"
        )

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.received.append(message)
        return "250 OK"

    @staticmethod
    def text(message: EmailMessage) -> str:
        """The plain-text part a person reads."""
        part = message.get_body(preferencelist=("plain",))
        assert part is not None
        return str(part.get_content())

    def login(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        good = isinstance(data, LoginPassword) and (data.login, data.password) == (
            USER.encode(),
            PASSWORD.encode(),
        )
        self.logins.append(good)
        return AuthResult(success=good)


@pytest.fixture(scope="session")
def smtp_peer() -> Iterator[SmtpPeer]:
    peer = SmtpPeer(port=free_port())
    controller = Controller(
        peer,
        hostname="127.0.0.1",
        port=peer.port,
        authenticator=peer.login,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield peer
    finally:
        controller.stop()


@dataclass
class NtfyPeer:
    port: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)

    def url(self, topic: str = "ups-alerts") -> str:
        return f"ntfy://127.0.0.1:{self.port}/{topic}?token={TOKEN}"

    async def post(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        self.received.append(await request.json())
        return web.json_response({"id": str(len(self.received)), "event": "message"})


@pytest.fixture(scope="session")
def ntfy_peer() -> Iterator[NtfyPeer]:
    peer = NtfyPeer()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runners: list[web.AppRunner] = []

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", peer.post)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        peer.port = runner.addresses[0][1]
        runners.append(runner)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    assert ready.wait(10), "the ntfy peer did not start"
    try:
        yield peer
    finally:
        asyncio.run_coroutine_threadsafe(runners[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
