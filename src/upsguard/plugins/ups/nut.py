"""A UPS served by NUT's upsd, read through NUT's own Python client (PyNUTClient).

PyNUTClient is blocking, so every call runs in a worker thread. The UPSes one
upsd serves share one connection: the reads that the sources of one event loop
start in the same loop iteration (``asyncio.gather`` over a poll) are batched
into one worker call over that connection. A connection that fails is dropped
and reopened with exponential backoff, counted on the injected clock.

upsd answers ``ERR DATA-STALE`` (the driver stopped updating) and
``ERR DRIVER-NOT-CONNECTED`` (no driver) for one UPS while the server itself is
fine: those become a reading with ``link=stale``, never an exception.

PyNUTClient reads an answer until its terminator with no limit of size or
time: a server that trickles bytes or sends an endless line would hang a
worker or eat memory. ``_BoundedClient`` overrides that one reader (its
private name is ``_PyNUTClient__read_until``) to cap each answer at
``MAX_ANSWER_BYTES`` and at the configured timeout, and to ask the kernel for
immediate ACKs: upsd writes a ``LIST VAR`` answer line by line, and with
delayed ACKs every answer otherwise costs about 40 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from PyNUTClient.PyNUT import PyNUTClient, PyNUTError

from upsguard.clock import Clock
from upsguard.config.types import resolve_secret
from upsguard.config.ups import NutSettings, UpsConfig
from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    PermanentError,
    UpsguardError,
    UpsUnreachable,
)
from upsguard.models import LinkState, UpsFlag, UpsName, UpsReading

MAX_ANSWER_BYTES = 1 << 20
"""A LIST VAR of a large UPS is about 10 KiB; anything past 1 MiB is not NUT."""

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0

_STALE = frozenset({"DATA-STALE", "DRIVER-NOT-CONNECTED"})
_PER_UPS = _STALE | {"UNKNOWN-UPS", "VAR-NOT-SUPPORTED"}
_FLAGS = {flag.value: flag for flag in UpsFlag}
_NUMBERS = {
    "charge_pct": "battery.charge",
    "runtime_s": "battery.runtime",
    "load_pct": "ups.load",
    "input_voltage": "input.voltage",
}
_DELAY_VAR = "ups.delay.shutdown"

if not hasattr(PyNUTClient, "_PyNUTClient__read_until"):  # pragma: no cover
    raise ImportError("this PyNUTClient has no _PyNUTClient__read_until: upsguard needs 2.8.x")


class _AnswerTooLong(Exception):
    pass


class _BoundedClient(PyNUTClient):  # type: ignore[misc]
    """PyNUTClient whose answers are bounded in bytes and time (see the module docstring)."""

    def __init__(self, answer_timeout_s: float, **kwargs: Any) -> None:
        self._answer_timeout_s = answer_timeout_s
        super().__init__(timeout=answer_timeout_s, **kwargs)

    def _PyNUTClient__read_until(self, terminator: bytes) -> bytes:
        sock: socket.socket = self._PyNUTClient__srv_handler
        data: bytes = getattr(self, "_PyNUTClient__recv_leftover", b"")
        deadline = time.monotonic() + self._answer_timeout_s
        searched = 0
        while (end := data.find(terminator, searched)) == -1:
            if len(data) > MAX_ANSWER_BYTES:
                raise _AnswerTooLong(f"an answer longer than {MAX_ANSWER_BYTES} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no complete answer in time")
            searched = max(0, len(data) - len(terminator) + 1)
            sock.settimeout(remaining)
            _quick_ack(sock)
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("the server closed the connection")
            data += chunk
        end += len(terminator)
        self._PyNUTClient__recv_leftover = data[end:]
        return data[:end]

    def logout(self) -> None:
        """Say goodbye and close; PyNUTClient only does this when garbage-collected."""
        sock: socket.socket = self._PyNUTClient__srv_handler
        with contextlib.suppress(OSError):
            sock.settimeout(0.5)
            sock.sendall(b"LOGOUT\n")
        with contextlib.suppress(OSError):
            sock.close()


def _quick_ack(sock: socket.socket) -> None:
    quickack = getattr(socket, "TCP_QUICKACK", None)
    if quickack is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)


def nut_error_word(exc: BaseException) -> str:
    """``ERR DATA-STALE`` -> ``DATA-STALE``; anything else -> its text."""
    text = str(exc).strip()
    return text[4:].split(" ")[0] if text.startswith("ERR ") else text


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """What makes two UPSes share a connection: same upsd, same user, same TLS, same login."""

    host: str
    port: int
    user: str | None
    starttls: bool
    ca_file: str | None
    login_ups: str | None  # set when we log in like upsmon: one LOGIN per connection
    primary: bool


class _Upsd:
    """One connection to one upsd, used from worker threads one call at a time."""

    def __init__(self, endpoint: _Endpoint, password: str | None, timeout_s: float) -> None:
        self.endpoint = endpoint
        self._password = password
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._client: _BoundedClient | None = None
        self.checked = False

    @property
    def where(self) -> str:
        return f"upsd {self.endpoint.host}:{self.endpoint.port}"

    def connect(self) -> _BoundedClient:
        ep = self.endpoint
        tls: dict[str, Any] = {}
        if ep.starttls:
            tls = {"use_ssl": True, "force_ssl": True, "ca_file": ep.ca_file}
        return _BoundedClient(
            self._timeout_s,
            host=ep.host,
            port=ep.port,
            login=ep.user,
            password=self._password if ep.user else None,
            **tls,
        )

    def fetch(self, names: list[str]) -> dict[str, dict[str, str] | str]:
        """Every variable of each named UPS, or the NUT error word that concerns only it."""
        with self._lock:
            try:
                client = self._client or self._open()
                return {name: self._vars(client, name) for name in names}
            except UpsguardError:
                self.drop()
                raise
            except _FAILURES as exc:
                self.drop()
                raise self._unreachable(exc) from exc

    def _open(self) -> _BoundedClient:
        client = self.connect()
        self._client = client
        ep = self.endpoint
        if ep.login_ups is not None:
            self._login(client, ep.login_ups)
        return client

    def _login(self, client: _BoundedClient, ups: str) -> None:
        """LOGIN like upsmon (and PRIMARY when asked): the call that checks a password."""
        try:
            client.DeviceLogin(ups)
            if self.endpoint.primary:
                client._PyNUTClient__srv_handler.sendall(f"PRIMARY {ups}\n".encode("ascii"))
                answer = client._PyNUTClient__read_until(b"\n")
                if not answer.startswith(b"OK"):
                    raise PyNUTError(answer.decode("ascii", "replace").strip())
        except PyNUTError as exc:
            word = nut_error_word(exc)
            if word in ("ACCESS-DENIED", "USERNAME-REQUIRED", "PASSWORD-REQUIRED"):
                raise self._refused(ups, word) from exc
            if word == "UNKNOWN-UPS":
                raise ConfigError(f"{self.where} serves no UPS named '{ups}'") from exc
            raise
        self.checked = True

    def check_login(self, ups: str) -> None:
        """Check the credentials once on a connection of its own, then leave it.

        A plain read does not check a password; LOGIN does, but keeps us counted
        as a monitor while connected, so the check connection is closed at once.
        """
        if self.checked or self.endpoint.user is None:
            return
        with self._lock:
            if self.checked:
                return
            try:
                client = self.connect()
            except _FAILURES as exc:
                raise self._unreachable(exc) from exc
            try:
                self._login(client, ups)
            except _FAILURES as exc:
                raise self._unreachable(exc) from exc
            finally:
                client.logout()

    def _vars(self, client: _BoundedClient, name: str) -> dict[str, str] | str:
        try:
            answer: Mapping[bytes, bytes] = client.GetUPSVars(name)
        except PyNUTError as exc:
            word = nut_error_word(exc)
            if word in _PER_UPS:
                return word
            raise
        return {
            k.decode("ascii", "replace"): v.decode("utf-8", "replace") for k, v in answer.items()
        }

    def _refused(self, ups: str, word: str) -> AuthenticationError:
        return AuthenticationError(
            f"{self.where} refused user '{self.endpoint.user}' for UPS '{ups}' ({word}): "
            "check the password file or variable, and that upsd.users gives this user "
            "an 'upsmon' role"
        )

    def _unreachable(self, exc: BaseException) -> UpsUnreachable:
        if isinstance(exc, PyNUTError) and "STARTTLS" in str(exc):
            detail = f"does not offer STARTTLS ({_short(exc)}): set CERTFILE/CERTPATH in upsd.conf"
        elif isinstance(exc, ssl.SSLCertVerificationError):
            detail = f"has a TLS certificate we do not trust ({exc.verify_message}): check ca_file"
        elif isinstance(exc, ssl.SSLError):
            detail = f"failed the TLS handshake ({_short(exc)})"
        elif isinstance(exc, PyNUTError):
            detail = f"answered something that is not NUT: '{_short(exc)}'"
        elif isinstance(exc, UnicodeDecodeError):
            detail = "answered bytes that are not NUT text"
        elif isinstance(exc, IndexError | ValueError):
            detail = "answered a variable list that is not NUT"
        elif isinstance(exc, _AnswerTooLong):
            detail = f"sent {_short(exc)}"
        elif isinstance(exc, TimeoutError):
            detail = f"did not answer within {self._timeout_s:g}s"
        else:
            detail = f"cannot be reached ({_short(exc)})"
        return UpsUnreachable(f"{self.where} {detail}")

    def drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.logout()

    def close(self) -> None:
        with self._lock:
            self.drop()

    def run_command(self, ups: str, command: str, delay_s: float | None) -> None:
        """Send an instant command on a connection of its own (it needs the user's rights)."""
        try:
            client = self.connect()
        except _FAILURES as exc:
            raise self._unreachable(exc) from exc
        try:
            if delay_s is not None and _DELAY_VAR.encode() in client.GetRWVars(ups):
                client.SetRWVar(ups, _DELAY_VAR, str(round(delay_s)))
            client.RunUPSCommand(ups, command)
        except PyNUTError as exc:
            word = nut_error_word(exc)
            if word in ("ACCESS-DENIED", "USERNAME-REQUIRED", "PASSWORD-REQUIRED"):
                raise AuthenticationError(
                    f"{self.where} refused '{command}' on UPS '{ups}' for user "
                    f"'{self.endpoint.user}' ({word}): upsd.users must give it "
                    "'instcmds' (and 'actions = SET' for the delay)"
                ) from exc
            if word in ("CMD-NOT-SUPPORTED", "UNKNOWN-UPS", "INVALID-ARGUMENT"):
                raise PermanentError(f"UPS '{ups}' on {self.where}: {command}: {word}") from exc
            raise self._unreachable(exc) from exc
        except _FAILURES as exc:
            raise self._unreachable(exc) from exc
        finally:
            client.logout()


_FAILURES = (
    OSError,
    PyNUTError,
    _AnswerTooLong,
    UnicodeDecodeError,
    IndexError,
    ValueError,
)


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(slots=True)
class _Link:
    """An upsd as one event loop sees it: the connection, its backoff, the batch being formed."""

    upsd: _Upsd
    users: int = 0
    failures: int = 0
    retry_at: float = 0.0
    last_error: UpsguardError | None = None
    batch: dict[str, list[asyncio.Future[dict[str, str] | str]]] = field(default_factory=dict)


_LINKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Endpoint, _Link]] = (
    weakref.WeakKeyDictionary()
)


