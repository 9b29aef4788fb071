"""The etcd store with etcd's authentication on: a wrong password is refused in one line
naming the user (never the password), a missing permission says which prefix to grant,
and a session token that expired is renewed by logging in again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.peers.etcd import EtcdCluster, as_root, jwt_token, start_guarded
from upsguard.config.ha import HaConfig
from upsguard.errors import AuthenticationError
from upsguard.models import RunId, StepId, StepState
from upsguard.plugins.coordination.base import Candidate, StepMark, Term
from upsguard.plugins.coordination.etcd import EtcdStore

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]

PASSWORD = "etcd-Secret-7"
TOKEN_TTL_S = 1


def guard(directory: Path, token: str) -> Iterator[EtcdCluster]:
    """User ``ups`` may read and write /upsguard/hq/ only; a session ends after
    ``TOKEN_TTL_S`` (simple tokens)."""
    token_ttl = ("--auth-token-ttl", str(TOKEN_TTL_S))
    cluster = start_guarded(directory, token, "ups", PASSWORD, "/upsguard/hq/", token_ttl)
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Simple tokens: a session that ends after ``TOKEN_TTL_S``."""
    yield from guard(tmp_path_factory.mktemp("etcd-auth"), "simple")


@pytest.fixture(scope="module")
def guarded_jwt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """JWT tokens (``jwt_token``), refused once users or roles change."""
    directory = tmp_path_factory.mktemp("etcd-jwt")
    yield from guard(directory, jwt_token(directory))


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


def test_a_role_added_while_leading_does_not_refuse_the_next_renewal(
    guarded_jwt: EtcdCluster, tmp_path: Path
) -> None:
    """docs/ha.md says to add a second site's role to the same etcd: any change of users or
    roles makes etcd refuse every token issued before it ("revision of auth store is old").
    The client logs in again, as etcd's own client does, and the leader renews its term."""

    async def scenario() -> None:
        good = store(guarded_jwt, tmp_path, "hq", PASSWORD)
        try:
            term = await good.campaign(Candidate("a"), 30)
            assert isinstance(term, Term)
            as_root(guarded_jwt, "role", "add", "second-site")
            await good.renew(term)
            mark = StepMark(StepId("stop:vm1"), StepState.DONE, "a", datetime.now(UTC))
            await good.record_step(term, RunId("shutdown-1"), mark)  # a fenced write
            assert (await good.snapshot()).steps_of(RunId("shutdown-1")) == {mark.step: mark}
            await good.resign(term)
        finally:
            await good.close()
            as_root(guarded_jwt, "role", "delete", "second-site")

    asyncio.run(scenario())


def test_a_password_rotated_in_etcd_and_its_file_is_read_at_the_next_login(
    guarded: EtcdCluster, tmp_path: Path
) -> None:
    """The password is changed in etcd and in the controller's password file, the service
    left running: the next login (the old session's end) reads the file again and the
    leader renews its term; the new password is never said."""

    async def scenario() -> None:
        good = store(guarded, tmp_path, "hq", PASSWORD)
        rotated = "rotated-" + PASSWORD
        try:
            term = await good.campaign(Candidate("a"), 30)
            assert isinstance(term, Term)
            as_root(guarded, "user", "passwd", "ups", "--interactive=false", typed=rotated)
            (tmp_path / "etcd.pw").write_text(rotated + "\n")
            await asyncio.sleep(TOKEN_TTL_S * 3)  # the old session's token expires
            await good.renew(term)
            assert await good.leader() == term.leader
            await good.resign(term)
        finally:
            await good.close()
            as_root(guarded, "user", "passwd", "ups", "--interactive=false", typed=PASSWORD)

    asyncio.run(scenario())
