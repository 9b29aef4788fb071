"""Acting without a running service: the override CLI's fallback, after a confirmation.

Reads come from the journal (and one fresh poll of each UPS for ``status``);
``hold``/``release`` are journaled and taken up by the service at its next
start; ``trigger`` builds the same ``Service`` in this process (journal,
plugins, resume of an interrupted run first), runs the plan to its end and polls once, so
the journaled phase moves on from the run as the service's would (a finished shutdown is
``down``, a finished startup ``normal``);
``abort`` closes unfinished runs so the next start does not resume them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from upsguard.clock import SystemClock
from upsguard.config.site import SiteConfig
from upsguard.controller.commands import Abort, Hold, Release
from upsguard.controller.service import Service
from upsguard.controller.status import offline_status
from upsguard.errors import PermanentError
from upsguard.events import Event, OverrideApplied, describe
from upsguard.journal import Journal
from upsguard.journal.file import journal_exists
from upsguard.models import UpsName
from upsguard.plugins.registry import build_ups_sources
from upsguard.policies.watch import UpsWatch
from upsguard.runs import RunOutcome
from upsguard.status import SiteStatus


def open_journal(site: SiteConfig) -> Journal:
    """The journal, created when it is not there yet: for the commands that write to it."""
    return Journal(site.journal, site.service.readings_every)


def read_journal(site: SiteConfig, hint: str = "") -> Journal:
    """The journal as it is, for the commands that only read it (``status``, ``history``,
    ``events``): they create nothing, neither the file nor its folder. None there is one
    line (``PermanentError``), with ``hint`` after it."""
    if not journal_exists(site.journal):
        raise PermanentError(
            f"journal {site.journal} does not exist yet: the service has not run with this "
            f"site file (is -c the site file it runs with?){hint}"
        )
    return Journal(site.journal, site.service.readings_every, read_only=True)


async def status(site: SiteConfig) -> SiteStatus:
    """The journal's word, with one fresh poll of each UPS (one that cannot be read is
    shown with its error: status must show every UPS, reachable or not)."""
    journal = read_journal(site, "; 'upsguard ups status' reads the UPSes without it")
    try:
        return offline_status(site, journal, await _poll_once(site))
    finally:
        journal.close()


async def _poll_once(site: SiteConfig) -> dict[UpsName, UpsWatch]:
    clock = SystemClock()
    configs = {u.name: u for u in site.ups}
    watches = {}
    for name, source in build_ups_sources(site, clock).items():
        watch = UpsWatch.for_config(source, configs[name], clock)
        try:
            await watch.poll()  # never raises: a UPS out of reach is a lost reading
        finally:
            await source.close()
        watches[name] = watch
    return watches


def hold(site: SiteConfig, who: str, reason: str, release: bool = False) -> str:
    """Journal a hold (or its release) for the service's next start; returns the reason as
    journaled. The request is read by ``commands``' rules, as the service's would be: who
    and why cleaned (a line break or an escape sequence in a reason, or in ``$SUDO_USER``,
    would forge a line of ``history`` or of a terminal), and a hold needs a reason."""
    order = Release.of(who, reason) if release else Hold.of(who, reason)
    journal = open_journal(site)
    try:
        action = "release" if release else "hold"
        detail = "while the service was stopped"
        journal.write.record(
            OverrideApplied(datetime.now(UTC), order.who, action, order.reason, detail)
        )
    finally:
        journal.close()
    return reason


def abort(site: SiteConfig, who: str, reason: str) -> list[str]:
    order = Abort.of(who, reason)
    who, reason = order.who, order.reason
    journal = open_journal(site)
    try:
        now = datetime.now(UTC)
        closed = []
        for run in journal.write.reap(now):
            journal.write.close_run(
                run.id, now, RunOutcome.ABORTED, f"aborted by {who} while stopped"
            )
            closed.append(run.id)
        detail = ", ".join(closed) or "nothing unfinished"
        journal.write.record(OverrideApplied(now, who, "abort", reason, detail))
        hold_reason = f"abort by {who}: {reason}"
        journal.write.record(OverrideApplied(now, who, "hold", hold_reason, "implied by abort"))
        return closed
    finally:
        journal.close()


async def trigger(
    site: SiteConfig,
    who: str,
    direction: str,
    only: Sequence[str],
    reason: str,
    show: Callable[[str], None],
) -> int:
    """Run the plan here and now; returns 0 when every step ended well. ``who``, ``only``
    and ``reason`` are read by ``commands``' rules, as the service reads them."""
    svc = Service(site, log_events=False)

    def printer(event: Event) -> None:
        text = describe(event)
        if text is not None:
            show(f"{event.at:%H:%M:%S}  {text}")

    svc.bus.subscribe(printer)
    try:
        await svc.open()
        if svc.resumed:
            show(f"finishing the interrupted run {svc.resumed} first")
            await svc.controller.wait_idle()
        answer = await svc.overrides.trigger(who, direction, only, reason)
        result = await svc.controller.wait_idle()
        await svc.poll_now()  # the phase moves on from the run's end, as the service's would
        ok = result is not None and result.run.id == answer.run
        return 0 if ok and result is not None and result.outcome is RunOutcome.DONE else 1
    finally:
        await svc.close()