class NutSource:
    """One UPS on an upsd (see the module docstring for sharing, backoff and bounds)."""

    def __init__(self, config: UpsConfig, clock: Clock) -> None:
        if config.nut is None:
            raise ConfigError(f"UPS {config.name}: the nut source needs a 'nut' section")
        self.name: UpsName = config.name
        self.config = config
        self.settings: NutSettings = config.nut
        self._clock = clock
        self._endpoint = _endpoint_of(self.settings)
        self._link: _Link | None = None

    def _password(self) -> str | None:
        s = self.settings
        if s.user is None:
            return None
        secret = resolve_secret(f"UPS {self.name}: NUT password", s.password_file, s.password_env)
        if secret is None:
            raise ConfigError(
                f"UPS {self.name}: NUT user '{s.user}' needs password_file or password_env"
            )
        return secret

    def _get_link(self) -> _Link:
        if self._link is not None:
            return self._link
        links = _LINKS.setdefault(asyncio.get_running_loop(), {})
        link = links.get(self._endpoint)
        if link is None:
            upsd = _Upsd(self._endpoint, self._password(), self.settings.timeout.total_seconds())
            link = links[self._endpoint] = _Link(upsd)
        link.users += 1
        self._link = link
        return link

    async def read(self) -> UpsReading:
        link = self._get_link()
        try:
            if self._endpoint.login_ups is None and self._endpoint.user is not None:
                await self._check_login(link)
            answer = await self._batched(link)
        except UpsguardError as exc:
            raise _named(self.name, exc) from exc
        return self._reading(answer)

    async def _check_login(self, link: _Link) -> None:
        if link.upsd.checked:
            return
        self._respect_backoff(link)
        try:
            await asyncio.to_thread(link.upsd.check_login, self.settings.ups)
        except UpsUnreachable as exc:
            self._failed(link, exc)
            raise

    async def _batched(self, link: _Link) -> dict[str, str] | str:
        self._respect_backoff(link)
        future: asyncio.Future[dict[str, str] | str] = asyncio.get_running_loop().create_future()
        if not link.batch:
            asyncio.get_running_loop().call_soon(_flush, link, self._clock)
        link.batch.setdefault(self.settings.ups, []).append(future)
        return await future

    def _respect_backoff(self, link: _Link) -> None:
        if link.failures and self._clock.monotonic() < link.retry_at and link.last_error:
            wait = link.retry_at - self._clock.monotonic()
            raise UpsUnreachable(f"{link.last_error} (next try in {wait:.1f}s)", retry_after=wait)

    def _failed(self, link: _Link, exc: UpsguardError) -> None:
        _note_failure(link, exc, self._clock)

    def _reading(self, answer: dict[str, str] | str) -> UpsReading:
        now = self._clock.now()
        if isinstance(answer, str):
            if answer == "UNKNOWN-UPS":
                where = f"{self.settings.host}:{self.settings.port}"
                raise ConfigError(
                    f"UPS {self.name}: upsd {where} serves no UPS named '{self.settings.ups}'"
                )
            return UpsReading(
                ups=self.name, at=now, link=LinkState.STALE, raw={"nut.error": answer}
            )
        return reading_from_vars(self.name, now, answer)

    async def command(self, name: str) -> None:
        if self.settings.user is None:
            raise ConfigError(f"UPS {self.name}: instant commands need a NUT 'user' with instcmds")
        policy = self.config.at_shutdown_end
        delay = policy.delay.total_seconds() if name == policy.command else None
        upsd = _Upsd(self._endpoint, self._password(), self.settings.timeout.total_seconds())
        try:
            await asyncio.to_thread(upsd.run_command, self.settings.ups, name, delay)
        except UpsguardError as exc:
            raise _named(self.name, exc) from exc

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is None:
            return
        link.users -= 1
        if link.users <= 0:
            with contextlib.suppress(RuntimeError):
                _LINKS.get(asyncio.get_running_loop(), {}).pop(self._endpoint, None)
            await asyncio.to_thread(link.upsd.close)


