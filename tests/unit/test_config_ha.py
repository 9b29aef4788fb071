"""The ``ha:`` section: what it accepts, and every mistake named with its field and line."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.sites import write_site
from upsguard.config import load_site
from upsguard.config.checks import site_warnings
from upsguard.config.files import named_files
from upsguard.errors import ConfigError

SITE = """\
site: hq
ups:
  - name: ups-a
    simulated: {}
resources:
  - {id: mgmt-a, kind: vm, platform: none, runs_upsguard: true}
  - {id: mgmt-b, kind: vm, platform: none}
  - {id: core-sw, kind: switch, platform: none}
ha:
  name: ctl-a
  peer_machine: mgmt-b
  endpoints: [http://127.0.0.1:2379, "127.0.0.1:22379", http://localhost:32379]
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_site(write_site(tmp_path, text))
    return info.value.problems


def test_a_pair_loads_with_the_defaults_said_in_the_docs(tmp_path: Path) -> None:
    ha = load_site(write_site(tmp_path, SITE)).ha
    assert ha is not None
    assert ha.name == "ctl-a"
    assert ha.peer_machine == "mgmt-b"
    assert ha.endpoints == [
        "http://127.0.0.1:2379",
        "http://127.0.0.1:22379",
        "http://localhost:32379",
    ]
    assert ha.lease_ttl == timedelta(seconds=5)
    assert ha.fence_margin == timedelta(seconds=1)
    assert ha.request_timeout == timedelta(seconds=1)


def test_a_site_without_the_section_has_no_pair(tmp_path: Path) -> None:
    text = SITE.split("ha:")[0]
    assert load_site(write_site(tmp_path, text)).ha is None


def test_each_mistake_names_its_field_and_line(tmp_path: Path) -> None:
    text = SITE.replace("peer_machine: mgmt-b", "peer_machine: mgmt-bb") + (
        "  lease_ttl: 4s\n  fence_margin: 2s\n  request_timeout: 1.5s\n"
    )
    site_file = tmp_path / "site.yaml"
    assert problems(tmp_path, text) == [
        f"ha.peer_machine: unknown resource 'mgmt-bb' (did you mean 'mgmt-b'?) ({site_file}:11)",
        "ha.fence_margin: 2s is half the lease (4s) or more: the leader would fence itself "
        f"before a renewal could help; make it shorter or the lease longer ({site_file}:14)",
        "ha.request_timeout: 1.5s is longer than a third of the lease (4s), the time between "
        "two renewals: one endpoint that hangs would cost the leader its lease "
        f"({site_file}:15)",
    ]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("lease_ttl", "2.5s", "ha.lease_ttl: etcd leases last whole seconds: write 2s or 3s"),
        ("lease_ttl", "1s", "ha.lease_ttl: '1s' is shorter than 2s"),
        ("lease_ttl", "2m", "ha.lease_ttl: '2m' is longer than 1m"),
        ("name", "'ctl a'", "ha.name: a controller's name is 1 to 63 letters"),
        ("endpoints", "[ftp://x]", "ha.endpoints[0]: not an etcd client URL"),
        ("endpoints", "['http://u:p@x:2379']", "ha.endpoints[0]: credentials in the URL"),
        ("endpoints", "[]", "ha.endpoints: list should have at least 1 item"),
        ("password", "secret", "ha: inline 'password' is not accepted"),
    ],
)
def test_a_bad_value_is_refused_with_its_field(
    tmp_path: Path, field: str, value: str, says: str
) -> None:
    text = SITE.replace("  endpoints:", f"  {field}: {value}\n  endpoints:")
    if field == "name":
        text = SITE.replace("name: ctl-a", f"name: {value}")
    if field == "endpoints":
        text = SITE.replace(
            '[http://127.0.0.1:2379, "127.0.0.1:22379", http://localhost:32379]', value
        )
    found = problems(tmp_path, text)
    assert any(p.startswith(says) for p in found), found
    assert all("secret" not in p for p in found)


