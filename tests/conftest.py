"""Shared fixtures. Real peers (NUT, snmpsim, vcsim, sshd, etcd): tests/peers/, one module each."""

from __future__ import annotations

pytest_plugins = [
    "tests.peers.vcsim",
    "tests.peers.ports",
    "tests.peers.nut",
    "tests.peers.snmpsim",
    "tests.peers.sshd",
    "tests.peers.bmc",
    "tests.peers.redfish",
    "tests.peers.wol",
    "tests.peers.libvirt",
    "tests.peers.guest",
    "tests.peers.browser",
    "tests.peers.cluster",
    "tests.peers.webhook",
    "tests.peers.etcd",
]
