"""A webhook on loopback: aiohttp's server in a thread of its own, answering every POST
with ``status`` (204, or 500 for a webhook that fails) and keeping each JSON body.

Fixture (register ``tests.peers.webhook`` in tests/conftest.py's ``pytest_plugins``):

* ``aiohttp_webhook`` (function): a ``WebhookServer``; ``url``, ``status`` (settable),
  ``received`` (the bodies, in order).

``serve_webhook()`` is the same server as a context manager, for code outside pytest
(bench/ha.py's pair lab).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web


@dataclass
class WebhookServer:
    status: int = 204
    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)

    async def hook(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        return web.Response(status=self.status)


@contextlib.contextmanager
def serve_webhook() -> Iterator[WebhookServer]:
    """A webhook on a free loopback port, in a thread of its own; stopped on leaving."""
    server = WebhookServer()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner: list[web.AppRunner] = []

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/hooks/ups", server.hook)
        app_runner = web.AppRunner(app, access_log=None)
        await app_runner.setup()
        site = web.TCPSite(app_runner, "127.0.0.1", 0)
        await site.start()
        port = app_runner.addresses[0][1]
        server.url = f"http://127.0.0.1:{port}/hooks/ups"
        runner.append(app_runner)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    assert ready.wait(10), "the aiohttp webhook did not start"
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def aiohttp_webhook() -> Iterator[WebhookServer]:
    with serve_webhook() as server:
        yield server