@pytest.mark.parametrize(
    ("peer", "says"),
    [
        ("mgmt-a", "mgmt-a is this controller's own machine (runs_upsguard): name the other"),
        ("core-sw", "core-sw is a switch: a controller runs on a vm, host or storage"),
    ],
)
def test_the_peer_machine_is_another_machine(tmp_path: Path, peer: str, says: str) -> None:
    text = SITE.replace("peer_machine: mgmt-b", f"peer_machine: {peer}")
    (only,) = problems(tmp_path, text)
    assert only.startswith(f"ha.peer_machine: {says}")
    assert only.endswith(f"({tmp_path / 'site.yaml'}:11)")


REMOTE_TLS = """\
  endpoints: [https://10.0.0.11:2379, https://etcd-b.lab:2379, https://10.0.0.20]
  tls:
    ca_file: /etc/upsguard/etcd-ca.pem
    cert_file: /etc/upsguard/etcd-client.pem
    key_file: /etc/upsguard/etcd-client.key
  user: upsguard
  password_file: /etc/upsguard/etcd.pw
"""


def with_endpoints(text: str) -> str:
    """``SITE`` with its endpoints line replaced by ``text`` (lines of the ``ha:`` section)."""
    line = '  endpoints: [http://127.0.0.1:2379, "127.0.0.1:22379", http://localhost:32379]\n'
    return SITE.replace(line, text)


def test_https_endpoints_load_with_tls_and_are_not_warned_of(tmp_path: Path) -> None:
    site = load_site(write_site(tmp_path, with_endpoints(REMOTE_TLS)))
    assert site.ha is not None and site.ha.tls is not None
    assert site.ha.endpoints[2] == "https://10.0.0.20:2379"
    assert site.ha.tls.cert_file == Path("/etc/upsguard/etcd-client.pem")
    assert [w for w in site_warnings(site) if w[0][:2] == ("ha", "endpoints")] == []
    files = {f.loc: f.secret for f in named_files(site) if f.loc[0] == "ha"}
    assert files == {  # doctor and validate check each is there; the key is a secret
        ("ha", "password_file"): True,
        ("ha", "tls", "ca_file"): False,
        ("ha", "tls", "cert_file"): False,
        ("ha", "tls", "key_file"): True,
    }


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda t: t.replace("  tls:\n    ca_file: /etc/upsguard/etcd-ca.pem\n", "  tls:\n"),
            "ha.tls: https:// endpoints need ca_file, the CA that signed the members' certificates",
        ),
        (
            lambda t: t.split("  tls:")[0] + "  user: upsguard\n  password_file: /x\n",
            "ha.endpoints[0]: https://10.0.0.11:2379 needs ha.tls (ca_file, and cert_file "
            "and key_file when etcd asks for client certificates)",
        ),
        (
            lambda t: t.replace("https://etcd-b", "http://etcd-b").split("  user:")[0],
            "ha.endpoints[1]: http://etcd-b.lab:2379 is plain while ha.tls is given: write "
            "https:// (every member of a cluster serves clients the same way)",
        ),
        (
            lambda t: t.replace("    key_file: /etc/upsguard/etcd-client.key\n", ""),
            "ha.tls: give cert_file and key_file together",
        ),
        (
            lambda t: t.replace("https://10.0.0.20", '"https://[fd00::20]"'),
            "ha.endpoints[2]: https://[fd00::20]:2379: the etcd client reaches members over "
            "IPv4: give an IPv4 address or a host name",
        ),
    ],
)
def test_tls_mistakes_name_their_field(tmp_path: Path, change: Any, says: str) -> None:
    (only,) = problems(tmp_path, with_endpoints(change(REMOTE_TLS)))
    assert only.startswith(says), only
    assert re.search(r"\(.*site\.yaml:\d+\)$", only), only


