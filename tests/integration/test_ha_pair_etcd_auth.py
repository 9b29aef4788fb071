"""The pair on an etcd with its authentication on, as etcd recommends for production (JWT
tokens), and what a sysadmin does to it while both services run: rotate the password (in
etcd, then in the file both controllers read) and add a second site's role (docs/ha.md).
Each makes etcd refuse the tokens issued before it. Before the store's refusals had a
meaning, either one killed the leadership loop: the roles froze, and at the next outage
the leader's first claim raised and the run failed. Counted at vcsim and at the UPS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers.etcd import EtcdSite, as_root, jwt_token, start_guarded
from tests.peers.nut import NutServer
from tests.peers.pair import MACHINES, NAMES, PairLab, start_lab, start_nut
from tests.peers.vcsim import Vcsim
from tests.peers.webhook import WebhookServer

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.nut,
    pytest.mark.vcsim,
    pytest.mark.timeout(240),
    pytest.mark.xdist_group("pair"),  # as pair_lab's tests: one after the other
]

SITE = "hq"
PASSWORD = "etcd-Secret-7"


@pytest.fixture
def guarded_lab(
    tmp_path: Path,
    nut_factory: Callable[..., NutServer],
    vcsim_factory: Callable[..., Vcsim],
    webhook_server: WebhookServer,
) -> Iterator[PairLab]:
    """The pair lab on one etcd member with JWT authentication: user ``ups`` may read and
    write the site's keys only, its password in one file both controllers read."""
    directory = tmp_path / "etcd"
    directory.mkdir()
    etcd = EtcdSite(
        start_guarded(directory, jwt_token(directory), "ups", PASSWORD, f"/upsguard/{SITE}/"),
        SITE,
    )
    secret = tmp_path / "etcd.pw"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    lab = PairLab(etcd, start_nut(nut_factory), start_lab(vcsim_factory), webhook_server, tmp_path)
    lab.configure(user="ups", password_file=str(secret))
    try:
        yield lab
    finally:
        lab.stop()
        etcd.cluster.close()


def one_leader_each_answered(lab: PairLab) -> str | None:
    """The leader, once one leads and the other stands by, each with the store answering."""
    states: dict[str, Any] = {name: lab.status(name)["ha"] for name in NAMES}
    if any(s["store_silent_s"] is not None for s in states.values()):
        return None
    roles = sorted(s["role"] for s in states.values())
    if roles != ["leader", "standby"]:
        return None
    return next(name for name, s in states.items() if s["role"] == "leader")


def test_a_password_rotated_and_a_role_added_leave_the_pair_leading_and_the_shutdown_whole(
    guarded_lab: PairLab, tmp_path: Path
) -> None:
    lab = guarded_lab
    cluster = lab.etcd.cluster
    lab.start()
    lab.wait(lambda: one_leader_each_answered(lab), "one leader and one standby")
    rotated = "rotated-" + PASSWORD
    as_root(cluster, "user", "passwd", "ups", "--interactive=false", typed=rotated)
    (tmp_path / "etcd.pw").write_text(rotated + "\n")
    as_root(cluster, "role", "add", "second-site")  # docs/ha.md: a second site, one etcd
    lab.wait(lambda: one_leader_each_answered(lab), "the pair to answer again", 60)
    for name in NAMES:  # neither service stopped, nor ever will have
        proc = lab.controllers[name].proc
        assert proc is not None and proc.poll() is None, lab.controllers[name].log.read_text()
    lab.outage()
    last = lab.wait(lab.finisher, "the shutdown to be finished", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[last])
    assert lab.ups_commands() == ["shutdown.return"]
    for name in NAMES:
        log = lab.controllers[name].log.read_text()
        assert rotated not in log and PASSWORD not in log
