"""One PropertyCollector watch shared by every waiter of a platform.

A single thread keeps a ``WaitForUpdatesEx`` long-poll open on a collector of
its own, whose filter covers every VM and host through a ContainerView. The
updates land in ``state`` (managed object id -> property -> value), and every
asyncio waiter whose condition became true is woken. So a hundred VMs being
waited for cost one open request, not a hundred polls.

With ``poll_s`` set, the thread instead reads the same properties of the whole
inventory with one ``RetrievePropertiesEx`` per interval. vcsim recomputes a
collector's whole filter for every single change, which makes update waits
quadratic there at a thousand VMs; one read per interval stays linear.
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
        "runtime.powerState",
        "guest.toolsRunningStatus",
        "guest.toolsStatus",
    ],
    vim.HostSystem: [
        "runtime.powerState",
        "runtime.connectionState",
        "runtime.inMaintenanceMode",
    ],
}
MAX_WAIT_S = 2  # how long one long-poll may stay open; bounds how long close() takes
IDLE_POLLS = 10  # with nobody waiting, polls are this many intervals apart
FULL_EVERY = 20  # while some wait, every this many polls reads everything, else only them
BACKOFF = 2  # while nothing changes, polls slow down to this many intervals apart
#: What a poll reads of the objects being waited for: the states wait_for decides on.
BUSY = {
    vim.VirtualMachine: ["runtime.powerState"],
    vim.HostSystem: ["runtime.powerState", "runtime.connectionState", "runtime.inMaintenanceMode"],
}
Predicate = Callable[[dict[str, Any]], bool]


class Watcher:
    """Keeps ``state`` current from one collector and wakes waiters when it changes."""

    def __init__(
        self, conn: Connection, loop: asyncio.AbstractEventLoop, poll_s: float | None = None
    ) -> None:
        self._conn = conn
        self._loop = loop
        self._poll_s = poll_s
        self.state: dict[str, dict[str, Any]] = {}
        self._waiters: list[tuple[str, Predicate, asyncio.Future[None]]] = []
        self._stop = threading.Event()
        self._kick = threading.Event()  # a new waiter: poll now
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._session: Any = None  # the login the current watch runs in
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
        self._kick.set()

    async def wait(self, ref: str, predicate: Predicate, timeout: float) -> bool:
        """True once ``predicate(state[ref])`` holds; False when ``timeout`` seconds pass first."""
        if predicate(self.state.get(ref, {})):
            return True
        future: asyncio.Future[None] = self._loop.create_future()
        entry = (ref, predicate, future)
        self._waiters.append(entry)
        self._kick.set()
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
                if self._poll_s is None:
                    self._watch()
                else:
                    self._poll(self._poll_s)
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
                self._conn.forget(self._session)
                self._stop.wait(1.0)

    def _watch(self) -> None:
        self._session = self._conn.si
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

    def _poll(self, interval: float) -> None:
        self._session = self._conn.si
        content = self._conn.call("read service content", lambda si: si.RetrieveContent())
        view = content.viewManager.CreateContainerView(content.rootFolder, list(WATCHED), True)
        try:
            spec = _filter_spec(view)
            kinds: dict[str, Any] = {}
            polls = 0
            delay = interval
            while not self._stop.is_set():
                self.round_trips += 1
                polls += 1
                before = self.state
                waited = [(ref, kinds.get(ref)) for ref, _, _ in list(self._waiters)]
                if not waited or polls % FULL_EVERY == 0 or any(k is None for _, k in waited):
                    self.state, kinds = _read_all(content.propertyCollector, spec)
                else:
                    fresh = _read_some(content.propertyCollector, waited, view._stub)
                    merged = dict(before)
                    for ref, props in fresh.items():
                        merged[ref] = {**merged.get(ref, {}), **props}
                    self.state = merged
                self._loop.call_soon_threadsafe(self._wake)
                self._ready.set()
                if not self._waiters:  # idle: read seldom, but at once when someone waits
                    self._kick.wait(interval * IDLE_POLLS)
                    self._kick.clear()
                    delay = interval
                    continue
                # nothing moved: back off (up to BACKOFF x), a change or a new waiter resets
                moved = any(before.get(r) != self.state.get(r) for r, _ in waited)
                delay = interval if moved else min(delay * 1.5, interval * BACKOFF)
                if self._kick.wait(delay):
                    self._kick.clear()
                    delay = interval
        finally:
            try:
                view.Destroy()
            except Exception as exc:  # best effort: the session may be gone
                log.debug("cleanup of the poll view failed: %s", exc)

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


def _filter_spec(view: Any) -> Any:
    traverse = PC.TraversalSpec(name="view", path="view", skip=False, type=vim.view.ContainerView)
    return PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
        propSet=[PC.PropertySpec(type=kind, pathSet=props) for kind, props in WATCHED.items()],
    )


def _make_collector(si: Any) -> tuple[Any, Any]:
    content = si.RetrieveContent()
    collector = content.propertyCollector.CreatePropertyCollector()
    view = content.viewManager.CreateContainerView(content.rootFolder, list(WATCHED), True)
    collector.CreateFilter(_filter_spec(view), partialUpdates=True)
    return collector, view


def _read_all(collector: Any, spec: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every watched object's properties, and its type, in one RetrievePropertiesEx."""
    state: dict[str, dict[str, Any]] = {}
    kinds: dict[str, Any] = {}
    for obj in _retrieve(collector, spec):
        state[obj.obj._moId] = {p.name: p.val for p in obj.propSet or []}
        kinds[obj.obj._moId] = type(obj.obj)
    return state, kinds


def _read_some(collector: Any, refs: list[tuple[str, Any]], stub: Any) -> dict[str, dict[str, Any]]:
    """The deciding states of just the waited-for objects, in one RetrievePropertiesEx."""
    spec = PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=kind(ref, stub), skip=False) for ref, kind in set(refs)],
        propSet=[PC.PropertySpec(type=kind, pathSet=props) for kind, props in BUSY.items()],
    )
    return {
        obj.obj._moId: {p.name: p.val for p in obj.propSet or []}
        for obj in _retrieve(collector, spec)
    }


def _retrieve(collector: Any, spec: Any) -> list[Any]:
    objects: list[Any] = []
    result = collector.RetrievePropertiesEx([spec], PC.RetrieveOptions(maxObjects=5000))
    while result is not None:
        objects.extend(result.objects or [])
        if not result.token:
            break
        result = collector.ContinueRetrievePropertiesEx(result.token)
    return objects
