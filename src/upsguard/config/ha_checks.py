"""Checks of the ``ha:`` section that need more than the section: the peer's machine among
the resources, timings that must fit inside the lease, TLS that fits the endpoints, no
password in clear across the network, what the etcd client cannot do.

``config.checks`` calls these, so each problem comes with the file and line of the exact
field, like every other cross-section problem.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterator

from upsguard.config.ha import HaConfig, endpoint_address
from upsguard.config.site import SiteConfig
from upsguard.config.source import suggest
from upsguard.config.types import format_duration
from upsguard.config.values import shorten
from upsguard.models import ResourceKind

Problem = tuple[tuple[str | int, ...], str]

#: What a controller can run on: one machine (not a group of VMs, a switch or a command).
_MACHINES = (ResourceKind.VM, ResourceKind.HOST, ResourceKind.STORAGE)

TLS_HOW = "write https:// endpoints with ha.tls (docs/ha.md)"


def ha_problems(site: SiteConfig, unchecked: Collection[str] | None) -> Iterator[Problem]:
    """``unchecked``: resources that failed validation (None: the whole section did), so
    a peer machine among them is not called unknown."""
    ha = site.ha
    if ha is None:
        return
    yield from _peer_machine(site, ha, unchecked)
    yield from _store_machines(site, ha, unchecked)
    yield from _timings(ha)
    yield from _credentials(ha)
    yield from _transport(ha)


def ha_warnings(site: SiteConfig) -> Iterator[Problem]:
    ha = site.ha
    if ha is None:
        return
    if len(ha.endpoints) < 3:
        yield (
            ("ha", "endpoints"),
            f"{len(ha.endpoints)} etcd endpoint(s): list every member (three: the two "
            "controllers' machines and a witness), or this controller loses the store with "
            "the one it knows",
        )
    remote = _remote_in_clear(ha)
    if remote and not ha.allow_plaintext:
        yield (
            ("ha", "endpoints"),
            f"etcd at {', '.join(remote)} is not on this machine and not reached over TLS: "
            "the leader's lease and the shared ledger cross the network in clear. "
            f"{TLS_HOW[0].upper()}{TLS_HOW[1:]}, or allow_plaintext: true to accept it",
        )


def _peer_machine(
    site: SiteConfig, ha: HaConfig, unchecked: Collection[str] | None
) -> Iterator[Problem]:
    peer = ha.peer_machine
    if peer is None or unchecked is None or peer in unchecked:
        return
    index = site.resource_index()
    where = ("ha", "peer_machine")
    resource = index.get(peer)
    if resource is None:
        yield where, f"unknown resource {shorten(peer)!r}{suggest(peer, index)}"
    elif resource.runs_upsguard:
        yield (
            where,
            (
                f"{peer} is this controller's own machine (runs_upsguard): name the other "
                "controller's machine"
            ),
        )
    elif resource.kind not in _MACHINES:
        yield where, f"{peer} is a {resource.kind}: a controller runs on a vm, host or storage"


def _store_machines(
    site: SiteConfig, ha: HaConfig, unchecked: Collection[str] | None
) -> Iterator[Problem]:
    if unchecked is None:
        return
    index = site.resource_index()
    for j, rid in enumerate(ha.store_machines):
        if rid not in index and rid not in unchecked:
            where = ("ha", "store_machines", j)
            yield where, f"unknown resource {shorten(rid)!r}{suggest(rid, index)}"
    if len(ha.store_machines) > len(ha.endpoints):
        yield (
            ("ha", "store_machines"),
            f"{len(ha.store_machines)} machines carry etcd members, but only "
            f"{len(ha.endpoints)} endpoint(s) are listed: list every member in endpoints",
        )


def _timings(ha: HaConfig) -> Iterator[Problem]:
    ttl = ha.lease_ttl.total_seconds()
    if ha.fence_margin.total_seconds() >= ttl / 2:
        yield (
            ("ha", "fence_margin"),
            f"{format_duration(ha.fence_margin)} is half the lease ({format_duration(ttl)}) or "
            "more: the leader would fence itself before a renewal could help; make it shorter "
            "or the lease longer",
        )
    if ha.request_timeout.total_seconds() > ttl / 3:
        yield (
            ("ha", "request_timeout"),
            f"{format_duration(ha.request_timeout)} is longer than a third of the lease "
            f"({format_duration(ttl)}), the time between two renewals: one endpoint that hangs "
            "would cost the leader its lease",
        )


def _credentials(ha: HaConfig) -> Iterator[Problem]:
    has_password = ha.password_file is not None or ha.password_env is not None
    if ha.password_file is not None and ha.password_env is not None:
        yield ("ha", "password_env"), "give one of password_file, password_env"
    if ha.user is not None and not has_password:
        yield ("ha", "user"), "etcd's user needs password_file or password_env"
    if ha.user is None and has_password:
        yield ("ha",), "a password for etcd needs 'user'"
    remote = _remote_in_clear(ha)
    if has_password and remote:
        field = "password_file" if ha.password_file is not None else "password_env"
        yield (
            ("ha", field),
            f"etcd's password would cross the network in clear to {', '.join(remote)}: "
            f"{TLS_HOW}, or drop user and {field}",
        )


def _transport(ha: HaConfig) -> Iterator[Problem]:
    """TLS is all or nothing: one set of certificates for every member, so every endpoint
    is ``https://`` with ``tls`` (and its CA: the client never falls back to a plain
    connection nor to the system's CAs), or every one is ``http://`` without it."""
    tls = ha.tls
    secure = [j for j, url in enumerate(ha.endpoints) if url.startswith("https://")]
    if tls is None and secure:
        j = secure[0]
        yield (
            ("ha", "endpoints", j),
            f"{ha.endpoints[j]} needs ha.tls (ca_file, and cert_file and key_file when etcd "
            "asks for client certificates)",
        )
    if tls is not None:
        if tls.ca_file is None:
            yield (
                ("ha", "tls"),
                "https:// endpoints need ca_file, the CA that signed the "
                + ("members' certificates"),
            )
        if (tls.cert_file is None) != (tls.key_file is None):
            yield ("ha", "tls"), "give cert_file and key_file together"
        for j, url in enumerate(ha.endpoints):
            if j not in secure:
                yield (
                    ("ha", "endpoints", j),
                    f"{url} is plain while ha.tls is given: write https:// (every member of "
                    "a cluster serves clients the same way)",
                )
    seen: set[str] = set()
    for j, url in enumerate(ha.endpoints):
        if ":" in endpoint_address(url)[0]:
            yield (
                ("ha", "endpoints", j),
                f"{url}: the etcd client reaches members over IPv4: give an IPv4 address or "
                "a host name",
            )
        if url in seen:
            yield ("ha", "endpoints", j), f"{url} is listed twice"
        seen.add(url)


def _remote_in_clear(ha: HaConfig) -> list[str]:
    """Plain endpoints on other machines: what crosses the network to them can be read."""
    return [
        url
        for url in ha.endpoints
        if url.startswith("http://") and not _loopback(endpoint_address(url)[0])
    ]


def _loopback(host: str) -> bool:
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