def test_a_password_over_plain_http_to_another_machine_is_refused(tmp_path: Path) -> None:
    """etcd's user and password would cross the network in clear, as would the token that
    each request carries: ``validate`` refuses it in one line, exit 2 (allow_plaintext is
    for a link without secrets on it)."""
    text = with_endpoints(
        "  endpoints: [http://127.0.0.1:2379, http://10.0.0.12:2379]\n"
        "  user: upsguard\n  password_file: /etc/upsguard/etcd.pw\n  allow_plaintext: true\n"
    )
    path = write_site(tmp_path, text)
    done = subprocess.run(
        [sys.executable, "-m", "upsguard", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "upsguard: ha.password_file: etcd's password would cross the network in clear to "
        "http://10.0.0.12:2379: write https:// endpoints with ha.tls (docs/ha.md), or drop "
        f"user and password_file ({path}:14)"
    ]


def test_a_password_over_plain_http_on_loopback_is_accepted(tmp_path: Path) -> None:
    text = with_endpoints(
        "  endpoints: [http://127.0.0.1:2379, http://localhost:22379]\n"
        "  user: upsguard\n  password_env: ETCD_PW\n"
    )
    assert load_site(write_site(tmp_path, text)).ha is not None


def test_user_and_password_go_together(tmp_path: Path) -> None:
    assert problems(tmp_path, SITE + "  user: upsguard\n") == [
        f"ha.user: etcd's user needs password_file or password_env ({tmp_path / 'site.yaml'}:13)"
    ]
    assert problems(tmp_path, SITE + "  password_env: ETCD_PW\n") == [
        f"ha: a password for etcd needs 'user' ({tmp_path / 'site.yaml'}:9)"
    ]


def test_warnings_name_a_short_member_list_and_a_link_in_clear(tmp_path: Path) -> None:
    text = SITE.replace(
        '[http://127.0.0.1:2379, "127.0.0.1:22379", http://localhost:32379]',
        "[http://10.0.0.2:2379]",
    )
    site = load_site(write_site(tmp_path, text))
    warned = [(loc, message) for loc, message in site_warnings(site) if loc[0] == "ha"]
    assert [loc for loc, _ in warned] == [("ha", "endpoints"), ("ha", "endpoints")]
    assert warned[0][1].startswith("1 etcd endpoint(s): list every member")
    assert warned[1][1] == (
        "etcd at http://10.0.0.2:2379 is not on this machine and not reached over TLS: the "
        "leader's lease and the shared ledger cross the network in clear. Write https:// "
        "endpoints with ha.tls (docs/ha.md), or allow_plaintext: true to accept it"
    )
    quiet = load_site(write_site(tmp_path, text + "  allow_plaintext: true\n"))
    assert [loc for loc, _ in site_warnings(quiet) if loc[0] == "ha"] == [("ha", "endpoints")]


def test_loopback_endpoints_are_not_warned_of(tmp_path: Path) -> None:
    site = load_site(write_site(tmp_path, SITE))
    assert [w for w in site_warnings(site) if w[0][0] == "ha"] == []


def test_store_machines_are_known_resources_no_more_than_the_members(tmp_path: Path) -> None:
    ok = load_site(write_site(tmp_path, SITE + "  store_machines: [mgmt-a, mgmt-b]\n"))
    assert ok.ha is not None and ok.ha.store_machines == ["mgmt-a", "mgmt-b"]
    found = problems(tmp_path, SITE + "  store_machines: [mgmt-a, nas01]\n")
    assert [p.split(":", 1)[0] for p in found] == ["ha.store_machines[1]"]
    assert "unknown resource 'nas01'" in found[0]
    four = SITE + "  store_machines: [mgmt-a, mgmt-b, core-sw, mgmt-a]\n"
    found = problems(tmp_path, four)
    assert any(p.startswith("ha.store_machines: 4 machines carry etcd members") for p in found)