def _named(ups: UpsName, exc: UpsguardError) -> UpsguardError:
    """The same error with the site's UPS name in front, so that the line says which UPS."""
    message = f"UPS {ups}: {exc}"
    if isinstance(exc, ConfigError):
        return ConfigError(message)
    if isinstance(exc, UpsUnreachable):
        return UpsUnreachable(message, retry_after=exc.retry_after)
    if isinstance(exc, AuthenticationError):
        return AuthenticationError(message)
    if isinstance(exc, PermanentError):
        return PermanentError(message)
    return UpsguardError(message)


def _endpoint_of(s: NutSettings) -> _Endpoint:
    monitors = s.monitor != "none" and s.user is not None
    return _Endpoint(
        host=s.host,
        port=s.port,
        user=s.user,
        starttls=s.starttls,
        ca_file=str(s.ca_file) if s.ca_file else None,
        login_ups=s.ups if monitors else None,
        primary=s.monitor == "primary",
    )


def _flush(link: _Link, clock: Clock) -> None:
    """Read every UPS asked for in this loop iteration in one worker call."""
    batch, link.batch = link.batch, {}
    asyncio.get_running_loop().create_task(_fetch(link, batch, clock))


async def _fetch(
    link: _Link, batch: dict[str, list[asyncio.Future[dict[str, str] | str]]], clock: Clock
) -> None:
    try:
        answers = await asyncio.to_thread(link.upsd.fetch, list(batch))
    except UpsguardError as exc:
        if isinstance(exc, UpsUnreachable):
            _note_failure(link, exc, clock)
        for futures in batch.values():
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        return
    link.failures = 0
    link.last_error = None
    for name, futures in batch.items():
        for future in futures:
            if not future.done():
                future.set_result(answers[name])


