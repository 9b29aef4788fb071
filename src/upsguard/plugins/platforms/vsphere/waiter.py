"""One PropertyCollector watch shared by every waiter of a platform.

A single thread keeps a ``WaitForUpdatesEx`` long-poll open on a collector of
its own, whose filter covers every VM and host through a ContainerView. The
updates land in ``state`` (managed object id -> property -> value), and every
asyncio waiter whose condition became true is woken. So a hundred VMs being
waited for cost one open request, not a hundred polls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from pyVmomi import vim, vmodl

from upsguard.errors import UpsguardError
from upsguard.plugins.platforms.vsphere.connection import Connection

PC: Any = vmodl.query.PropertyCollector  # pyVmomi's classes are untyped
log = logging.getLogger(__name__)

WATCHED = {
    vim.VirtualMachine: [
        "name",
        "runtime.powerState",
        "guest.toolsRunningStatus",
        "guest.toolsStatus",
    ],
    vim.HostSystem: [
        "name",
        "runtime.powerState",
        "runtime.connectionState",
        "runtime.inMaintenanceMode",
    ],
}
MAX_WAIT_S = 2  # how long one long-poll may stay open; bounds how long close() takes
Predicate = Callable[[dict[str, Any]], bool]


class Watcher:
    """Keeps ``state`` current from one collector and wakes waiters when it changes."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self.state: dict[str, dict[str, Any]] = {}
        self._waiters: list[tuple[str, Predicate, asyncio.Future[None]]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vsphere-watch", daemon=True)
        self.round_trips = 0

    def start(self, timeout: float = 60.0) -> None:
        """Start the thread and block until the first full update arrived."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the first PropertyCollector update did not arrive")
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._stop.set()

    async def wait(self, ref: str, predicate: Predicate, timeout: float) -> bool:
        """True once ``predicate(state[ref])`` holds; False when ``timeout`` seconds pass first."""
        if predicate(self.state.get(ref, {})):
            return True
        future: asyncio.Future[None] = self._loop.create_future()
        entry = (ref, predicate, future)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await future
            return True
        except TimeoutError:
            return predicate(self.state.get(ref, {}))
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def _wake(self) -> None:
        for ref, predicate, future in list(self._waiters):
            if not future.done() and predicate(self.state.get(ref, {})):
                future.set_result(None)

    # --- the watching thread --------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except UpsguardError as exc:
                if not self._ready.is_set():
                    self._error = exc
                    self._ready.set()
                    return
                log.warning("property watch interrupted: %s; retrying", exc)
                self._stop.wait(2.0)
            except Exception as exc:  # the session went away or the connection dropped
                if self._stop.is_set():
                    return
                log.info("property watch restarting after %s", type(exc).__name__)
                self._conn.close()
                self._stop.wait(1.0)

    def _watch(self) -> None:
        collector, view = self._conn.call("create a property collector", _make_collector)
        try:
            version = ""
            options = PC.WaitOptions(maxWaitSeconds=MAX_WAIT_S)
            while not self._stop.is_set():
                self.round_trips += 1
                update = collector.WaitForUpdatesEx(version, options)
                if update is not None:
                    version = update.version
                    self._apply(update)
                    self._loop.call_soon_threadsafe(self._wake)
                if not self._ready.is_set() and not getattr(update, "truncated", False):
                    self._ready.set()
        finally:
            for obj in (collector, view):
                try:
                    obj.Destroy()
                except Exception as exc:  # best effort: the session may be gone
                    log.debug("cleanup of watch objects failed: %s", exc)

    def _apply(self, update: Any) -> None:
        for filter_update in update.filterSet or []:
            for obj in filter_update.objectSet or []:
                ref = obj.obj._moId
                if obj.kind == "leave":
                    self.state.pop(ref, None)
                    continue
                props = dict(self.state.get(ref, {}))
                for change in obj.changeSet or []:
                    if change.op == "remove":
                        props.pop(change.name, None)
                    else:
                        props[change.name] = change.val
                self.state[ref] = props


def _make_collector(si: Any) -> tuple[Any, Any]:
    content = si.RetrieveContent()
    collector = content.propertyCollector.CreatePropertyCollector()
    view = content.viewManager.CreateContainerView(content.rootFolder, list(WATCHED), True)
    traverse = PC.TraversalSpec(name="view", path="view", skip=False, type=vim.view.ContainerView)
    spec = PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
        propSet=[PC.PropertySpec(type=kind, pathSet=props) for kind, props in WATCHED.items()],
    )
    collector.CreateFilter(spec, partialUpdates=True)
    return collector, view
