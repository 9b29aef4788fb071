"""The etcd store with etcd's authentication on: a wrong password is refused in one line
naming the user (never the password), a missing permission says which prefix to grant,
and a session token that expired is renewed by logging in again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers.etcd import EtcdCluster, start_cluster
from upsguard.config.ha import HaConfig
from upsguard.errors import AuthenticationError
from upsguard.plugins.coordination.base import Candidate, Term
from upsguard.plugins.coordination.etcd import EtcdStore

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]

PASSWORD = "etcd-Secret-7"
TOKEN_TTL_S = 1


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One member with auth on; user ``ups`` may read and write /upsguard/hq/ only."""
    cluster = start_cluster(
        tmp_path_factory.mktemp("etcd-auth"),
        members=1,
        flags=("--auth-token", "simple", "--auth-token-ttl", str(TOKEN_TTL_S)),
    )
    for args in (
        ["user", "add", "root:root-pw"],
        ["user", "add", f"ups:{PASSWORD}"],
        ["role", "add", "ups"],
        ["role", "grant-permission", "ups", "--prefix=true", "readwrite", "/upsguard/hq/"],
        ["user", "grant-role", "ups", "ups"],
        ["auth", "enable"],
    ):
        done = cluster.etcdctl(*args)
        out, _ = done.communicate(timeout=15)
        assert done.returncode == 0, out
    yield cluster
    cluster.close()


def store(cluster: EtcdCluster, tmp_path: Path, site: str, password: str) -> EtcdStore:
    secret = tmp_path / "etcd.pw"
    secret.write_text(password + "\n")
    settings = HaConfig.model_validate(
        {"name": "a", "endpoints": cluster.endpoints, "user": "ups", "password_file": secret}
    )
    return EtcdStore(site, settings)


def test_a_wrong_password_names_the_user_and_never_the_password(
    guarded: EtcdCluster, tmp_path: Path
) -> None:
    wrong = store(guarded, tmp_path, "hq", "not-" + PASSWORD)
    with pytest.raises(AuthenticationError) as refused:
        asyncio.run(wrong.leader())
    message = str(refused.value)
    assert "user 'ups' was refused" in message
    assert PASSWORD not in message and "\n" not in message


def test_a_missing_permission_says_which_prefix_to_grant(
    guarded: EtcdCluster, tmp_path: Path
) -> None:
    other = store(guarded, tmp_path, "elsewhere", PASSWORD)
    with pytest.raises(AuthenticationError) as refused:
        asyncio.run(other.leader())
    assert "grant it readwrite on the prefix /upsguard/elsewhere/" in str(refused.value)


def test_an_expired_session_is_renewed_by_logging_in_again(
    guarded: EtcdCluster, tmp_path: Path
) -> None:
    async def scenario() -> None:
        good = store(guarded, tmp_path, "hq", PASSWORD)
        try:
            term = await good.campaign(Candidate("a"), 30)
            assert isinstance(term, Term)
            await asyncio.sleep(TOKEN_TTL_S * 3)  # etcd drops the session token after its TTL
            assert await good.leader() == term.leader
            await good.resign(term)
        finally:
            await good.close()

    asyncio.run(scenario())
