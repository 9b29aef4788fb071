"""Text for people: ``status``, ``history`` and ``events`` as the override CLI prints them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from upsguard.models import LinkState
from upsguard.status import (
    CacheStatus,
    Countdown,
    FeedStatus,
    LastRun,
    PairStatus,
    RunningStep,
    RunStatus,
    SiteStatus,
    UpsStatus,
)
from upsguard.units import format_bytes, format_duration

if TYPE_CHECKING:
    from upsguard.controller.commands import History


def _dur(seconds: float | None) -> str:
    return "?" if seconds is None else format_duration(seconds)


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def status_text(st: SiteStatus) -> str:
    svc = st.service
    lines = [f"site {st.site}: phase {st.phase.value}" + _since(st.phase_since)]
    if not svc.running:
        lines.append(f"service: NOT RUNNING (from the journal {svc.journal})")
    else:
        resumed = f", resumed run {svc.resumed}" if svc.resumed else ""
        lines.append(f"service: pid {svc.pid} since {_at(svc.since)}{resumed}")
    if st.held is not None:
        who = f" by {st.held.who}" if st.held.who else ""
        lines.append(f"HOLD{who}: {st.held.reason} (automatic actions wait, down to the floor)")
    if st.at_floor:
        lines.append("AT THE CRITICAL FLOOR: nothing is waited for")
    lines += [f"ALERT: {alert.text}" for alert in st.alerts]
    lines += _pair_lines(st.ha)
    lines += _ups_lines(st.ups)
    lines += [_feed_line(feed) for feed in st.feeds]
    lines += _countdown_lines(st.countdown)
    lines += _run_lines(st.run, st.last_run)
    if st.unfinished_runs:
        lines.append(
            "unfinished runs (resumed at the next start): " + ", ".join(st.unfinished_runs)
        )
    lines += _cache_lines(st.caches)
    return "\n".join(lines)


def _feed_line(feed: FeedStatus) -> str:
    """The feed's state in one word (in capitals when it needs a person), its quorum, and
    for a feed that cannot be read, which UPS and why: unknown is never shown as ok."""
    state = feed.state if feed.state in ("online", "degraded") else feed.state.upper()
    if feed.why:
        state += f" ({feed.why})"
    counted = (
        f" ({feed.unknown} of them unread, counted as supplying)"
        if feed.unknown and not feed.at_risk
        else ""
    )
    runtime = f", runtime {_dur(feed.runtime_s)}" if feed.runtime_s is not None else ""
    return f"  feed {feed.name}: {state}, {feed.online}/{feed.needed} supplying{counted}{runtime}"


def unread(st: SiteStatus) -> bool:
    """A UPS that cannot be read now, or a feed that is unknown for it: ``status`` then ends
    non-zero, as ``ups status`` does."""
    upses = any(not u.polled or u.link is not LinkState.OK for u in st.ups)
    return upses or any(f.state == "unknown" for f in st.feeds)


def _pair_lines(pair: PairStatus | None) -> list[str]:
    """Who leads, since when its lease was renewed, its fencing token, and what this
    controller last read of the shared ledger (the standby's view of the leader's run)."""
    if pair is None:
        return []
    term = f", term {pair.token}" if pair.token is not None else ""
    if pair.role == "leader":
        age = "?" if pair.lease_age_s is None else f"{pair.lease_age_s:.1f}s"
        head = f"pair: {pair.me} leads{term}, lease renewed {age} ago (ttl {pair.lease_ttl_s:g}s)"
    elif pair.role == "finishing_alone":
        head = f"pair: {pair.me} FINISHES ALONE (without etcd){term}"
    else:
        leader = pair.leader or "nobody"
        head = f"pair: {pair.me} is {pair.role.upper()}; {leader} leads{term}"
    lines = [head]
    if pair.store_silent_s is not None:
        lines.append(f"  etcd silent for {pair.store_silent_s:.1f}s")
    if pair.seen_age_s is not None:
        run = (
            f"run {pair.shared_run}, {pair.shared_steps_done} step(s) done"
            if pair.shared_run is not None
            else "no run in progress"
        )
        lines.append(f"  shared ledger (read {pair.seen_age_s:.1f}s ago): {run}")
    lines += _others_lines(pair)
    if pair.alone is not None:
        lines.append(f"  finishing alone: {pair.alone}")
    if pair.detail:
        lines.append(f"  {pair.detail}")
    return lines


def _others_lines(pair: PairStatus) -> list[str]:
    """What the other controller reads, beside this one's own UPS lines; how old that is,
    and, when there is nothing to show, why (never as if the two agreed)."""
    if pair.others_age_s is None:
        return ["  the other controller's readings: not exchanged yet (etcd has not answered)"]
    age = f"{pair.others_age_s:.1f}s ago"
    if pair.others_age_s > pair.lease_ttl_s:
        age += " (etcd silent since: they may have changed)"
    if not pair.others:
        return [
            f"  the other controller publishes no readings (stopped, or cut off from etcd; {age})"
        ]
    lines = []
    for view in pair.others:
        lines.append(f"  {view.name} ({view.role}) reads, as exchanged {age}:")
        for ups in view.ups:
            figures = (
                f", charge {_pct(ups.charge_pct)}, runtime {_dur(ups.runtime_s)}"
                if ups.charge_pct is not None or ups.runtime_s is not None
                else ""
            )
            why = f" ({ups.why})" if ups.why else ""
            lines.append(f"    UPS {ups.name}: {ups.word}{figures}{why}")
    return lines


def _at(at: datetime | None) -> str:
    return "?" if at is None else at.astimezone(UTC).isoformat(timespec="seconds")


def _since(at: datetime | None) -> str:
    return f" since {_at(at)}" if at else ""


def _ups_lines(upses: list[UpsStatus]) -> list[str]:
    lines = []
    for ups in upses:
        if not ups.polled:
            lines.append(f"  UPS {ups.name}: not read yet" + _error(ups.error))
            continue
        link = ups.link.value if ups.link else "?"
        age = "never read" if ups.age_s is None else f"{_dur(ups.age_s)} old"
        link_text = "" if ups.link is LinkState.OK else f", link {link} ({age})"
        drain = (
            f", draining {ups.depletion_pct_per_min:.1f} %/min" if ups.depletion_pct_per_min else ""
        )
        lines.append(
            f"  UPS {ups.name}: {ups.status or '-'}, charge {_pct(ups.charge_pct)}, "
            f"runtime {_dur(ups.runtime_s)}{drain}{link_text}" + _error(ups.error)
        )
    return lines


def _error(error: str | None) -> str:
    return f" [{error}]" if error else ""


def _countdown_lines(countdown: Countdown | None) -> list[str]:
    if countdown is None or not countdown.on_battery:
        return []
    spare = "" if countdown.spare_s is None else f", spare {_signed(countdown.spare_s)}"
    lines = [
        f"runtime left {_dur(countdown.runtime_left_s)}, the shutdown needs "
        f"{_dur(countdown.plan_left_s)} + margin {_dur(countdown.margin_s)}{spare}"
    ]
    for t in countdown.triggers:
        when = (
            "holds now"
            if t.holds
            else ("?" if t.fires_in_s is None else f"in {_dur(max(0.0, t.fires_in_s))}")
        )
        lines.append(f"  trigger '{t.condition}' ({t.feed}): {when}")
    return lines


def _signed(seconds: float) -> str:
    return f"-{format_duration(-seconds)}" if seconds < 0 else format_duration(seconds)


def _run_lines(run: RunStatus | None, last: LastRun | None) -> list[str]:
    if run is not None:
        lines = [
            f"run {run.id} ({run.kind.value}, {run.origin.value}): "
            f"{run.finished}/{run.total} steps finished"
            + (f", {len(run.failed)} failed" if run.failed else "")
            + (
                f", past the point of no return ({run.point_of_no_return})"
                if run.point_of_no_return
                else ""
            )
        ]
        for step in run.running:
            lines.append(f"  now running: {step.step}: {step.description}{_first_started(step)}")
        return lines
    if last is not None:
        return [f"last run {last.id}: {last.state} {last.detail}".rstrip()]
    return ["no run yet"]


def _cache_lines(caches: list[CacheStatus]) -> list[str]:
    lines = []
    for c in caches:
        dirty = "?" if c.dirty_bytes is None else format_bytes(c.dirty_bytes)
        eta = f", clean in {_dur(c.eta_s)}" if c.eta_s else ""
        lines.append(f"  cache {c.cache}/{c.target}: {c.mode or '?'}, dirty {dirty}{eta}")
    return lines


def history_text(hist: History) -> str:
    lines = []
    for run in hist.runs:
        only = f" only {', '.join(run['only'])}" if run.get("only") else ""
        resumed = f", resumed {run['resumed']}x" if run.get("resumed") else ""
        lines.append(
            f"{run['started']}  {run['kind']} run {run['id']} ({run['origin']}{only}{resumed}): "
            f"{run['state']}"
            + (f" at {run['ended']}" if run.get("ended") else "")
            + f"  reason: {run['reason']}"
        )
        for step in run.get("steps", []):
            attempt = f" (attempt {step['attempt']})" if step["attempt"] > 1 else ""
            head = f"    {step['started']}  {step['state']:<9} {step['step']}{attempt}"
            lines.append(f"{head}: {step['detail']}")
    if hist.phases:
        lines.append("phases:")
        for p in reversed(hist.phases):
            lines.append(f"  {p['at']}  {p['old']} -> {p['new']}: {p['reason']}")
    if hist.overrides:
        lines.append("overrides:")
        for o in reversed(hist.overrides):
            detail = f" ({o['detail']})" if o.get("detail") else ""
            lines.append(f"  {o['at']}  {o['action']} by {o['who']}: {o['reason']}{detail}")
    if hist.cache_ops:
        lines.append("cache operations:")
        for c in reversed(hist.cache_ops):
            failed = "" if c["ok"] else f" FAILED: {c['detail']}"
            lines.append(f"  {c['at']}  {c['cache']}/{c['target']} -> {c['mode']}{failed}")
    return "\n".join(lines) if lines else "the journal is empty"


def event_line(event: dict[str, Any]) -> str:
    level = "" if event["level"] == "info" else f"{event['level'].upper()} "
    return f"{event['at']}  {level}{event['text']}"


def _first_started(step: RunningStep) -> str:
    """For a request a controller before this one made: since when it is under way."""
    if step.under_way_since is None:
        return ""
    at = step.under_way_since.astimezone().strftime("%H:%M:%S")
    return f" (under way since {at}, started before the restart)"
