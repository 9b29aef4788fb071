"""Free loopback ports, chosen at run time so that tests never collide.

Why not the kernel's choice (a bind to port 0): the kernel hands that port out again as soon
as the socket that asked closes, to the next process that asks, another xdist worker's peer
included, before the peer it was chosen for has bound it. A CI run lost a test that way: its
upsd could not bind, and the wait for upsd was answered by another worker's server. So each
worker takes its ports from a slice of its own below the kernel's ephemeral range (which the
kernel never hands out, neither for port 0 nor for an outgoing connection), one after the
other, each checked free by binding it.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest

LOWEST = 10_000
SLICES = 16
"""Slices of the ports below the ephemeral range: one per xdist worker (``gw0`` to ``gw14``),
the last for a run without workers."""


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def worker_slice() -> range:
    """This process's ports: its xdist worker's slice, or the last slice without workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % (SLICES - 1) if worker.startswith("gw") else SLICES - 1
    size = (ephemeral_start() - LOWEST) // SLICES
    return range(LOWEST + index * size, LOWEST + (index + 1) * size)


_next_in: dict[range, int] = {}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """The next port of this worker's slice that is free now (a random start per process,
    so that a worker started again does not begin where its predecessor's peers may still be
    in TIME_WAIT)."""
    ports = worker_slice()
    start = _next_in.get(ports, random.randrange(len(ports)))
    for step in range(len(ports)):
        port = ports[(start + step) % len(ports)]
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next_in[ports] = (start + step + 1) % len(ports)
        return port
    raise AssertionError(f"no free port in {ports.start}-{ports.stop - 1} on 127.0.0.1")


@pytest.fixture
def tcp_port() -> int:
    return free_port()


@pytest.fixture
def udp_port() -> int:
    return free_port(socket.SOCK_DGRAM)
