"""The NUT test peer itself: a port another process took between its choice and upsd's bind.

Why: a CI run's test failed at setup with "UPS smart ready not reached within 20s". The
kernel hands a port that ``free_port`` released to the next process that asks, another
worker's server included; upsd could not bind it and exited ("no listening interface
available"), while the wait for a listener was answered by that other process.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers.nut import ON_LINE, start_nut
from tests.peers.ports import free_port

pytestmark = pytest.mark.nut


@pytest.fixture
def another_upsd() -> Iterator[int]:
    """A port held by a server that answers every line as an upsd without our UPS does."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            for _line in stream:
                stream.write(b"ERR UNKNOWN-UPS\n")
                stream.flush()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(5)
    listener.close()


def test_a_port_taken_before_upsd_binds_it_is_chosen_anew(
    tmp_path: Path, another_upsd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = iter([another_upsd])
    monkeypatch.setattr("tests.peers.nut.free_port", lambda: next(chosen, None) or free_port())

    server = start_nut(tmp_path / "nut", {"smart": ON_LINE}, ext="dev")
    try:
        assert server.port != another_upsd
        assert server.get("smart", "ups.status") == "OL"
    finally:
        server.stop()
