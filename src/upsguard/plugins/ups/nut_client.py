"""A small async client for NUT's network protocol (what upsd speaks), on asyncio streams.

Why our own and not a library's:

- PyNUTClient is blocking and reads an answer with no bound of size or time; bounding it
  meant overriding its name-mangled private reader.
- aionut (Home Assistant's async client, 4.3.4) covers ``LIST UPS/VAR/CMD``, ``INSTCMD`` and
  ``USERNAME``/``PASSWORD``, but has no ``STARTTLS``, no ``LOGIN``/``PRIMARY`` (the upsmon
  login that checks a password and makes upsd count us, so that an FSD from the primary is
  meant for us too) and no ``SET VAR``/``LIST RW`` (``ups.delay.shutdown`` is set before
  ``shutdown.return``). It opens its connection and sends its login inside private methods,
  so none of these can be added on its connection without its private names: STARTTLS must
  come before the login, and LOGIN on the connection that reads. It also retries every
  failed call once on a new connection, which doubles the wait on a silent server under our
  own backoff; decodes answers as ASCII and leaves ``\"`` escapes in values; and an
  answer past StreamReader's default 64 KiB limit escapes as a bare ``LimitOverrunError``
  with the connection left open. Using it would mean two clients for one server: aionut for
  a plain read and ``INSTCMD``, ours for everything else. One client of about 250 lines,
  docstrings included, reads better.

Bounds: every request, from sending it to the end of its answer, gets ``timeout_s``
(``asyncio.timeout``); an answer (a line, or all lines of a list) longer than
``MAX_ANSWER_BYTES`` ends the request, and the stream's ``limit`` keeps the buffer near that
size, so a server that trickles bytes or sends an endless line costs neither a hang nor
memory. After any error but an ``ERR`` answer the connection is in an unknown state: close
it and open a new one.

Quick ACKs: upsd writes a ``LIST VAR`` answer line by line; with Nagle on its side and
delayed ACKs on ours, every answer would wait about 40 ms for our ACK of its first line.
Sending a request puts a Linux socket in its request/response ("pingpong") mode, where
ACKs wait; setting ``TCP_QUICKACK`` right after the send (through the transport's public
socket) leaves that mode, and the kernel then ACKs each piece of the answer as we read
it, until the next send. So it is set once per request; bench/ups_poll.py measures what
it saves.

Arguments are sent quoted (upsd parses quotes and backslash escapes), so a password may hold
spaces or quotes; a line break in an argument is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

MAX_ANSWER_BYTES = 1 << 20
"""A LIST VAR of a large UPS is about 10 KiB; anything past 1 MiB is not NUT."""

_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
_ESCAPE = re.compile(r"\\(.)")
T = TypeVar("T")


#: ``ERR`` words that mean upsd refused who we are (or what we may do).
REFUSED = frozenset(
    {
        "ACCESS-DENIED",
        "USERNAME-REQUIRED",
        "PASSWORD-REQUIRED",
        "INVALID-USERNAME",
        "INVALID-PASSWORD",
    }
)
#: ``ERR`` words that concern one UPS whose data upsd does not have fresh.
STALE = frozenset({"DATA-STALE", "DRIVER-NOT-CONNECTED"})


class NutError(Exception):
    """The client's failures; the text reads after the server's name ("upsd H:P <text>")."""


class NutRefused(NutError):
    """upsd answered ``ERR <word>``: it understood and said no. The connection stays usable."""

    def __init__(self, request: str, word: str) -> None:
        super().__init__(f"answered ERR {word} to {request}")
        self.request = request
        self.word = word


class NotNut(NutError):
    """The answer is not NUT: bytes that are not text, a line we cannot parse, or too long."""


class NutClosed(NutError):
    """The server closed the connection in the middle of a request."""


class NutTimeout(NutError):
    """No complete answer within the timeout."""


class NutClient:
    """One connection to one upsd; one request at a time (callers may share it)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._socket = writer.get_extra_info("socket")
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(
        cls, host: str, port: int, timeout_s: float, tls: ssl.SSLContext | None = None
    ) -> NutClient:
        """Open a connection, and upgrade it with ``STARTTLS`` when ``tls`` is given.

        Raises ``OSError`` (``ssl.SSLError`` included) when it cannot, ``NutRefused`` when
        upsd will not start TLS (``FEATURE-NOT-CONFIGURED``: it has no certificate),
        ``NutTimeout`` when the connection or the handshake takes longer than ``timeout_s``.
        """
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port, limit=MAX_ANSWER_BYTES)
        except TimeoutError as exc:
            raise NutTimeout(f"did not answer within {timeout_s:g}s") from exc
        client = cls(reader, writer, timeout_s)
        if tls is not None:
            try:
                await client.simple("STARTTLS")
                async with asyncio.timeout(timeout_s):
                    await writer.start_tls(tls, server_hostname=host)
            except TimeoutError as exc:
                client.abort()
                raise NutTimeout(f"did not finish the TLS handshake in {timeout_s:g}s") from exc
            except BaseException:
                client.abort()
                raise
        return client

    async def authenticate(self, user: str, password: str) -> None:
        """``USERNAME`` and ``PASSWORD``; upsd checks them only at a privileged command."""
        await self.simple("USERNAME", user)
        await self.simple("PASSWORD", password)

    async def login(self, ups: str, primary: bool = False) -> None:
        """Log in like upsmon (``LOGIN``, then ``PRIMARY``, ``MASTER`` before NUT 2.8)."""
        await self.simple("LOGIN", ups)
        if primary:
            try:
                await self.simple("PRIMARY", ups)
            except NutRefused as exc:
                if exc.word != "UNKNOWN-COMMAND":
                    raise
                await self.simple("MASTER", ups)

    async def list_vars(self, ups: str) -> dict[str, str]:
        """Every variable of a UPS (``upsc``)."""
        return await self.list_values("VAR", ups)

    async def list_rw(self, ups: str) -> dict[str, str]:
        """The writable variables of a UPS (``upsrw``)."""
        return await self.list_values("RW", ups)

    async def list_ups(self) -> dict[str, str]:
        """Every UPS upsd serves, with its description (``upsc -l``, ``LIST UPS``). Needs no
        login: upsd answers it to anyone its LISTEN lets in."""
        return await self.list_values("UPS")

    async def set_var(self, ups: str, name: str, value: str) -> None:
        await self.simple("SET VAR", ups, name, value)

    async def instcmd(self, ups: str, command: str) -> None:
        await self.simple("INSTCMD", ups, command)

    async def simple(self, request: str, *args: str) -> str:
        """Send one request whose answer is one line starting with ``OK``; return that line."""

        async def ok(line: str) -> str:
            if not line.startswith("OK"):
                raise NotNut(f"answered something that is not NUT: '{_short(line)}'")
            return line

        return await self._ask(request, args, ok)

    async def list_values(self, kind: str, *ups: str) -> dict[str, str]:
        """``LIST <kind> [<ups>]`` whose items are ``<name> "<value>"`` (VAR, RW; UPS with no
        UPS named)."""
        values: dict[str, str] = {}
        for item in await self.list_items(kind, *ups):
            name, _, quoted = item.partition(" ")
            if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
                raise NotNut(f"answered a {kind} list that is not NUT")
            value = quoted[1:-1]
            values[name] = _ESCAPE.sub(r"\1", value) if "\\" in value else value
        return values

    async def list_items(self, kind: str, *ups: str) -> list[str]:
        """``LIST <kind> [<ups>]``: the text after ``<kind> [<ups>] `` on each line of the list
        (``ups`` is one UPS's name, or none for ``LIST UPS``)."""
        subject = " ".join([kind, *ups])
        begin, end, prefix = f"BEGIN LIST {subject}", f"END LIST {subject}", f"{subject} "

        async def items(first: str) -> list[str]:
            if first != begin:
                raise NotNut(f"answered something that is not NUT: '{_short(first)}'")
            lines = (await self._until(f"{end}\n".encode(), len(first) + 1))[:-1].split("\n")
            if lines[-1] != end or not all(line.startswith(prefix) for line in lines[:-1]):
                raise NotNut(f"answered a {kind} list that is not NUT")
            return [line[len(prefix) :] for line in lines[:-1]]

        return await self._ask(f"LIST {kind}", ups, items)

    async def close(self) -> None:
        """Say ``LOGOUT`` (upsd then stops counting us as a monitor) and close; never raises."""
        grace = min(self._timeout_s, 1.0)
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            async with asyncio.timeout(grace):
                self._writer.write(b"LOGOUT\n")
                await self._writer.drain()
        self._writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(grace):
                await self._writer.wait_closed()

    def abort(self) -> None:
        """Close at once, without LOGOUT: after a failure the connection's state is unknown."""
        self._writer.transport.abort()

    async def _ask(
        self, request: str, args: tuple[str, ...], rest: Callable[[str], Awaitable[T]]
    ) -> T:
        """Send ``request args``; ``rest`` reads the answer after its first line. The whole
        exchange gets the timeout; an ``ERR`` first line is ``NutRefused``."""
        line = " ".join([request, *map(_quoted, args)]) + "\n"
        async with self._lock:
            try:
                async with asyncio.timeout(self._timeout_s):
                    self._writer.write(line.encode("utf-8"))
                    self._quick_ack()
                    await self._writer.drain()
                    first = (await self._until(b"\n", 0)).rstrip("\r\n")
                    if first.startswith("ERR "):
                        raise NutRefused(request, first[4:].split(" ")[0])
                    return await rest(first)
            except TimeoutError as exc:
                raise NutTimeout(f"did not answer within {self._timeout_s:g}s") from exc

    async def _until(self, separator: bytes, used: int) -> str:
        """The answer's text up to and with ``separator``; ``used``: its bytes read before."""
        try:
            raw = await self._reader.readuntil(separator)
        except asyncio.LimitOverrunError as exc:
            raise NotNut(f"sent an answer longer than {MAX_ANSWER_BYTES} bytes") from exc
        except asyncio.IncompleteReadError as exc:
            raise NutClosed("closed the connection") from exc
        if used + len(raw) > MAX_ANSWER_BYTES:
            raise NotNut(f"sent an answer longer than {MAX_ANSWER_BYTES} bytes")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotNut("answered bytes that are not NUT text") from exc

    def _quick_ack(self) -> None:
        """Leave Linux's delayed-ACK mode for this answer (see the module docstring)."""
        if _QUICKACK is not None and self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


def _quoted(arg: str) -> str:
    if "\n" in arg or "\r" in arg:
        raise NutError("was not sent an argument holding a line break: check the site file")
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."
