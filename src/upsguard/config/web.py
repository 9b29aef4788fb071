"""The ``web:`` section: the live status page that ``upsguard run`` serves (docs/web.md).

Off unless the section is there. Loopback by default; any other address needs TLS, since
the page carries passwords and session cookies and its controls stop a datacenter. Users
are named here with a role and an argon2 hash made by ``upsguard
web-password``: the password itself is never in the file.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from typing import Annotated, Literal, Self

from pydantic import Field, IPvAnyAddress, IPvAnyNetwork, field_validator, model_validator

from upsguard.config.base import Model
from upsguard.config.types import Duration, LocalPath

Role = Literal["viewer", "operator"]
ARGON2ID = re.compile(r"^\$argon2id\$\S+$")
"""argon2id only: argon2i and argon2d hashes (of other tools) are weaker against one attack
or the other; ``upsguard web-password`` makes argon2id."""
HostName = Annotated[str, Field(pattern=r"^\[?[A-Za-z0-9.:_-]{1,253}\]?$")]


class WebUser(Model):
    """One person (or group login) of the page: ``viewer`` reads, ``operator`` also acts."""

    name: str = Field(pattern=r"^[A-Za-z0-9._@+-]{1,64}$")
    role: Role = "viewer"
    password_hash: str | None = Field(
        None,
        description="an argon2id hash from 'upsguard web-password'; none: this user "
        "logs in only through the reverse proxy's header",
        json_schema_extra={"pattern": ARGON2ID.pattern},
    )

    @field_validator("password_hash")
    @classmethod
    def _argon2id(cls, value: str | None) -> str | None:
        if value is not None and not ARGON2ID.match(value):
            raise ValueError("is not an argon2id hash: make one with 'upsguard web-password'")
        return value


class WebTls(Model):
    certificate_file: LocalPath = Field(description="PEM certificate (chain) of the page")
    key_file: LocalPath = Field(description="PEM private key of the certificate")


class WebProxy(Model):
    """A reverse proxy that authenticates people itself and names them in a header.

    Its address alone is not enough: on loopback every local process shares it. The proxy
    proves itself with a secret it sends on every request (``X-Upsguard-Proxy-Secret``); a
    request from a trusted address without it is a direct one, its headers ignored."""

    user_header: str = Field("X-Remote-User", pattern=r"^[A-Za-z0-9-]{1,64}$")
    trusted: list[IPvAnyNetwork] = Field(
        min_length=1,
        description="addresses the proxy connects from; the header is ignored from any other",
    )
    secret_file: LocalPath = Field(
        description="a secret (16 bytes at least) the proxy sends in X-Upsguard-Proxy-Secret "
        "on every request; without it the proxy's headers are ignored",
    )


class WebConfig(Model):
    listen: IPvAnyAddress = Field(
        ipaddress.IPv4Address("127.0.0.1"),
        description="address of the page; other than loopback only with tls",
    )
    port: int = Field(8080, ge=1, le=65535)
    names: list[HostName] | None = Field(
        None,
        min_length=1,
        description="the host names (and addresses) the page is served as: a request whose "
        "Host is another is refused (DNS rebinding); default: the listen address, localhost "
        "on loopback, and this machine's names",
    )
    tls: WebTls | None = None
    users: list[WebUser] = Field(min_length=1)
    proxy: WebProxy | None = None
    session_lifetime: Duration = Field(
        timedelta(hours=12), description="a login lasts this long (an outage's night)"
    )
    session_key_file: LocalPath | None = Field(
        None,
        description="the key that signs session cookies, kept across restarts; none: a new "
        "random key at every start (everyone logs in again)",
    )
    secure_cookies: bool | None = Field(
        None,
        description="mark cookies Secure (HTTPS only); default: when tls is set. Set it behind "
        "a proxy that terminates TLS",
    )

    @model_validator(mode="after")
    def _safe(self) -> Self:
        if self.tls is None and not self.listen.is_loopback:
            raise ValueError(
                f"listen {self.listen} is not loopback: give tls (certificate_file, key_file), "
                "or listen on 127.0.0.1 behind a reverse proxy"
            )
        names = [u.name for u in self.users]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"user {twice[0]!r} is named twice")
        proxy_only = [u.name for u in self.users if u.password_hash is None]
        if proxy_only and self.proxy is None:
            raise ValueError(
                f"user {proxy_only[0]!r} has no password_hash: give one "
                "('upsguard web-password'), or a proxy that names users in a header"
            )
        return self

    @property
    def cookies_secure(self) -> bool:
        return self.tls is not None if self.secure_cookies is None else self.secure_cookies

    def user(self, name: str) -> WebUser | None:
        return next((u for u in self.users if u.name == name), None)
