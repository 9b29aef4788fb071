"""The ``ha:`` section: two controllers, one acting, coordinated through etcd.

Each controller of a pair has the section, with its own ``name``; everything else is
the same on both. Checks that need the rest of the site (the peer's machine must be a
resource; timings that must fit inside the lease; what the etcd client cannot do) are
in ``config.checks``, where they can name the exact field.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, WithJsonSchema

from upsguard.config.base import Credentials, Model
from upsguard.config.types import LocalPath, format_duration, parse_duration
from upsguard.models import ResourceId

ETCD_CLIENT_PORT = 2379
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_endpoint(url: str) -> str:
    """An etcd client URL, ``http://HOST[:PORT]`` (or ``https://``), as ``etcdctl
    --endpoints`` takes it; written back with its port. No credentials in it: the URL is
    shown in status and logs, and the password has its own file."""
    text = url.strip()
    try:
        parts = urlsplit(text if "://" in text else f"http://{text}")
        port = parts.port
    except ValueError:
        raise ValueError("not a valid URL (a port must be a number)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an etcd client URL: write it like http://10.0.0.5:2379")
    if "@" in parts.netloc:
        raise ValueError("credentials in the URL are not accepted: give user and password_file")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("an etcd endpoint is a scheme, a host and a port, nothing after")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port or ETCD_CLIENT_PORT}"


def endpoint_address(url: str) -> tuple[str, int]:
    """The host and port of an endpoint ``check_endpoint`` accepted."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(
            "a controller's name is 1 to 63 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (it is shown in status and written in the shared ledger)"
        )
    return name


def _whole_seconds(value: timedelta) -> timedelta:
    whole = int(value.total_seconds())
    if value.total_seconds() != whole:
        raise ValueError(f"etcd leases last whole seconds: write {whole}s or {whole + 1}s")
    return value


def _schema(maximum: timedelta, minimum: timedelta) -> WithJsonSchema:
    number = {
        "type": "number",
        "minimum": minimum.total_seconds(),
        "maximum": maximum.total_seconds(),
        "description": "seconds",
    }
    return WithJsonSchema({"anyOf": [number, {"type": "string"}]})


def _parse(maximum: timedelta, minimum: timedelta) -> BeforeValidator:
    return BeforeValidator(functools.partial(parse_duration, maximum=maximum, minimum=minimum))


_AS_TEXT = PlainSerializer(format_duration, return_type=str)
_TTL_MIN, _TTL_MAX = timedelta(seconds=2), timedelta(minutes=1)
_SHORT_MIN, _SHORT_MAX = timedelta(milliseconds=50), timedelta(seconds=30)

EtcdEndpoint = Annotated[str, AfterValidator(check_endpoint)]
#: An etcd lease: whole seconds, from etcd's own floor (about 1.5 s) to a minute.
LeaseTtl = Annotated[
    timedelta,
    _parse(_TTL_MAX, _TTL_MIN),
    AfterValidator(_whole_seconds),
    _AS_TEXT,
    _schema(_TTL_MAX, _TTL_MIN),
]
#: A margin or a request's timeout: well inside a lease.
ShortDuration = Annotated[
    timedelta, _parse(_SHORT_MAX, _SHORT_MIN), _AS_TEXT, _schema(_SHORT_MAX, _SHORT_MIN)
]


class EtcdTls(Model):
    """TLS to etcd's client port (``https://`` endpoints): the CA that signs the members'
    certificates (each must hold the host or address its endpoint names), and a client
    certificate and key when etcd asks for one (``--client-cert-auth``)."""

    ca_file: LocalPath | None = None
    cert_file: LocalPath | None = None
    key_file: LocalPath | None = None


class HaConfig(Credentials):
    """This controller's place in an active/standby pair (docs/ha.md)."""

    name: Annotated[str, AfterValidator(_check_name)] = Field(
        description="this controller's name, unique in the pair (e.g. its machine's host name)"
    )
    peer_machine: ResourceId | None = Field(
        None,
        description="the resource of the other controller's machine, when the plan stops it: "
        "the two controllers' machines are the last two steps of a shutdown",
    )
    endpoints: list[EtcdEndpoint] = Field(
        min_length=1,
        max_length=9,
        description="etcd client URLs, every member: the two controllers' machines and a "
        "witness that stays up longest",
    )
    store_machines: list[ResourceId] = Field(
        default_factory=list,
        description="the resources whose stop takes an etcd member down (the machines "
        "carrying the members, or the hosts they run on): before the step that would leave "
        "fewer members than a quorum, the leader finishes alone",
    )
    tls: EtcdTls | None = None
    allow_plaintext: bool = Field(
        False,
        description="etcd on other machines without TLS: accepted, no warning (the lease "
        "and the ledger cross the network in clear; a password never does: give TLS)",
    )
    lease_ttl: LeaseTtl = Field(
        timedelta(seconds=5),
        description="how long the leader's lease lives without a renewal; a standby takes "
        "over at most this long after the leader died",
    )
    fence_margin: ShortDuration = Field(
        timedelta(seconds=1),
        description="a leader that cannot renew stops starting actions this long before its "
        "lease could end",
    )
    request_timeout: ShortDuration = Field(
        timedelta(seconds=1), description="how long one request to one etcd endpoint may take"
    )
