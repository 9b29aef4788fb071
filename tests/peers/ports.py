"""Free loopback ports, chosen at run time so that tests never collide."""

from __future__ import annotations

import socket

import pytest


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def tcp_port() -> int:
    return free_port()


@pytest.fixture
def udp_port() -> int:
    return free_port(socket.SOCK_DGRAM)
