"""``run``, the override commands (``status``, ``hold``, ``release``, ``trigger``, ``abort``,
``history``, ``events``) and ``demo``.

The override commands talk to the running service over its unix socket. When
no service answers they act directly (on the journal, or by running the plan in
this process) after a confirmation.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from upsguard.cli.common import (
    Subparsers,
    add_format_option,
    add_site_option,
    print_json,
    run_async,
    site_of,
)
from upsguard.errors import PermanentError, ServiceNotRunning, TemporaryError

if TYPE_CHECKING:
    from upsguard.cli.client import ApiClient
    from upsguard.config.site import SiteConfig
    from upsguard.controller.commands import History


def register(commands: Subparsers) -> None:
    p = commands.add_parser("run", help="the long-running service (under systemd)")
    add_site_option(p)
    p.set_defaults(handler=cmd_run)

    p = commands.add_parser("status", help="phase, UPSes, the run in progress, caches")
    _client_options(p)
    add_format_option(p)
    p.set_defaults(handler=cmd_status)

    p = commands.add_parser("hold", help="defer automatic actions (down to the critical floor)")
    _client_options(p)
    p.add_argument("--reason", required=True, help="why; kept in the journal's audit trail")
    _yes_option(p)
    p.set_defaults(handler=cmd_hold)

    p = commands.add_parser("release", help="end a hold: automatic actions resume")
    _client_options(p)
    p.add_argument("--reason", default="", help="why; kept in the journal's audit trail")
    _yes_option(p)
    p.set_defaults(handler=cmd_release)

    p = commands.add_parser("trigger", help="run the shutdown or startup runbook now")
    p.add_argument("direction", choices=("shutdown", "startup"))
    _client_options(p)
    p.add_argument("--only", nargs="+", default=[], metavar="ID", help="only these resources")
    p.add_argument("--reason", default="", help="why; kept in the journal's audit trail")
    _yes_option(p)
    p.set_defaults(handler=cmd_trigger)

    p = commands.add_parser("abort", help="cancel the run in progress (and hold)")
    _client_options(p)
    p.add_argument("--reason", default="", help="why; kept in the journal's audit trail")
    _yes_option(p)
    p.set_defaults(handler=cmd_abort)

    p = commands.add_parser("history", help="past runs with their steps, phases, overrides")
    _client_options(p)
    p.add_argument("-n", "--limit", type=int, default=5, help="how many runs (default 5)")
    add_format_option(p)
    p.set_defaults(handler=cmd_history)

    p = commands.add_parser("events", help="the event log; --follow to keep watching")
    _client_options(p)
    p.add_argument("-n", "--lines", type=int, default=20, help="how many past events (default 20)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    p.set_defaults(handler=cmd_events)

    p = commands.add_parser("demo", help="a whole outage on built-in simulated gear, sped up")
    p.add_argument("--speed", type=float, default=60.0, help="virtual seconds per second (60)")
    p.add_argument("--journal", type=Path, help="keep the demo's journal here (default: temp)")
    p.set_defaults(handler=cmd_demo)


def _client_options(p: argparse.ArgumentParser) -> None:
    add_site_option(p)
    p.add_argument("--socket", type=Path, help="the API socket (default: from the site file)")


def _yes_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _client(args: argparse.Namespace, site: SiteConfig) -> ApiClient:
    from upsguard.cli.client import ApiClient

    return ApiClient(args.socket or site.service.socket)


def _service_client(args: argparse.Namespace) -> ApiClient:
    """A client of the service, for a command that builds the site only when no service
    answers: the socket is ``--socket``, else the one the site file names, read without
    building the site (``config.api_socket``). A file that does not say it plainly is loaded
    whole, so a missing or bad site file is the error it always was, ``--socket`` or not."""
    from upsguard.cli.client import ApiClient
    from upsguard.config.api_socket import named_socket

    named = named_socket(args.config)
    if named is None:
        named = site_of(args).service.socket
    return ApiClient(args.socket or named)


def _who() -> str:
    user = getpass.getuser()
    sudo = os.environ.get("SUDO_USER")
    return f"{sudo} (as {user})" if sudo and sudo != user else user


def confirm(question: str, yes: bool) -> None:
    """Ask before acting; without a terminal, only --yes says yes."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise PermanentError(f"{question} Not confirmed: add --yes to act without a terminal")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise PermanentError("not confirmed; nothing done")


def _direct(question: str, yes: bool) -> None:
    confirm(f"The upsguard service is not running. {question}", yes)


# -- run ------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    site = site_of(args)
    if args.verbose == 0:
        logging.getLogger().setLevel(logging.INFO)
    if args.verbose < 2:
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    return run_async(_serve(site, args.config))


async def _serve(site: SiteConfig, path: Path) -> int:
    import asyncio

    from upsguard.controller.service import run_service

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return await run_service(site, stop, path)  # SIGHUP: the site file again


# -- the override commands -----------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from upsguard.cli import views

    client = _service_client(args)
    try:
        st = client.status()
    except ServiceNotRunning:
        from upsguard.controller import offline

        st = run_async(offline.status(site_of(args)))
    if args.format == "json":
        _print_answer(st)
    else:
        print(views.status_text(st))
    return 1 if views.unread(st) else 0


def _print_answer(answer: object) -> None:
    """The service's answers are msgspec structs; msgspec is imported here because
    ``--help`` loads this module and needs none of it (``test_cli_start``)."""
    import msgspec

    print_json(msgspec.to_builtins(answer))


