"""A UPS served by NUT's upsd, read through our own small async client (``nut_client``).

Why that client and not PyNUTClient or aionut: see ``nut_client``'s docstring.

Each source holds one connection to its upsd, as NUT's own upsmon opens one per MONITOR
line: two sources of one upsd never share state, and ``close()`` ends exactly one
connection. On each new connection the source, as the site file says, upgrades it with
STARTTLS, sends its user and password, and with ``monitor: secondary|primary`` logs in
like upsmon (``LOGIN``, ``PRIMARY``), which checks the password. With ``monitor: none`` a
plain read would never check it, so the first read checks it once with ``LOGIN`` on a
connection of its own, closed at once so that upsd does not count us as a monitor.

A failed connection is dropped and reopened with exponential backoff, counted on the
injected clock; while waiting, a read fails at once with the last error.

upsd answers ``ERR DATA-STALE`` (the driver stopped updating) and
``ERR DRIVER-NOT-CONNECTED`` (no driver) for one UPS while the server itself is
fine: those become a reading with ``link=stale``, never an exception.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from upsguard.clock import Clock
from upsguard.config.types import resolve_secret
from upsguard.config.ups import NutSettings, UpsConfig
from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    PermanentError,
    UpsguardError,
    UpsUnreachable,
    naming,
)
from upsguard.findings import Finding
from upsguard.models import LinkState, UpsFlag, UpsName, UpsReading
from upsguard.net import tls_context
from upsguard.plugins.ups.nut_checks import NutCheck
from upsguard.plugins.ups.nut_client import (
    MAX_ANSWER_BYTES,
    REFUSED,
    STALE,
    NutClient,
    NutError,
    NutRefused,
)
from upsguard.selftest import TestResult, from_nut

__all__ = ["MAX_ANSWER_BYTES", "NutSource", "parse_status", "reading_from_vars", "served_upses"]

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0

_PER_UPS = STALE | {"VAR-NOT-SUPPORTED"}
_FLAGS = {flag.value: flag for flag in UpsFlag}
_NUMBERS = {
    "charge_pct": "battery.charge",
    "runtime_s": "battery.runtime",
    "load_pct": "ups.load",
    "input_voltage": "input.voltage",
}
_DELAY_VAR = "ups.delay.shutdown"


class NutSource:
    """One UPS on an upsd, over one connection of its own (see the module docstring)."""

    def __init__(self, config: UpsConfig, clock: Clock) -> None:
        if config.nut is None:
            raise ConfigError(f"UPS {config.name}: the nut source needs a 'nut' section")
        self.name: UpsName = config.name
        self.config = config
        self.settings: NutSettings = config.nut
        self._clock = clock
        self._where = f"upsd {self.settings.host}:{self.settings.port}"
        self._timeout_s = self.settings.timeout.total_seconds()
        self._tls: ssl.SSLContext | None = None
        self._client: NutClient | None = None
        self._reading_lock = asyncio.Lock()  # two reads at once would open two connections
        self._checked = self.settings.user is None or self.settings.monitor != "none"
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: UpsUnreachable | None = None

    async def read(self) -> UpsReading:
        try:
            async with self._reading_lock:
                answer = await self._fetch()
        except UpsguardError as exc:
            raise _named(self.name, exc) from exc
        return self._reading(answer)

    async def command(self, name: str) -> None:
        if self.settings.user is None:
            raise ConfigError(f"UPS {self.name}: instant commands need a NUT 'user' with instcmds")
        policy = self.config.at_shutdown_end
        delay = policy.delay.total_seconds() if name == policy.command else None
        try:
            await self._command(name, delay)
        except UpsguardError as exc:
            raise _named(self.name, exc) from exc

    async def battery_test_result(self) -> TestResult:
        """``BatteryTests``: the driver's ``ups.test.result``."""
        reading = await self.read()
        if reading.link is not LinkState.OK:
            raise UpsUnreachable(f"UPS {self.name}: its data is {reading.link.value}")
        return from_nut(reading.raw.get("ups.test.result", ""))

    async def diagnose(self, commands: Sequence[str]) -> list[Finding]:
        """``UpsDiagnosis``: see ``nut_checks``."""
        check = NutCheck(self.name, self.config, self._where, commands)
        try:
            client = await self._connect()
        except UpsguardError as exc:
            return [check.unreachable(exc)]
        except (NutError, OSError) as exc:
            return [check.unreachable(self._error(exc))]
        try:
            return await check.run(client, self._connect)
        finally:
            await client.close()

    async def watch_for_changes(self, changed: Callable[[], None]) -> None:
        return None  # upsd only answers; its own changes go to upsmon's NOTIFYCMD (api /poll)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _abort(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.abort()

    async def _fetch(self) -> dict[str, str] | str:
        """Every variable of the UPS, or the NUT error word that concerns only this UPS."""
        self._respect_backoff()
        ups = self.settings.ups
        try:
            if not self._checked:
                await self._check_login()
            client = self._client or await self._open()
            try:
                answer: dict[str, str] | str = await client.list_vars(ups)
            except NutRefused as exc:
                if exc.word not in _PER_UPS:
                    raise
                answer = exc.word
        except (NutError, OSError) as exc:
            self._abort()
            raise self._failed(self._error(exc)) from exc
        except UpsguardError:
            self._abort()
            raise
        self._failures = 0
        self._last_error = None
        return answer

    async def _connect(self) -> NutClient:
        """A new connection, upgraded with STARTTLS and carrying the user, as configured."""
        s = self.settings
        password = self._password() if s.user is not None else None  # a ConfigError comes first
        client = await NutClient.connect(s.host, s.port, self._timeout_s, self._tls_context())
        try:
            if s.user is not None and password is not None:
                await client.authenticate(s.user, password)
        except BaseException:
            client.abort()
            raise
        return client

    async def _open(self) -> NutClient:
        client = await self._connect()
        try:
            if self.settings.monitor != "none" and self.settings.user is not None:
                await client.login(self.settings.ups, primary=self.settings.monitor == "primary")
        except BaseException:
            client.abort()
            raise
        self._client = client
        return client

    async def _check_login(self) -> None:
        """Check the credentials once with LOGIN, on a connection closed right after."""
        client = await self._connect()
        try:
            await client.login(self.settings.ups)
        finally:
            await client.close()
        self._checked = True

    async def _command(self, name: str, delay_s: float | None) -> None:
        """Send an instant command on a connection of its own (it needs the user's rights)."""
        ups = self.settings.ups
        try:
            client = await self._connect()
            try:
                if delay_s is not None and _DELAY_VAR in await client.list_rw(ups):
                    await client.set_var(ups, _DELAY_VAR, str(round(delay_s)))
                await client.instcmd(ups, name)
            finally:
                await client.close()
        except NutRefused as exc:
            if exc.word in REFUSED:
                raise AuthenticationError(
                    f"{self._where} refused '{name}' on UPS '{ups}' for user "
                    f"'{self.settings.user}' ({exc.word}): upsd.users must give it "
                    "'instcmds' (and 'actions = SET' for the delay)"
                ) from exc
            if exc.word in ("CMD-NOT-SUPPORTED", "UNKNOWN-UPS", "INVALID-ARGUMENT"):
                raise PermanentError(f"UPS '{ups}' on {self._where}: {name}: {exc.word}") from exc
            raise self._error(exc) from exc
        except (NutError, OSError) as exc:
            raise self._error(exc) from exc

    def _error(self, exc: NutError | OSError) -> UpsguardError:
        """The client's failure as the most specific upsguard error, in one line."""
        where, ups = self._where, self.settings.ups
        if isinstance(exc, NutRefused):
            if exc.request == "STARTTLS":
                return UpsUnreachable(
                    f"{where} does not offer STARTTLS ({exc.word}): "
                    "set CERTFILE or CERTPATH in upsd.conf"
                )
            if exc.word in REFUSED:
                return AuthenticationError(
                    f"{where} refused user '{self.settings.user}' for UPS '{ups}' ({exc.word}): "
                    "check the password file or variable, and that upsd.users gives this "
                    "user an 'upsmon' role"
                )
            if exc.word == "UNKNOWN-UPS":
                return ConfigError(f"{where} serves no UPS named '{ups}'")
            return UpsUnreachable(f"{where} {exc} for UPS '{ups}'")
        if isinstance(exc, ssl.SSLCertVerificationError):
            return UpsUnreachable(
                f"{where} has a TLS certificate we do not trust ({exc.verify_message}): "
                "check ca_file"
            )
        if isinstance(exc, ssl.SSLError):
            return UpsUnreachable(f"{where} failed the TLS handshake ({_short(exc)})")
        if isinstance(exc, NutError):
            return UpsUnreachable(f"{where} {exc}")
        return UpsUnreachable(f"{where} cannot be reached ({_short(exc)})")

    def _tls_context(self) -> ssl.SSLContext | None:
        """Verified TLS: the system's CAs, or only ``ca_file`` when given. Built once."""
        s = self.settings
        if not s.starttls or self._tls is not None:
            return self._tls
        try:
            self._tls = tls_context(True, s.ca_file)
        except ConfigError as exc:
            raise ConfigError(f"UPS {self.name}: {exc}") from exc
        return self._tls

    def _password(self) -> str:
        s = self.settings
        secret = resolve_secret(f"UPS {self.name}: NUT password", s.password_file, s.password_env)
        if secret is None:
            raise ConfigError(
                f"UPS {self.name}: NUT user '{s.user}' needs password_file or password_env"
            )
        return secret

    def _respect_backoff(self) -> None:
        wait = self._retry_at - self._clock.monotonic()
        if self._last_error is not None and wait > 0:
            raise UpsUnreachable(str(self._last_error), retry_after=wait)  # the same error: no news

    def _failed(self, error: UpsguardError) -> UpsguardError:
        """Count a failure to reach upsd; the next try waits 0.5 s, 1 s, 2 s ... up to 10 s."""
        if isinstance(error, UpsUnreachable):
            self._failures += 1
            self._last_error = error
            delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self._failures - 1))
            self._retry_at = self._clock.monotonic() + delay
        return error

    def _reading(self, answer: dict[str, str] | str) -> UpsReading:
        now = self._clock.now()
        if isinstance(answer, str):
            return UpsReading(
                ups=self.name, at=now, link=LinkState.STALE, raw={"nut.error": answer}
            )
        return reading_from_vars(self.name, now, answer)