def _note_failure(link: _Link, exc: UpsguardError, clock: Clock) -> None:
    link.failures += 1
    link.last_error = exc
    delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (link.failures - 1))
    link.retry_at = clock.monotonic() + delay


def parse_status(status: str) -> tuple[frozenset[UpsFlag], list[str]]:
    """NUT's ``ups.status`` words as flags, and the words upsguard does not know."""
    words = status.split()
    flags = frozenset(_FLAGS[w] for w in words if w in _FLAGS)
    return flags, [w for w in words if w not in _FLAGS]


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def reading_from_vars(ups: UpsName, at: datetime, variables: Mapping[str, str]) -> UpsReading:
    """Normalize ``upsc`` variables. ``WAIT`` (upsd has no data from the driver yet) is stale."""
    status = variables.get("ups.status", "")
    flags, unknown = parse_status(status)
    link = LinkState.STALE if "WAIT" in unknown or not status else LinkState.OK
    values = {attr: _number(variables.get(var)) for attr, var in _NUMBERS.items()}
    return UpsReading(
        ups=ups,
        at=at,
        flags=flags,
        charge_pct=values["charge_pct"],
        runtime_s=values["runtime_s"],
        load_pct=values["load_pct"],
        input_voltage=values["input_voltage"],
        link=link,
        raw=dict(variables),
    )
