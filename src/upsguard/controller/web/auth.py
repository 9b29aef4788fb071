"""Who is asking: passwords, signed session cookies, CSRF tokens, slowed logins, and the
reverse proxy's header.

- Passwords are argon2 hashes (argon2-cffi) in the site file. Checking one costs about
  0.1 s of CPU and 64 MiB, so it runs in a worker thread, one at a time: a flood of logins
  never stalls the power watch on the event loop.
- A session is a cookie the service signs (HMAC-SHA256) with a key of its own: the user,
  when it expires, and the session's CSRF token. The role is read from the users in force
  (``Roster``) at every request, so a user taken out of the file is out at its reload.
- Every change (a control, logout) must carry the session's CSRF token in a header; the
  login form carries one derived from a cookie set with the form.
- Each failed login makes the next attempt from that address wait longer (0.5 s doubling,
  up to a minute; ``LoginThrottle``), answered at once with 429; an address with no
  failures is never refused, and attempts from one address are checked one at a time.
- A reverse proxy that authenticates people may name them in a header, believed only from
  the configured proxy addresses with the proxy's secret (``Proxy``): on loopback every
  local process shares the proxy's address. Its users get a CSRF token derived from their
  name.

No password, hash or key is ever logged or shown.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import stat
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from upsguard.config.web import Role, WebConfig, WebUser
from upsguard.errors import PermanentError

SESSION_COOKIE = "upsguard_session"
HOST_ONLY = "__Host-"
LOGIN_COOKIE = "upsguard_login"
DEVICE_COOKIE = "upsguard_device"
"""Set by a successful login, for ``/login`` only: this browser logged in as that user
before (a device cookie, as OWASP describes them). Its logins are checked in a lane of their
own (``PasswordCheck``), never behind the guesses of addresses the page has not seen."""
DEVICE_COOKIE_DAYS = 365
CSRF_HEADER = "X-CSRF-Token"
SECRET_HEADER = "X-Upsguard-Proxy-Secret"
MIN_PASSWORD = 12
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 60.0
NAME_MAX_DELAY_S = 5.0
FORGET_AFTER_S = 900.0
MAX_TRACKED = 10_000

_hasher = PasswordHasher()


def hash_password(password: str) -> str:
    """The argon2 hash ``upsguard web-password`` prints for the site file."""
    if not password:
        raise PermanentError("the password is empty")
    return _hasher.hash(password)


@dataclass(frozen=True, slots=True)
class User:
    """Someone the page knows, with the role the site file gives them."""

    name: str
    role: Role
    csrf: str
    via_proxy: bool = False

    @property
    def may_act(self) -> bool:
        return self.role == "operator"


class Roster:
    """The page's users as the site file in force names them. A reload replaces them at once
    (``replace``): every session and login is checked against them at every request."""

    def __init__(self, users: Iterable[WebUser]) -> None:
        self._by_name: dict[str, WebUser] = {}
        self.replace(users)

    def replace(self, users: Iterable[WebUser]) -> None:
        self._by_name = {user.name: user for user in users}

    def user(self, name: str) -> WebUser | None:
        return self._by_name.get(name)


class Keys:
    """The signing key of sessions and CSRF tokens; never logged, never shown."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def for_config(cls, config: WebConfig) -> Keys:
        if config.session_key_file is None:
            return cls(secrets.token_bytes(32))
        return cls(read_secret(config.session_key_file, "web.session_key_file"))

    def sign(self, data: bytes) -> str:
        return _b64(hmac.new(self._key, data, hashlib.sha256).digest())

    def valid(self, data: bytes, signature: str) -> bool:
        return hmac.compare_digest(self.sign(data), signature)


