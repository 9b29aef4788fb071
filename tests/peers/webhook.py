"""A webhook on loopback: the standard library's threaded HTTP server, answering every POST
with ``status`` (204, or 500 for a webhook that fails) and keeping each JSON body.

Fixture (register ``tests.peers.webhook`` in tests/conftest.py's ``pytest_plugins``):

* ``webhook_server`` (function): a ``WebhookServer``; ``url``, ``status`` (settable),
  ``received`` (the bodies, in order).

``serve_webhook()`` is the same server as a context manager, for code outside pytest
(bench/ha.py's pair lab).

Threads and plain sockets, one request a connection (HTTP/1.0), all closed when it stops: an
aiohttp server in a loop of its own left a connection of a controller killed or paused
mid-request open past its cleanup, and its transport, found by the garbage collector during a
later test, failed that test's setup ('unclosed transport').
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class WebhookServer:
    status: int = 204
    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def serve_webhook() -> Iterator[WebhookServer]:
    """A webhook on a free loopback port, in a thread of its own; stopped on leaving."""
    server = WebhookServer()

    class Hook(BaseHTTPRequestHandler):
        timeout = 10  # a client that stops mid-request (paused, killed) frees its thread

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path == "/hooks/ups":
                server.received.append(json.loads(self.rfile.read(length)))
                self.send_response(server.status)
            else:
                self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the tests read ``received``

    http = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    http.daemon_threads = True
    server.url = f"http://127.0.0.1:{http.server_address[1]}/hooks/ups"
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        http.shutdown()
        http.server_close()
        thread.join(10)


@pytest.fixture
def webhook_server() -> Iterator[WebhookServer]:
    with serve_webhook() as server:
        yield server
