"""The tests' free ports: no two xdist workers are handed the same port, and none is one the
kernel may hand out meanwhile (tests/peers/ports.py says why: a CI run lost a test that way)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.peers.ports import free_port


def test_two_workers_never_share_a_port_and_none_is_the_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: dict[str, set[int]] = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        handed[worker] = {free_port() for _ in range(300)}

    assert len(handed["gw0"]) == len(handed["gw1"]) == 300
    assert not handed["gw0"] & handed["gw1"]
    kernels = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    assert max(handed["gw0"] | handed["gw1"]) < int(kernels[0])