def read_secret(path: Path, field: str) -> bytes:
    """The secret in ``path`` (``field`` names it in the site file), without its line end;
    refused when others than its owner may read it, or shorter than 16 bytes."""
    try:
        with path.open("rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            key = file.read().strip()
    except OSError as exc:
        raise PermanentError(f"{field} {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermanentError(
            f"{field} {path}: readable by others than its owner (mode "
            f"{stat.S_IMODE(mode):04o}): chmod 600 {path}"
        )
    if len(key) < 16:
        raise PermanentError(f"{field} {path}: the secret is shorter than 16 bytes")
    return key


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class _Session:
    """What a session cookie says."""

    name: str
    csrf: str
    """The session's CSRF token, random: it names the session too."""
    expires: float
    password: str
    """A keyed digest of the user's password hash when the session was made."""


class Sessions:
    """Signed session cookies: ``payload.signature``, both URL-safe base64.

    A cookie names its user, its session (the CSRF token), when it expires, and a digest of
    the user's password hash keyed like the signature: a changed password ends every session
    made with the old one. A session logged out of is kept as revoked until it would have
    expired (in memory: a restart with the same ``session_key_file`` forgets it)."""

    def __init__(
        self,
        config: WebConfig,
        keys: Keys,
        roster: Roster | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``roster``: the users in force (shared with the login's check); by default those
        of ``config``. ``clock``: the wall clock of expiry (a test's fake one)."""
        self._clock = clock
        self._config = config
        self._keys = keys
        self._roster = roster or Roster(config.users)
        self._revoked: dict[str, float] = {}

    @property
    def revoked(self) -> int:
        """Sessions logged out of and not expired yet."""
        return len(self._revoked)

    def issue(self, name: str, now: float | None = None) -> str:
        lifetime = self._config.session_lifetime.total_seconds()
        expires = (self._clock() if now is None else now) + lifetime
        payload = json.dumps(
            {
                "u": name,
                "c": secrets.token_urlsafe(24),
                "e": int(expires),
                "p": self._password_digest(self._roster.user(name)),
            },
            separators=(",", ":"),
        ).encode()
        return f"{_b64(payload)}.{self._keys.sign(payload)}"

    def user(self, cookie: str | None, now: float | None = None) -> User | None:
        """The user of a valid, unexpired, unrevoked cookie who is still in the site file with
        the password the cookie was made with; else None."""
        session = self._session(cookie)
        if session is None:
            return None
        entry = self._roster.user(session.name)
        if entry is None or session.expires < (self._clock() if now is None else now):
            return None
        if session.csrf in self._revoked:
            return None
        if not hmac.compare_digest(session.password, self._password_digest(entry)):
            return None
        return User(session.name, entry.role, session.csrf)

    def revoke(self, cookie: str | None, now: float | None = None) -> None:
        """End the session of ``cookie`` (a logout): refused until it would have expired."""
        moment = self._clock() if now is None else now
        for csrf, expires in list(self._revoked.items()):
            if expires < moment:
                del self._revoked[csrf]
        session = self._session(cookie)
        if session is not None and session.expires >= moment:
            self._revoked[session.csrf] = session.expires

    def _session(self, cookie: str | None) -> _Session | None:
        """What a cookie this service signed says; None for any other."""
        if not cookie or cookie.count(".") != 1 or len(cookie) > 1024:
            return None
        body, signature = cookie.split(".")
        try:
            payload = _unb64(body)
        except ValueError:
            return None
        if not self._keys.valid(payload, signature):
            return None
        try:
            data = json.loads(payload)
            return _Session(str(data["u"]), str(data["c"]), float(data["e"]), str(data["p"]))
        except (ValueError, KeyError, TypeError):
            return None

    def _password_digest(self, entry: WebUser | None) -> str:
        stored = entry.password_hash if entry is not None else None
        return self._keys.sign(f"password:{stored or ''}".encode())[:22]

    def proxied(self, name: str) -> User | None:
        """A user the trusted proxy named; their CSRF token is derived from their name."""
        entry = self._roster.user(name)
        if entry is None:
            return None
        return User(name, entry.role, self._keys.sign(f"proxy:{name}".encode()), via_proxy=True)

    def login_token(self, nonce: str) -> str:
        """The login form's CSRF token, bound to the nonce cookie set with the form."""
        return self._keys.sign(f"login:{nonce}".encode())

    def device_token(self, name: str) -> str:
        """The device cookie of ``name``'s browsers (``DEVICE_COOKIE``): void once the
        password changes, as the sessions are."""
        digest = self._password_digest(self._roster.user(name))
        return self._keys.sign(f"device:{name}:{digest}".encode())

    def known_device(self, name: str, cookie: str | None) -> bool:
        """The browser sending ``cookie`` logged in as ``name`` before, with the password
        in force."""
        return bool(cookie) and hmac.compare_digest(self.device_token(name), cookie or "")


def session_cookie(config: WebConfig) -> str:
    """The session cookie's name: with Secure cookies it is a ``__Host-`` one, which browsers
    keep only when Secure, for ``Path=/`` and without a ``Domain``, so that no other host of
    the domain (nor a plain-HTTP answer) can plant a session for the page."""
    return HOST_ONLY + SESSION_COOKIE if config.cookies_secure else SESSION_COOKIE


def csrf_ok(user: User, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(user.csrf, sent or "")


def trusted_proxy(config: WebConfig, remote: str | None) -> bool:
    """Whether ``remote`` is one of the proxy's addresses (which alone proves nothing)."""
    if config.proxy is None or not remote:
        return False
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False
    return any(address in network for network in config.proxy.trusted)


class Proxy:
    """The trusted reverse proxy: a request is the proxy's when it comes from one of its
    addresses *and* carries its secret in ``SECRET_HEADER`` (compared in constant time).
    Any other request is a direct one: its user and forwarded-for headers are ignored."""

    def __init__(self, config: WebConfig, secret: bytes = b"") -> None:
        self._config = config
        self._secret = secret

    @classmethod
    def for_config(cls, config: WebConfig) -> Proxy:
        """Reads the proxy's secret; PermanentError naming the file when it cannot."""
        if config.proxy is None:
            return cls(config)
        return cls(config, read_secret(config.proxy.secret_file, "web.proxy.secret_file"))

    def vouches(self, remote: str | None, headers: Mapping[str, str]) -> bool:
        if not self._secret or not trusted_proxy(self._config, remote):
            return False
        sent = headers.get(SECRET_HEADER, "").encode("utf-8", "replace")
        return hmac.compare_digest(sent, self._secret)

    def user_name(self, remote: str | None, headers: Mapping[str, str]) -> str | None:
        """The name the proxy gives, when it is the proxy that asks."""
        proxy = self._config.proxy
        if proxy is None or not self.vouches(remote, headers):
            return None
        return headers.get(proxy.user_header) or None

    def client_address(self, remote: str | None, headers: Mapping[str, str]) -> str:
        """Who connects, for the login throttle: the peer, or behind the proxy the client
        address it names last in ``X-Forwarded-For`` (what the proxy itself saw)."""
        peer = remote or "unknown"
        forwarded = headers.get("X-Forwarded-For")
        if not forwarded or not self.vouches(remote, headers):
            return peer
        last = forwarded.split(",")[-1].strip()
        try:
            return str(ipaddress.ip_address(last))
        except ValueError:
            return peer


@dataclass
class _Failures:
    count: int = 0
    until: float = 0.0
    last: float = 0.0


@dataclass
class LoginThrottle:
    """Failed logins slow the next attempts down, so that guessing is slow and nobody can lock
    somebody else out.

    - Hard waits are keyed on the client's address, and on the name *from* that address: the
      address's failures (0.5 s doubling, up to a minute) refuse it whatever name it tries,
      and never another address.
    - A name's failures from every address make an address that has failed too wait (up to
      ``NAME_MAX_DELAY_S``): a guesser who moves between addresses gets one free guess per
      address. An address with no failures is never refused for a name's sake, so an
      operator on a clean address always logs in.
    - An attempt is reserved before its password is checked (``admit``), and its outcome
      recorded after (``record``): while one attempt from an address is being checked, the
      next from it waits, so parallel guesses are checked one by one, not all at once.

    ``clock``: the monotonic clock (a test's fake one).
    """

    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, _Failures] = field(default_factory=dict)
    _checking: set[str] = field(default_factory=set)

    def admit(self, name: str, address: str) -> float:
        """0, and the attempt is reserved until ``record``; else how long it must still wait."""
        now = self.clock()
        here = f"address {address}"
        wait = max(self._wait(here, now), self._wait(f"user {name} from {address}", now))
        if here in self._seen:  # an address that failed waits for the name's failures too
            wait = max(wait, min(NAME_MAX_DELAY_S, self._wait(f"user {name}", now)))
        if wait <= 0 and here in self._checking:
            wait = FIRST_DELAY_S  # its attempt before this one is being checked
        if wait <= 0:
            self._checking.add(here)
        return wait

    def failed(self, address: str) -> bool:
        """The address has failures on record (its checks go in their own lane)."""
        return f"address {address}" in self._seen

    def record(self, name: str, address: str, ok: bool) -> float:
        """The outcome of an admitted attempt; the delay the next from there will wait."""
        now = self.clock()
        self._checking.discard(f"address {address}")
        keys = (f"address {address}", f"user {name} from {address}", f"user {name}")
        if ok:
            for key in keys[:2]:
                self._seen.pop(key, None)
            return 0.0
        self._forget(now)
        delay = 0.0
        for key in keys:
            entry = self._seen.setdefault(key, _Failures())
            entry.count += 1
            entry.last = now
            wait = min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** (entry.count - 1))
            entry.until = now + wait
            delay = max(delay, wait if key != keys[2] else min(wait, NAME_MAX_DELAY_S))
        return delay

    def _wait(self, key: str, now: float) -> float:
        entry = self._seen.get(key)
        return 0.0 if entry is None else max(0.0, entry.until - now)

    def _forget(self, now: float) -> None:
        stale = [k for k, v in self._seen.items() if now - v.last > FORGET_AFTER_S]
        for key in stale:
            del self._seen[key]
        while len(self._seen) >= MAX_TRACKED:  # a spray of addresses: oldest go first
            del self._seen[min(self._seen, key=lambda k: self._seen[k].last)]


class FairLane:
    """One password check at a time; the checks waiting take turns between networks (IPv4
    /24, IPv6 /64: what one site or one host commonly holds), oldest first within each. A
    burst of first guesses from many addresses of one network then delays a login from
    another network by one check, not by the whole burst."""

    def __init__(self) -> None:
        self._busy = False
        self._serving = ""
        """The network whose check holds the lane (or held it last)."""
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        """Per network, in turn order (a network served goes to the back)."""

    @contextlib.asynccontextmanager
    async def turn(self, address: str) -> AsyncIterator[None]:
        network = network_of(address)
        if self._busy:
            granted = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(network, deque()).append(granted)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._next()  # the turn came as the waiter went: pass it on
                raise
        else:
            self._busy, self._serving = True, network
        try:
            yield
        finally:
            self._next()

    def _next(self) -> None:
        """Hand the lane to the first waiter of the next network in turn (another than the
        one just served, when another waits), or free it."""
        while self._waiting:
            network = next((n for n in self._waiting if n != self._serving), self._serving)
            queue = self._waiting.pop(network)
            granted = queue.popleft()
            if queue:
                self._waiting[network] = queue
            if not granted.done():
                self._serving = network
                granted.set_result(None)
                return  # the lane stays busy: it is the waiter's now
        self._busy = False


def network_of(address: str) -> str:
    """The network an address counts in for ``FairLane``; an address that is no IP address
    (a unix socket's peer) is a network of its own."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    prefix = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


class PasswordCheck:
    """argon2 verification off the event loop, one at a time in each of three lanes: one for
    addresses that have failed a login, one for those that have not (taking turns between
    networks, ``FairLane``), and one for browsers that logged in as that user before
    (``DEVICE_COOKIE``). An operator on a clean address never waits behind the guesses of
    addresses that failed, nor, from another network, behind the first guesses of a spray
    of fresh addresses; one whose browser logged in before never waits behind either. The
    decoy hash for unknown names is made at start (``start``), off the event loop too."""

    def __init__(
        self, config: WebConfig, hasher: PasswordHasher = _hasher, roster: Roster | None = None
    ) -> None:
        """``hasher``: argon2's (a test's recording one); ``roster``: the users in force, by
        default those of ``config``."""
        self._roster = roster or Roster(config.users)
        self._hasher = hasher
        self._clean_lane = FairLane()
        self._failed_lane = asyncio.Semaphore(1)
        self._known_lane = asyncio.Semaphore(1)
        self._decoy: str | None = None

    async def start(self) -> None:
        """Make the decoy hash that unknown names are checked against, in a worker thread: a
        hash costs what a check does, and the event loop watches the power."""
        if self._decoy is None:
            self._decoy = await asyncio.to_thread(self._hasher.hash, secrets.token_urlsafe(16))

    async def verify(
        self,
        name: str,
        password: str,
        *,
        address: str = "",
        failed_before: bool = False,
        known: bool = False,
    ) -> bool:
        """Whether ``password`` is ``name``'s; an unknown name costs what a known one does.
        ``address``: the client's (``Proxy.client_address``); ``failed_before``: it has
        failed a login (``LoginThrottle.failed``); ``known``: the browser logged in as
        ``name`` before (``Sessions.known_device``)."""
        entry = self._roster.user(name)
        stored = entry.password_hash if entry is not None else None
        lane = self._known_lane if known else self._failed_lane if failed_before else None
        async with lane or self._clean_lane.turn(address):
            if self._decoy is None:
                await self.start()
            assert self._decoy is not None
            ok = await asyncio.to_thread(self._verify, stored or self._decoy, password)
        return ok and stored is not None

    def _verify(self, stored: str, password: str) -> bool:
        try:
            return self._hasher.verify(stored, password)
        except (VerificationError, InvalidHashError):
            return False
