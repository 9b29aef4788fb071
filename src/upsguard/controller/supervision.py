"""The service's long-running tasks, each under one guard (as kopf's ``aiotasks.guard``).

A loop of the service that raises, or ends while the service is not stopping (a cancellation
that leaked out of a library and that nothing asked for included), has stopped
doing its part (polling, reloading, renewing the pair's lease) and nothing would say so
until the stop, if ever. The guard says it once (a journaled, notified error) and stops the
service: ``upsguard run`` exits non-zero and systemd starts it again (``Restart=always``),
with its journal to resume from. A service with a dead loop is worse than one restarting.

Tasks that may end on their own are not for the guard: a UPS's change channel (losing it
only means waiting for the next poll) and the pair's one-off jobs (a take-over).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from upsguard.errors import UpsguardError

log = logging.getLogger(__name__)


class Supervisor:
    """Starts the guarded tasks; the first one that fails sets ``stop`` and is ``failed``."""

    def __init__(self, stop: asyncio.Event, say: Callable[[str], None]) -> None:
        """``say``: the one line a failure is told in (journaled, notified, logged)."""
        self._stop = stop
        self._say = say
        self.failed: str | None = None
        """Why the service stopped on its own: the first task that failed, and how."""

    def start(self, job: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return asyncio.create_task(self._guard(job, name), name=name)

    async def _guard(self, job: Coroutine[Any, Any, None], name: str) -> None:
        try:
            await job
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling() == 0:  # not the service stopping
                self._failed(f"{name} failed: ended by a cancellation nothing asked for")
            raise
        except Exception as exc:  # the guard's purpose: no loop dies unheard
            if not isinstance(exc, UpsguardError):
                log.exception("%s failed", name)
            what = str(exc) if isinstance(exc, UpsguardError) else f"{type(exc).__name__}: {exc}"
            self._failed(f"{name} failed: {what}")
        else:
            if not self._stop.is_set():
                self._failed(f"{name} ended")

    def _failed(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
        self._say(f"{why}: the service stops (systemd starts it again)")
        self._stop.set()
