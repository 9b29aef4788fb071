"""The etcd store over TLS with client certificates (etcd's ``--client-cert-auth``): a pair
campaigns, writes fenced and follows over ``https://`` endpoints, named by address or by
host name, each member's certificate verified; a controller that shows no certificate, or
trusts another CA, is refused in one line that says which part of ``ha.tls`` to look at;
``doctor`` asks each member over TLS as the pair does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.peers.etcd import EtcdCluster, start_cluster
from tests.peers.tls import MutualTls, mutual_tls
from tests.sites import simple_site, site_from
from upsguard.clock import SystemClock
from upsguard.config.ha import HaConfig
from upsguard.doctor.checkup import Selection, run_checkup
from upsguard.errors import LeadershipLost, StoreUnavailable
from upsguard.findings import Area, Verdict
from upsguard.models import ResourceId, RunId
from upsguard.plugins.coordination.base import Candidate, Leader, Term
from upsguard.plugins.coordination.etcd import EtcdStore
from upsguard.runs import RunKind, RunOrigin, RunRecord, RunSpec

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]

A, B = Candidate("ctl-a", ResourceId("mgmt-a")), Candidate("ctl-b", ResourceId("mgmt-b"))
AT = datetime(2026, 11, 25, 3, 0, tzinfo=UTC)
LONG = 30.0


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> MutualTls:
    return mutual_tls(tmp_path_factory.mktemp("etcd-certs"))


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, certificates: MutualTls
) -> Iterator[EtcdCluster]:
    """Three members whose client ports speak TLS only and want a client certificate."""
    cluster = start_cluster(tmp_path_factory.mktemp("etcd-tls"), tls=certificates)
    yield cluster
    cluster.close()


def endpoints(cluster: EtcdCluster) -> list[str]:
    """The members' https:// URLs, the second by host name (its certificate says
    ``localhost`` as well as ``127.0.0.1``)."""
    urls = list(cluster.endpoints)
    urls[1] = urls[1].replace("127.0.0.1", "localhost")
    return urls


def store(cluster: EtcdCluster, site: str, name: str, tls: dict[str, Any]) -> EtcdStore:
    settings = HaConfig.model_validate(
        {"name": name, "endpoints": endpoints(cluster), "request_timeout": "1s", "tls": tls}
    )
    return EtcdStore(site, settings)


def full(certificates: MutualTls) -> dict[str, Any]:
    return {
        "ca_file": certificates.ca,
        "cert_file": certificates.client_cert,
        "key_file": certificates.client_key,
    }


def record(run_id: str) -> RunRecord:
    spec = RunSpec(RunId(run_id), RunKind.SHUTDOWN, RunOrigin.POLICY, "runtime < plan + 5m", AT)
    return RunRecord(spec)


def test_a_pair_leads_writes_and_follows_over_tls_with_client_certificates(
    secured: EtcdCluster, certificates: MutualTls
) -> None:
    async def scenario() -> None:
        first = store(secured, "tls-pair", "ctl-a", full(certificates))
        second = store(secured, "tls-pair", "ctl-b", full(certificates))
        try:
            term = await first.campaign(A, LONG)
            assert isinstance(term, Term)
            assert await second.campaign(B, LONG) == term.leader
            seen = await second.snapshot()
            await first.record_run(term, record("r1"))
            assert await second.wait_for_change(seen.revision, 10) is True
            assert (await second.snapshot()).runs == (record("r1"),)
            assert await first.renew(term) > 0
            health = await second.probe()
            assert [h.answered for h in health] == [True, True, True], health
            assert [h.endpoint for h in health] == endpoints(secured)
            assert all(h.version == "3.4.23" for h in health)
            assert sum(h.is_leader for h in health) == 1
            await first.resign(term)
            new = await second.campaign(B, LONG)
            assert isinstance(new, Term) and new.token > term.token
            with pytest.raises(LeadershipLost):
                await first.record_run(term, record("r2"))
            await second.resign(new)
        finally:
            await first.close()
            await second.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("tls", "says"),
    [
        pytest.param(
            lambda c: {"ca_file": c.ca},
            "if the members are up: this controller shows no client certificate (ha.tls "
            "cert_file and key_file), which a member started with --client-cert-auth refuses",
            id="no-client-certificate",
        ),
        pytest.param(
            lambda c: {**full(c), "cert_file": c.stranger_cert, "key_file": c.stranger_key},
            "and that the CA of the members' --trusted-ca-file signed cert_file",
            id="certificate-of-another-ca",
        ),
        pytest.param(
            lambda c: {**full(c), "ca_file": c.stranger_ca},
            "if the members are up: check that ha.tls ca_file is the CA that signed the "
            "members' certificates, for the name in each endpoint,",
            id="members-signed-by-another-ca",
        ),
    ],
)
def test_a_controller_the_members_cannot_trust_is_refused_in_one_line(
    secured: EtcdCluster, certificates: MutualTls, tls: Any, says: str
) -> None:
    async def scenario() -> Leader | Term:
        stranger = store(secured, "tls-refused", "ctl-x", tls(certificates))
        try:
            async with asyncio.timeout(30):
                return await stranger.campaign(A, LONG)
        finally:
            await stranger.close()

    with pytest.raises(StoreUnavailable) as refused:
        asyncio.run(scenario())
    message = str(refused.value)
    assert message.startswith("etcd: grant a lease: no endpoint answered (https://"), message
    assert says in message
    assert "\n" not in message and "Traceback" not in message


def test_tls_files_that_cannot_be_read_are_named_when_the_store_is_built(
    secured: EtcdCluster, certificates: MutualTls, tmp_path: Path
) -> None:
    from upsguard.errors import ConfigError

    missing = tmp_path / "nope.crt"
    with pytest.raises(ConfigError) as refused:
        store(secured, "tls-files", "ctl-a", {**full(certificates), "cert_file": missing})
    assert str(refused.value) == f"ha.tls.cert_file: {missing}: cannot read the file: " + (
        "No such file or directory"
    )


def test_doctor_reaches_each_tls_endpoint_and_reads_the_pairs_keys(
    secured: EtcdCluster, certificates: MutualTls, tmp_path: Path
) -> None:
    """``doctor --only store``: each member asked on its own over TLS, with the client
    certificate, then this controller's keys read; nothing written."""
    ha = {"name": "ctl-a", "endpoints": endpoints(secured), "tls": full(certificates)}
    site = site_from(tmp_path, {**simple_site(), "ha": json_paths(ha)})
    checkup = asyncio.run(run_checkup(site, SystemClock(), only=Selection(frozenset({"store"}))))
    said = [(f.area, f.subject, f.check, f.verdict) for f in checkup.findings]
    urls = endpoints(secured)
    assert said == [
        *[(Area.STORE, url, "answer", Verdict.OK) for url in urls],
        (Area.STORE, "etcd", "access", Verdict.OK),
    ], checkup.findings
    answers, access = checkup.findings[:-1], checkup.findings[-1]
    assert all(f.detail.startswith("answered: etcd 3.4.23") for f in answers), answers
    assert sum(f.detail.endswith("(leads etcd's own raft)") for f in answers) == 1
    assert access.detail == "reads /upsguard/test/: nobody leads"


def test_doctor_says_why_a_controller_without_a_certificate_is_refused(
    secured: EtcdCluster, certificates: MutualTls, tmp_path: Path
) -> None:
    ha = {"name": "ctl-a", "endpoints": endpoints(secured), "tls": {"ca_file": certificates.ca}}
    site = site_from(tmp_path, {**simple_site(), "ha": json_paths(ha)})
    checkup = asyncio.run(run_checkup(site, SystemClock(), only=Selection(frozenset({"store"}))))
    verdicts = {(f.subject, f.check): f for f in checkup.findings}
    assert all(verdicts[(url, "answer")].verdict is Verdict.FAIL for url in endpoints(secured))
    access = verdicts[("etcd", "access")]
    assert access.verdict is Verdict.FAIL
    assert "shows no client certificate (ha.tls cert_file and key_file)" in access.detail
    assert checkup.exit_code == 1


def json_paths(value: Any) -> Any:
    """``value`` with its paths as text, as a site file writes them."""
    if isinstance(value, dict):
        return {key: json_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_paths(item) for item in value]
    return str(value) if isinstance(value, Path) else value
