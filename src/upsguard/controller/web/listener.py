"""The page's TCP listener, bounded: whatever its clients do, the power watch, the runbook's
steps and the local API keep the descriptors they need.

aiohttp's own site (``web.TCPSite``) accepts every connection and keeps an idle one for an
hour. Here the listening socket is the event loop's, made with a protocol factory of our
own (``Door``) in front of the application's server (``web.AppRunner.server``):

- at most ``max_connections`` connections at a time, the live streams among them; past it,
  a new connection is closed at once, before a byte is read;
- none while the process is short of descriptors: the page leaves the runbook's reserve and
  room for all of the API's connections (``controller.descriptors``);
- a connection must send its request's head within ``HEAD_TIMEOUT_S``, and an idle one is
  closed after as long (aiohttp's keep-alive timer runs from the moment it is accepted and
  is not reset by bytes that make no request); a TLS handshake has as long.

The ceiling counts a connection from its accept until it is closed; one whose TLS handshake
never completes (the application never hears of it) is let go at the handshake's deadline.
HTTP that cannot be parsed gets its 400 and one quiet line at debug level, not a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web

from upsguard.controller.api import MAX_CONNECTIONS as API_CONNECTIONS
from upsguard.controller.descriptors import API_RESERVE, Refused, to_spare

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
"""Every connection to the page at a time, live streams among them."""
HEAD_TIMEOUT_S = 10.0
"""For a request's head to arrive (and a TLS handshake before it), and for an idle
connection between two requests."""
BACKLOG = 32
"""Connections the kernel queues for the page; the event loop accepts them all at once, before
the door sees any, so they count in the reserve below."""
RESERVE = API_RESERVE + API_CONNECTIONS + BACKLOG
"""Descriptors the page never takes: the runbook's reserve, every connection of the API, and
one accept burst."""
WARN_EVERY_S = 60.0


class Door:
    """The protocol factory of the page's listening socket: a connection of the application's
    server, or one closed at once when the page cannot afford it."""

    def __init__(self, server: web.Server, max_connections: int = MAX_CONNECTIONS,
                 **connection_args: Any) -> None:  # fmt: skip
        """``connection_args``: those aiohttp's runner was given for its connections."""
        self._server = server
        self._args = connection_args
        self.max_connections = max_connections
        self.open = 0
        self.refused = 0
        self._warned_at = -math.inf

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.max_connections or not to_spare(RESERVE, 1 / 2):
            self._refusing()
            return Refused()
        return _Connection(self, self._server, loop=asyncio.get_running_loop(), **self._args)

    async def listen(self, host: str, port: int, tls: ssl.SSLContext | None) -> asyncio.Server:
        """The listening socket, open; ``OSError`` when the address cannot be had."""
        loop = asyncio.get_running_loop()
        return await loop.create_server(
            self,
            host,
            port,
            ssl=tls,
            backlog=BACKLOG,
            ssl_handshake_timeout=HEAD_TIMEOUT_S if tls is not None else None,
        )

    def _refusing(self) -> None:
        """Say so in the log, once a minute at most: a flood must not flood the log too."""
        self.refused += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "web page: turning connections away (%d open, at most %d; descriptors to "
                "spare: %s)",
                self.open,
                self.max_connections,
                "yes" if to_spare(RESERVE, 1 / 2) else "no",
            )


class _Connection(web.RequestHandler):
    """aiohttp's handler of one connection, counted by its door from its accept to its close."""

    def __init__(self, door: Door, server: web.Server, **args: Any) -> None:
        super().__init__(server, **args)
        self._door = door
        self._counted = True
        self._made = False
        door.open += 1
        # a TLS handshake that fails never reaches connection_made nor connection_lost
        args["loop"].call_later(HEAD_TIMEOUT_S + 1.0, self._unless_made)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._made = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._let_go()
        super().connection_lost(exc)

    def _unless_made(self) -> None:
        if not self._made:
            self._let_go()

    def _let_go(self) -> None:
        if self._counted:
            self._counted = False
            self._door.open -= 1

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """HTTP a client got wrong is its 4xx and one quiet line; a bug stays an error."""
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was being sent already")
        lines = (message or "").strip().splitlines()
        reason = lines[0].rstrip(":")[:200] if lines else HTTPStatus(status).phrase
        log.debug("web page: bad HTTP from a client: %s", reason)
        response = web.Response(status=status, text=f"bad HTTP request: {reason}")
        response.force_close()
        return response
