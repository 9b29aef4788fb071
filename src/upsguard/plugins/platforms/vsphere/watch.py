"""One PropertyCollector watch shared by every waiter of a platform.

A single thread keeps a ``WaitForUpdatesEx`` long-poll open on a collector of
its own, whose filter covers every VM and host through a ContainerView. The
updates land in ``state`` (managed object id -> property -> value), and every
asyncio waiter whose condition became true is woken. So a hundred VMs being
waited for cost one open request, not a hundred polls.

With ``poll_s`` set, the thread instead reads with one ``RetrievePropertiesEx``
per interval: the objects being waited for, through a ListView that holds just
them (so a poll's request names no object: pyVmomi spends ~55 us building and
writing each object named), or, now and then and while nobody waits, every
object. vcsim recomputes a collector's whole filter for every single change,
which makes update waits quadratic there at a thousand VMs; one read per
interval stays linear.

Every value in ``state`` carries the start time of the read (or the return of
the update) it came from, so an older answer never overwrites a newer one.
``Fresh`` answers power-state checks with a read begun after the question, one
read for every target asked about at once: a stale watch can never make a VM
that is on look off.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from pyVmomi import vim, vmodl

from upsguard.errors import PlatformUnreachable, UpsguardError
from upsguard.plugins.platforms.vsphere.connection import Connection
from upsguard.plugins.platforms.vsphere.reads import (
    PC,
    Props,
    moid,
    read_objects,
    read_view,
    view_filter,
    wsdl_name,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

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
SMALL_POLL = 100  # ... unless they read this many objects or fewer
#: Fresh power-state checks per read: the first targets go on while the rest are read.
FRESH_CHUNK = 100
#: What a poll reads of the objects being waited for: the states wait_for decides on.
BUSY = {
    vim.VirtualMachine: ["runtime.powerState"],
    vim.HostSystem: ["runtime.powerState", "runtime.connectionState", "runtime.inMaintenanceMode"],
}
#: The same types by their WSDL names, as reads name them.
KINDS = {wsdl_name(kind): kind for kind in WATCHED}
Predicate = Callable[[dict[str, Any]], bool]
Run = Callable[[str, Callable[[], T]], Awaitable[T]]


class Watcher:
    """Keeps ``state`` current from one collector and wakes waiters when it changes."""

    def __init__(
        self, conn: Connection, loop: asyncio.AbstractEventLoop, poll_s: float | None = None
    ) -> None:
        self._conn = conn
        self._loop = loop
        self._poll_s = poll_s
        self.state: dict[str, Props] = {}
        self._as_of: dict[str, float] = {}  # ref -> when the read behind state[ref] began
        self._kinds: dict[str, str] = {}  # ref -> its type's WSDL name, from the full reads
        self._lock = threading.Lock()  # the watch thread and the fresh reads both write
        self._waiters: dict[int, tuple[str, Predicate, asyncio.Future[None]]] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._kick = threading.Event()  # a new waiter: poll now
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vsphere-watch", daemon=True)
        self.round_trips = 0

    def start(self, timeout: float = 60.0) -> None:
        """Start the thread and block until the first full update arrived."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise PlatformUnreachable(
                f"{self._conn.endpoint.label}: the first property update did not arrive "
                f"within {timeout:.0f}s"
            )
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()

    def join(self, timeout: float = 30.0) -> None:
        """Wait for the stopped thread (one long-poll at most) so that the connections it holds
        are back in the pool before the session drops them; blocks: call it off the loop."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    async def wait(self, ref: str, predicate: Predicate, timeout: float) -> bool:
        """True once ``predicate(state[ref])`` holds; False when ``timeout`` seconds pass first."""
        if predicate(self.state.get(ref, {})):
            return True
        future: asyncio.Future[None] = self._loop.create_future()
        key = next(self._ids)
        self._waiters[key] = (ref, predicate, future)
        self._kick.set()
        try:
            async with asyncio.timeout(timeout):
                await future
            return True
        except TimeoutError:
            return predicate(self.state.get(ref, {}))
        finally:
            self._waiters.pop(key, None)

    def _wake(self) -> None:
        for ref, predicate, future in list(self._waiters.values()):
            if not future.done() and predicate(self.state.get(ref, {})):
                future.set_result(None)

    def merge(
        self, found: dict[str, Props], began: float, gone: Iterable[str] = (), full: bool = False
    ) -> None:
        """Take what a read begun at ``began`` saw, where nothing newer is known.

        A full read replaces each object's properties and drops the objects it
        no longer saw; a partial one updates the properties it read.
        """
        with self._lock:
            for ref, props in found.items():
                if self._as_of.get(ref, float("-inf")) <= began:
                    self.state[ref] = props if full else {**self.state.get(ref, {}), **props}
                    self._as_of[ref] = began
            left = set(gone)
            if full:
                left |= self.state.keys() - found.keys()
            for ref in left:
                if self._as_of.get(ref, float("-inf")) <= began:
                    self.state.pop(ref, None)
                    self._as_of.pop(ref, None)

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
            except Exception as exc:  # the connection dropped, or the session (and the
                # collector with it) is gone: the connection logs in again by itself
                if self._stop.is_set():
                    return
                log.info("property watch restarting after %s", type(exc).__name__)
                self._stop.wait(1.0)

    def _watch(self) -> None:
        collector, view = self._conn.call(
            "create a property collector", lambda: _make_collector(self._conn.content)
        )
        try:
            version = ""
            options = PC.WaitOptions(maxWaitSeconds=MAX_WAIT_S)
            while not self._stop.is_set():
                self.round_trips += 1
                update = collector.WaitForUpdatesEx(version, options)
                if update is not None:
                    version = update.version
                    self._apply(update, time.monotonic())
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
        collector, view, waited_view = self._conn.call(
            "create a property collector", lambda: _make_views(self._conn.content)
        )
        listed: dict[str, Any] = {}  # what waited_view holds: ref -> its managed object
        try:
            polls = 0
            delay = interval
            while not self._stop.is_set():
                polls += 1
                waited = {ref for ref, _, _ in list(self._waiters.values())}
                before = {ref: self.state.get(ref) for ref in waited}
                began = time.monotonic()
                self.round_trips += 1
                if not waited or polls % FULL_EVERY == 0 or not waited <= self._kinds.keys():
                    seen = read_view(collector, view, WATCHED, self._conn.lean)
                    self._kinds = {ref: kind for ref, (kind, _) in seen.items()}
                    self.merge({ref: props for ref, (_, props) in seen.items()}, began, full=True)
                else:
                    if waited != listed.keys():  # the request names no object: the view does
                        self._relist(waited_view, listed, waited)
                    seen = read_view(collector, waited_view, BUSY, self._conn.lean)
                    self.merge({ref: props for ref, (_, props) in seen.items()}, began)
                self._loop.call_soon_threadsafe(self._wake)
                self._ready.set()
                if not self._waiters:  # idle: read seldom, but at once when someone waits
                    self._kick.wait(interval * IDLE_POLLS)
                    self._kick.clear()
                    delay = interval
                    continue
                # nothing moved: back off (up to BACKOFF x), a change or a new waiter resets;
                # never more than one poll per interval: while a thousand VMs are being asked
                # to stop, each new waiter would otherwise start a read of all the others
                # (a poll of a few objects costs next to nothing: it never backs off)
                moved = any(before[ref] != self.state.get(ref) for ref in waited)
                cap = interval * (BACKOFF if len(waited) > SMALL_POLL else 1)
                delay = interval if moved else min(delay * 1.5, cap)
                if self._kick.wait(delay):
                    self._kick.clear()
                    delay = interval
                    self._stop.wait(began + interval - time.monotonic())
        finally:
            for obj in (collector, view, waited_view):
                try:
                    obj.Destroy()
                except Exception as exc:  # best effort: the session may be gone
                    log.debug("cleanup of the poll objects failed: %s", exc)

    def _relist(self, waited_view: Any, listed: dict[str, Any], waited: set[str]) -> None:
        """Make the ListView of waited objects hold ``waited``, sending only the changes."""
        add = {ref: self._conn.ref(KINDS[self._kinds[ref]], ref) for ref in waited - listed.keys()}
        remove = [listed.pop(ref) for ref in listed.keys() - waited]
        # vSphere answers with the objects it no longer knows (deleted meanwhile): the next
        # full read drops them from the state
        unknown = {
            moid(obj) for obj in waited_view.ModifyListView(add=list(add.values()), remove=remove)
        }
        listed.update({ref: obj for ref, obj in add.items() if ref not in unknown})

    def _apply(self, update: Any, returned: float) -> None:
        """Apply one WaitForUpdatesEx answer; it tells the state as of its return."""
        with self._lock:
            for filter_update in update.filterSet or []:
                for obj in filter_update.objectSet or []:
                    ref = moid(obj.obj)
                    if self._as_of.get(ref, float("-inf")) > returned:
                        continue  # a read begun after this answer already told more
                    self._as_of[ref] = returned
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


class Fresh:
    """Power-state checks answered by a read begun after the question, shared by all askers.

    The executor checks every target before stopping it; a thousand checks
    asked in the same moment become a few reads of just those objects (run in
    the platform's threads, ``FRESH_CHUNK`` objects each, so that the first
    targets are stopped while the others are still read), whose answers also
    refresh the watch's ``state``.
    """

    def __init__(self, watcher: Watcher, conn: Connection, run: Run[Any]) -> None:
        self._watcher = watcher
        self._conn = conn
        self._run = run
        self._asked: dict[str, tuple[Any, list[asyncio.Future[Props]]]] = {}
        self._reading: asyncio.Task[None] | None = None
        self._local = threading.local()  # each worker thread's own PropertyCollector
        self.reads = 0

    async def props(self, obj: Any) -> Props:
        """The watched properties of the managed object ``obj`` as vSphere has them now."""
        future: asyncio.Future[Props] = asyncio.get_running_loop().create_future()
        self._asked.setdefault(moid(obj), (obj, []))[1].append(future)
        if self._reading is None or self._reading.done():
            # a task starts after the callbacks already queued: askers of this moment join
            self._reading = asyncio.create_task(self._read_all_asked())
        return await future

    async def _read_all_asked(self) -> None:
        while self._asked:
            asked, self._asked = self._asked, {}
            refs = list(asked)
            chunks = [refs[i : i + FRESH_CHUNK] for i in range(0, len(refs), FRESH_CHUNK)]
            await asyncio.gather(*(self._read({r: asked[r] for r in chunk}) for chunk in chunks))

    async def _read(self, asked: dict[str, tuple[Any, list[asyncio.Future[Props]]]]) -> None:
        """One read for these askers; each gets its answer, or the error (the executor retries)."""
        objects = [obj for obj, _ in asked.values()]
        began = time.monotonic()
        self.reads += 1
        try:
            found, gone = await self._run(
                f"read the power state of {len(objects)} objects",
                lambda: self._read_objects(objects),
            )
        except Exception as exc:
            for _, futures in asked.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            return
        self._watcher.merge(found, began, gone)
        for ref, (_, futures) in asked.items():
            for future in futures:
                if not future.done():
                    future.set_result(found.get(ref, {}))

    def _read_objects(self, objects: list[Any]) -> tuple[dict[str, Props], set[str]]:
        """Read with this thread's own PropertyCollector, made on first use.

        vCenter (and vcsim) serve one collector's requests one at a time: reads
        sharing the session's default collector would queue behind each other
        and behind the watch. A collector ends with its session: after a new
        login the old one is not found, and a new one is made.
        """
        for attempt in (1, 2):
            collector = getattr(self._local, "collector", None)
            if collector is None:
                collector = self._conn.content.propertyCollector.CreatePropertyCollector()
                self._local.collector = collector
            try:
                return read_objects(collector, objects, BUSY, self._conn.lean)
            except vmodl.fault.ManagedObjectNotFound as exc:
                if attempt == 2 or exc.obj is None or moid(exc.obj) != moid(collector):
                    raise
                self._local.collector = None
        raise AssertionError("unreachable")  # pragma: no cover


def _make_views(content: Any) -> tuple[Any, Any, Any]:
    """A PropertyCollector of the watch's own, a view of every VM and host, and a ListView
    (empty for now) of the objects being waited for."""
    collector = content.propertyCollector.CreatePropertyCollector()
    view = content.viewManager.CreateContainerView(content.rootFolder, list(WATCHED), True)
    return collector, view, content.viewManager.CreateListView(obj=[])


def _make_collector(content: Any) -> tuple[Any, Any]:
    """A PropertyCollector of the watch's own with a filter over a view of every VM and
    host, whose updates ``WaitForUpdatesEx`` returns."""
    collector = content.propertyCollector.CreatePropertyCollector()
    view = content.viewManager.CreateContainerView(content.rootFolder, list(WATCHED), True)
    collector.CreateFilter(view_filter(view, WATCHED), partialUpdates=True)
    return collector, view