async def served_upses(host: str, port: int, timeout_s: float) -> dict[str, str]:
    """Every UPS the upsd at ``host:port`` serves, name -> description (``upsc -l``), read
    on a connection of its own, without login, in clear (what ``upsguard init`` lists).

    Raises ``UpsUnreachable`` naming upsd's address when it cannot be reached or does not
    answer NUT.
    """
    where = f"upsd {host}:{port}"
    try:
        client = await NutClient.connect(host, port, timeout_s)
        try:
            return await client.list_ups()
        finally:
            await client.close()
    except NutError as exc:
        raise UpsUnreachable(f"{where} {exc}") from exc
    except OSError as exc:
        raise UpsUnreachable(f"{where} cannot be reached ({_short(exc)})") from exc


def _named(ups: UpsName, exc: UpsguardError) -> UpsguardError:
    """The same error with the site's UPS name in front, so that the line says which UPS (an
    error raised here that names it already, a missing password or a bad CA file, once)."""
    message = naming(f"UPS {ups}", exc)
    if isinstance(exc, ConfigError):
        return ConfigError(message)
    if isinstance(exc, UpsUnreachable):
        return UpsUnreachable(message, retry_after=exc.retry_after)
    if isinstance(exc, AuthenticationError):
        return AuthenticationError(message)
    if isinstance(exc, PermanentError):
        return PermanentError(message)
    return UpsguardError(message)


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


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