def cmd_hold(args: argparse.Namespace) -> int:
    from upsguard.controller.commands import HoldAnswer

    client = _service_client(args)
    try:
        answer = client.act("hold", {"reason": args.reason}, HoldAnswer)
    except ServiceNotRunning:
        site = site_of(args)
        _direct("Journal the hold for its next start?", args.yes)
        from upsguard.controller import offline

        reason = offline.hold(site, _who(), args.reason)
        print(f"held (journaled; the service takes it up when it starts): {reason}")
        return 0
    print(f"held: {answer.reason}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from upsguard.controller.commands import ReleaseAnswer

    client = _service_client(args)
    try:
        answer = client.act("release", {"reason": args.reason}, ReleaseAnswer)
    except ServiceNotRunning:
        site = site_of(args)
        _direct("Journal the release for its next start?", args.yes)
        from upsguard.controller import offline

        offline.hold(site, _who(), args.reason, release=True)
        print("released (journaled)")
        return 0
    print("released" + (f" (was held: {answer.was})" if answer.was else " (was not held)"))
    return 0


def cmd_trigger(args: argparse.Namespace) -> int:
    site = site_of(args)
    what = f"{args.direction} of " + (", ".join(args.only) if args.only else f"site {site.site}")
    client = _client(args, site)
    if not client.running():
        _direct(f"Run the {what} from this process?", args.yes)
        from upsguard.controller import offline

        return run_async(
            offline.trigger(site, _who(), args.direction, args.only, args.reason, print)
        )
    confirm(f"Start the {what} now?", args.yes)
    from upsguard.controller.commands import TriggerAnswer

    body = {"direction": args.direction, "only": args.only, "reason": args.reason}
    answer = client.act("trigger", body, TriggerAnswer)
    print(f"started run {answer.run}: follow it with 'upsguard events -f'")
    return 0


def cmd_abort(args: argparse.Namespace) -> int:
    site = site_of(args)
    client = _client(args, site)
    if not client.running():
        _direct("Mark its unfinished runs aborted (they will not resume) and hold?", args.yes)
        from upsguard.controller import offline

        closed = offline.abort(site, _who(), args.reason)
        print("aborted: " + (", ".join(closed) if closed else "nothing was unfinished") + "; held")
        return 0
    confirm("Cancel the run in progress and hold automatic actions?", args.yes)
    from upsguard.controller.commands import AbortAnswer

    answer = client.act("abort", {"reason": args.reason}, AbortAnswer)
    run = answer.aborted
    print((f"aborted run {run}" if run else "no run was in progress") + f"; {answer.held}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from upsguard.cli import views
    from upsguard.controller.commands import History

    site = site_of(args)
    client = _client(args, site)
    try:
        hist = client.read(client.get(f"/history?limit={args.limit}"), History, "a history")
    except ServiceNotRunning:
        hist = _journal_history(site, args.limit)
    if args.format == "json":
        _print_answer(hist)
    else:
        print(views.history_text(hist))
    return 0


def _journal_history(site: SiteConfig, limit: int) -> History:
    """The history as the service builds it (``commands.history``), from the journal."""
    from upsguard.controller import commands, offline

    journal = offline.read_journal(site)
    try:
        return commands.history(journal, limit)
    finally:
        journal.close()


def cmd_events(args: argparse.Namespace) -> int:
    from upsguard.cli import views

    site = site_of(args)
    client = _client(args, site)
    after = -min(max(args.lines, 1), 1000)  # the API gives the last 1,000 at most
    quiet = args.lines <= 0  # only what happens from now on
    while True:
        try:
            answer = client.get(f"/events?after={after}&wait={25 if args.follow else 0}", 40.0)
            rows, after = answer["events"], answer["last"]
        except ServiceNotRunning:
            rows = _journal_events(site, after, args.follow)
            after = rows[-1]["id"] if rows else max(after, 0)
            if args.follow and not rows:
                time.sleep(1.0)
        except TemporaryError:
            if not args.follow:
                raise
            rows = []  # the API is at its bound of long-polls: follow on a moment later
            time.sleep(1.0)
        for row in [] if quiet else rows:
            print(views.event_line(row), flush=True)
        quiet = False
        if not args.follow:
            return 0


def _journal_events(site: SiteConfig, after: int, follow: bool) -> list[dict[str, Any]]:
    """The events after ``after`` in the journal; following, none until there is one (the
    service may be about to start), else no journal is one line."""
    from upsguard.controller import offline
    from upsguard.journal.file import journal_exists

    if follow and not journal_exists(site.journal):
        return []
    journal = offline.read_journal(site)
    try:
        return [e.to_dict() for e in journal.read.events(after=after)]
    finally:
        journal.close()


# -- demo -------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from upsguard.journal import Journal
    from upsguard.simulation.demo import run_demo

    with tempfile.TemporaryDirectory(prefix="upsguard-demo-") as tmp:
        path = args.journal or Path(tmp) / "demo.sqlite"
        journal = Journal(path)
        try:
            report = run_demo(speed=args.speed, observers=[journal.write.record])
            runs = journal.read.runs(limit=10, with_steps=False)
            events = len(journal.read.events(after=0, limit=100000))
        finally:
            journal.close()
    print(
        f"final phase: {report.final_phase}; journal: {events} events, "
        f"runs: {', '.join(f'{r.kind} {r.state}' for r in reversed(runs))}"
        + (f" ({path})" if args.journal else "")
    )
    return 0 if report.final_phase == "normal" else 1
