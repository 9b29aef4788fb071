"""A session with one endpoint (vCenter, or an ESXi host reached directly): calls, watch, inventory.

pyVmomi blocks, so its calls run in a thread pool; the watch has a thread of its
own. The inventory read is kept for a few seconds and shared by concurrent callers.

A session may be given ``silent_after``: a call (or a login) that gets no answer
within it is abandoned as ``PlatformUnreachable`` and ``on_silent`` is told. A
vCenter that hangs (alive, but answering nothing) otherwise holds each call for
pyVmomi's socket timeout times its attempts; the thread stays blocked until then,
which is why vCenter's session has a pool of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from upsguard.config.types import format_duration
from upsguard.errors import PlatformUnreachable
from upsguard.plugins.platforms.vsphere.connection import Connection
from upsguard.plugins.platforms.vsphere.endpoint import Endpoint
from upsguard.plugins.platforms.vsphere.inventory import Snapshot, read_snapshot
from upsguard.plugins.platforms.vsphere.watch import Fresh, Watcher

log = logging.getLogger(__name__)
T = TypeVar("T")
SNAPSHOT_TTL_S = 5.0
#: Kept-alive connections beyond the worker threads: the watch and the fresh reads.
SPARE_CONNECTIONS = 4


class Session:
    """One logged-in endpoint with its watch and its last inventory read."""

    def __init__(
        self,
        endpoint: Endpoint,
        pool: ThreadPoolExecutor,
        workers: int,
        poll_s: float | None = None,
        silent_after: float | None = None,
        on_silent: Callable[[], None] | None = None,
    ) -> None:
        # a kept-alive connection for every worker thread, the watch and the fresh reads:
        # pyVmomi closes what is returned beyond its pool, and a new TLS handshake is dear
        self.conn = Connection(endpoint, workers + SPARE_CONNECTIONS)
        self._pool = pool
        self._poll_s = poll_s
        self._watcher: Watcher | None = None
        self._fresh: Fresh | None = None
        self._snapshot: Snapshot | None = None
        self._snapshot_at = float("-inf")
        self._reading = asyncio.Lock()  # concurrent callers share one read
        self._silent_after = silent_after
        self._on_silent = on_silent

    @property
    def label(self) -> str:
        return self.conn.endpoint.label

    @property
    def is_open(self) -> bool:
        return self._watcher is not None

    @property
    def watcher(self) -> Watcher:
        """The watch of every VM's and host's power and Tools state (after ``open``)."""
        if self._watcher is None:
            raise PlatformUnreachable(f"{self.label}: not connected")
        return self._watcher

    @property
    def fresh(self) -> Fresh:
        """Reads of power states begun after the question (after ``open``)."""
        if self._fresh is None:
            raise PlatformUnreachable(f"{self.label}: not connected")
        return self._fresh

    async def run(self, doing: str, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread, its pyVmomi faults mapped (``doing`` names it).

        Raises ``PlatformUnreachable`` when it gets no answer within ``silent_after``."""
        loop = asyncio.get_running_loop()
        return await self._bounded(
            doing, loop.run_in_executor(self._pool, self.conn.call, doing, fn)
        )

    async def _bounded(self, doing: str, answer: Awaitable[T]) -> T:
        """``answer``, or ``PlatformUnreachable`` once the endpoint was silent for too long."""
        if self._silent_after is None:
            return await answer
        try:
            async with asyncio.timeout(self._silent_after):
                return await answer
        except TimeoutError:
            if self._on_silent is not None:
                self._on_silent()
            raise PlatformUnreachable(
                f"{self.label}: no answer within {format_duration(self._silent_after)} (to {doing})"
            ) from None

    def ref(self, kind: Any, moid: str) -> Any:
        """The managed object ``moid`` of type ``kind`` on this session (no request)."""
        return self.conn.ref(kind, moid)

    async def open(self) -> None:
        """Log in and start the watch. Raises AuthenticationError, PlatformUnreachable."""
        loop = asyncio.get_running_loop()
        await self._bounded("log in", loop.run_in_executor(self._pool, self.conn.open))
        if self._watcher is None:
            watcher = Watcher(self.conn, loop, self._poll_s)
            try:
                await self._bounded(
                    "start the property watch", loop.run_in_executor(self._pool, watcher.start)
                )
            except BaseException:
                watcher.stop()
                raise
            self._watcher = watcher
            self._fresh = Fresh(watcher, self.conn, self.run)

    async def inventory(
        self, now: float, fresh: bool = False, max_age: float = SNAPSHOT_TTL_S
    ) -> Snapshot:
        """The inventory, read again when older than ``max_age`` seconds or when ``fresh``."""
        async with self._reading:
            stale = self._snapshot is None or now - self._snapshot_at > max_age
            if self._snapshot is None or stale or (fresh and self._snapshot_at < now):
                self._snapshot = await self.run(
                    "read the inventory", lambda: read_snapshot(self.conn.content)
                )
                self._snapshot_at = now
            return self._snapshot

    async def close(self) -> None:
        """Stop the watch and log out, each within ``silent_after``. Never raises."""
        watcher, self._watcher = self._watcher, None
        self._fresh = None
        if watcher is not None:
            watcher.stop()

        def finish() -> None:
            # one after the other, even when no longer waited for: the watch's connection
            # must be back before the session drops them
            if watcher is not None:
                watcher.join()
            self.conn.close()

        await self._quietly(asyncio.get_running_loop().run_in_executor(self._pool, finish))

    async def _quietly(self, step: Awaitable[None]) -> None:
        """A step of closing, not waited for beyond ``silent_after`` (a hung endpoint)."""
        try:
            async with asyncio.timeout(self._silent_after):
                await step
        except TimeoutError:
            log.info("%s: no answer while closing; left", self.label)
