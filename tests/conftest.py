"""Shared fixtures and test settings. Real peers (NUT, snmpsim, vcsim, sshd, etcd)
live in tests/peers/, one module each.

Hypothesis profiles, chosen by ``scripts/test`` with ``--hypothesis-profile``:

* ``quick`` (``scripts/test --quick``): a few examples per property, so the day-to-day lane
  stays within a minute or two; it finds the gross mistakes, the full lane the subtle ones.
* ``dev`` (a bare ``pytest``, loaded here): Hypothesis's own default of 100 examples.
* ``full`` (``scripts/test``, what CI runs): more examples, and a failure prints the blob
  that replays it (``@reproduce_failure``), since a CI machine keeps no example database.

No profile has a deadline or the ``too_slow`` health check: the full lane runs tests side
by side on a shared machine, and how long an example takes is never what a test asserts.
A test that needs more or fewer examples than its profile says so with ``@settings``;
``slow`` tests (many examples, run by the full lane only) do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# The peers' helper modules import each other; rewritten asserts give their failures the
# values, as in the tests themselves (registered before pytest_plugins imports them).
pytest.register_assert_rewrite("tests.peers")

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
    "tests.peers.alerts",
    "tests.peers.etcd",
    "tests.peers.pair",
    "tests.peers.ceph",
    "tests.peers.pve",
]

settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", settings.get_profile("dev"), max_examples=10)
settings.register_profile("full", settings.get_profile("dev"), max_examples=200, print_blob=True)
settings.load_profile("dev")


@pytest.hookimpl(tryfirst=True)  # before xdist names each test by its group (loadgroup)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of the QEMU guest run one after the other on one xdist worker (``--dist
    loadgroup``): the guest is one per session, it takes a whole core to emulate, and two
    tests writing its scratch disks at once would see each other's caches.

    Tests of a controller pair (``pair_lab``: two services, three etcd members, upsd and
    vcsim, on a 2 s lease) run one after the other on one xdist worker as well: side by side
    they would starve each other's renewals and test the machine's load, not the pair.

    They come first, then the ``slow`` ones, then the rest in their usual order: xdist hands
    out tests in this order, and the longest chains started first end the run soonest. Tests
    never depend on their order."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if item.get_closest_marker("guest") or "guest_vm" in fixtures:
            item.add_marker(pytest.mark.xdist_group("guest"))
        elif "pair_lab" in fixtures:
            item.add_marker(pytest.mark.xdist_group("pair"))

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("xdist_group"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """Each test leaves the loggers as it found them. A test that runs the CLI in-process
    (``main([...])``) gets the logging the CLI sets for a whole process: ``doctor`` and
    ``drill`` raise the root logger to CRITICAL, ``configure`` adds a stderr handler. Left
    so, the next test on that worker captured no warning (``caplog.text`` empty: a full lane
    failed two vSphere tests that way after a doctor test ran before them)."""
    root = logging.getLogger()
    handlers, levels = list(root.handlers), _logger_levels()
    yield
    root.handlers[:] = handlers
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)
    for name in set(_logger_levels()) - set(levels):
        logging.getLogger(name).setLevel(logging.NOTSET)


def _logger_levels() -> dict[str, int]:
    """The level of the root logger ("") and of every logger created so far."""
    known = logging.Logger.manager.loggerDict.items()
    levels = {name: lg.level for name, lg in known if isinstance(lg, logging.Logger)}
    return {"": logging.getLogger().level, **levels}
