"""Text for people: ``status``, ``history`` and ``events`` as the override CLI prints them."""

from __future__ import annotations

from typing import Any

from upsguard.config.types import format_bytes, format_duration


def _dur(seconds: float | None) -> str:
    return "?" if seconds is None else format_duration(seconds)


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def status_text(st: dict[str, Any]) -> str:
    svc = st.get("service", {})
    lines = [f"site {st['site']}: phase {st['phase']}" + _since(st.get("phase_since"))]
    if not svc.get("running"):
        lines.append(f"service: NOT RUNNING (from the journal {svc.get('journal')})")
    else:
        resumed = f", resumed run {svc['resumed']}" if svc.get("resumed") else ""
        lines.append(f"service: pid {svc['pid']} since {svc['since']}{resumed}")
    if st.get("held"):
        held = st["held"]
        who = f" by {held['who']}" if held.get("who") else ""
        lines.append(f"HOLD{who}: {held.get('reason')} (automatic actions wait, down to the floor)")
    if st.get("at_floor"):
        lines.append("AT THE CRITICAL FLOOR: nothing is waited for")
    lines += [f"ALERT: {alert['text']}" for alert in st.get("alerts", [])]
    lines += _ups_lines(st.get("ups", []))
    for feed in st.get("feeds", []):
        risk = "AT RISK" if feed["at_risk"] else "ok"
        lines.append(
            f"  feed {feed['name']}: {risk}, {feed['online']}/{feed['needed']} supplying"
            + (f", runtime {_dur(feed['runtime_s'])}" if feed.get("runtime_s") is not None else "")
        )
    for reading in st.get("last_readings", []):
        lines.append(
            f"  UPS {reading['ups']}: last journaled {reading['at']}: {reading['status']}, "
            f"charge {_pct(reading['charge'])}, runtime {_dur(reading['runtime'])}"
        )
    lines += _run_lines(st.get("run"), st.get("last_run"))
    if st.get("unfinished_runs"):
        lines.append(
            "unfinished runs (resumed at the next start): " + ", ".join(st["unfinished_runs"])
        )
    lines += _cache_lines(st.get("caches", []))
    return "\n".join(lines)


def _since(at: str | None) -> str:
    return f" since {at}" if at else ""


def _ups_lines(upses: list[dict[str, Any]]) -> list[str]:
    lines = []
    for ups in upses:
        if not ups.get("polled"):
            lines.append(f"  UPS {ups['name']}: not read yet" + _error(ups))
            continue
        link = "" if ups["link"] == "ok" else f", link {ups['link']} ({_dur(ups.get('age_s'))} old)"
        depletion = ups.get("depletion_pct_per_min")
        drain = f", draining {depletion:.1f} %/min" if depletion else ""
        lines.append(
            f"  UPS {ups['name']}: {ups['status'] or '-'}, charge {_pct(ups['charge_pct'])}, "
            f"runtime {_dur(ups['runtime_s'])}{drain}{link}" + _error(ups)
        )
    return lines


def _error(entry: dict[str, Any]) -> str:
    return f" [{entry['error']}]" if entry.get("error") else ""


def _run_lines(run: dict[str, Any] | None, last: dict[str, Any] | None) -> list[str]:
    if run is not None:
        lines = [
            f"run {run['run']} ({run['kind']}, {run['origin']}): "
            f"{run['finished']}/{run['steps']} steps finished"
            + (f", {len(run['failed'])} failed" if run["failed"] else "")
            + (
                f", past the point of no return ({run['point_of_no_return']})"
                if run.get("point_of_no_return")
                else ""
            )
        ]
        for step in run["running"]:
            lines.append(f"  now running: {step['step']}: {step['description']}")
        return lines
    if last is not None:
        return [f"last run {last['id']}: {last['state']} {last.get('detail') or ''}".rstrip()]
    return ["no run yet"]


def _cache_lines(caches: list[dict[str, Any]]) -> list[str]:
    lines = []
    for c in caches:
        dirty = "?" if c["dirty_bytes"] is None else format_bytes(c["dirty_bytes"])
        eta = f", clean in {_dur(c['eta_s'])}" if c.get("eta_s") else ""
        lines.append(f"  cache {c['cache']}/{c['target']}: {c['mode']}, dirty {dirty}{eta}")
    return lines


def history_text(hist: dict[str, Any]) -> str:
    lines = []
    for run in hist.get("runs", []):
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
    if hist.get("phases"):
        lines.append("phases:")
        for p in reversed(hist["phases"]):
            lines.append(f"  {p['at']}  {p['old']} -> {p['new']}: {p['reason']}")
    if hist.get("overrides"):
        lines.append("overrides:")
        for o in reversed(hist["overrides"]):
            detail = f" ({o['detail']})" if o.get("detail") else ""
            lines.append(f"  {o['at']}  {o['action']} by {o['who']}: {o['reason']}{detail}")
    return "\n".join(lines) if lines else "the journal is empty"


def event_line(event: dict[str, Any]) -> str:
    level = "" if event["level"] == "info" else f"{event['level'].upper()} "
    return f"{event['at']}  {level}{event['text']}"
