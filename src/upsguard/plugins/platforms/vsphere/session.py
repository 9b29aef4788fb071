"""A session with one endpoint (vCenter, or an ESXi host reached directly): calls, watch, inventory.

pyVmomi blocks, so its calls run in the platform's thread pool; the watch has a
thread of its own. The inventory read is kept for a few seconds and shared by
concurrent callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from upsguard.errors import PlatformUnreachable
from upsguard.plugins.platforms.vsphere.connection import Connection
from upsguard.plugins.platforms.vsphere.endpoint import Endpoint
from upsguard.plugins.platforms.vsphere.inventory import Snapshot, read_snapshot
from upsguard.plugins.platforms.vsphere.watch import Fresh, Watcher

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
        """``fn()`` in a worker thread, its pyVmomi faults mapped (``doing`` names it)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.conn.call, doing, fn)

    def ref(self, kind: Any, moid: str) -> Any:
        """The managed object ``moid`` of type ``kind`` on this session (no request)."""
        return self.conn.ref(kind, moid)

    async def open(self) -> None:
        """Log in and start the watch. Raises AuthenticationError, PlatformUnreachable."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.conn.open)
        if self._watcher is None:
            watcher = Watcher(self.conn, loop, self._poll_s)
            try:
                await loop.run_in_executor(self._pool, watcher.start)
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
        """Stop the watch and log out. Never raises."""
        loop = asyncio.get_running_loop()
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            self._fresh = None
            watcher.stop()
            await loop.run_in_executor(self._pool, watcher.join)
        await loop.run_in_executor(self._pool, self.conn.close)
