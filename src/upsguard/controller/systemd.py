"""What the service tells systemd (sd_notify(3)): ready, stopping, and that the power watch
is alive.

The unit is ``Type=notify`` with ``WatchdogSec=``: systemd then passes ``WATCHDOG_USEC`` and
restarts the service when no ``WATCHDOG=1`` came within that time. The power watch pets it
(``Watchdog.pet``) on each pass of its loop, so a watch wedged in a poll stops petting, and
systemd's restart brings a fresh process that resumes the run from the journal, as NUT's
upsmon is watched. Outside systemd (no ``NOTIFY_SOCKET``) every call here does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)


def notify(message: str) -> None:
    """Send ``message`` (``READY=1``, ``STOPPING=1``, ``WATCHDOG=1``) to systemd; a no-op
    outside systemd, and a failed send is no reason to stop watching the power."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.debug("sd_notify: %s", exc)


@dataclass(frozen=True)
class Watchdog:
    """systemd's watchdog on this process: ``pet`` at least every ``every_s``."""

    every_s: float
    """Half of ``WatchdogSec=``, as sd_watchdog_enabled(3) advises."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Watchdog | None:
        """The watchdog systemd set for this process, or None: no ``WATCHDOG_USEC`` (or not a
        positive number), or a ``WATCHDOG_PID`` naming another process (a child that
        inherited the environment is not the one watched)."""
        env = os.environ if environ is None else environ
        pid = env.get("WATCHDOG_PID")
        if pid and pid != str(os.getpid()):
            return None
        try:
            usec = int(env.get("WATCHDOG_USEC", ""))
        except ValueError:
            return None
        return cls(usec / 2_000_000) if usec > 0 else None

    def pet(self) -> None:
        notify("WATCHDOG=1")
