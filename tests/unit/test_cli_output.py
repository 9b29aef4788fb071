"""CLI tables and the destage progress bar: rich on a terminal, plain lines for a pipe."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from upsguard.cli import output
from upsguard.cli.cache import ProgressBar, status_table
from upsguard.engine.destage import CacheStatus
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget

MiB = 1024 * 1024


class Terminal(io.StringIO):
    """What a person's terminal looks like to the code: a stream that says it is a tty."""

    def isatty(self) -> bool:
        return True


def status(
    name: str, dirty: int, rate: float | None = None, eta: float | None = None
) -> CacheStatus:
    target = CacheTarget(CacheName(name), "dev0")
    state = CacheState(target, datetime.now(UTC), CacheMode.WRITE_THROUGH, dirty, dirty == 0)
    return CacheStatus(CacheName(name), target, state, None, rate, eta)


def test_a_pipe_gets_plain_columns_and_cells_are_never_markup() -> None:
    rows = [["ups-a", "lost (3s old)", "[red]x:smile:"], ["ups-bbbbbb", "ok", "-"]]
    pipe = io.StringIO()
    output.show(output.table(["UPS", "LINK", "NOTE"], rows), "after", out=pipe)
    assert pipe.getvalue() == (
        "UPS         LINK           NOTE\n"
        "ups-a       lost (3s old)  [red]x:smile:\n"
        "ups-bbbbbb  ok             -\n"
        "\n"
        "after\n"
    )


def test_a_terminal_gets_a_framed_table_with_a_bold_header() -> None:
    tty = Terminal()
    output.show(status_table([status("nvram", 40 * MiB, 20 * MiB, 2.0)]), out=tty)
    drawn = tty.getvalue()
    assert "\x1b[1m" in drawn and "─" in drawn  # bold header, a rule under it
    assert "nvram" in drawn and "40.0 MiB" in drawn and "write-through" in drawn


def test_progress_is_one_plain_line_per_poll_for_a_pipe() -> None:
    pipe = io.StringIO()
    bar = ProgressBar(pipe)
    bar.draw([status("a", 40 * MiB, 20 * MiB, 2.0)])
    bar.draw([status("a", 0)])
    bar.done()
    first, last = pipe.getvalue().splitlines()
    assert first.startswith(f"[{'.' * 30}] 40.0 MiB dirty, 20.0 MiB/s, ETA 2s, 0/1 clean")
    assert last == f"[{'#' * 30}] 0 B dirty, 0 B/s, ETA 0s, 1/1 clean"


def test_progress_on_a_terminal_is_a_rich_bar() -> None:
    tty = Terminal()
    bar = ProgressBar(tty)
    bar.draw([status("a", 40 * MiB, 20 * MiB, 2.0)])
    bar.draw([status("a", 10 * MiB, 20 * MiB, 0.5)])
    bar.done()
    drawn = tty.getvalue()
    assert "10.0 MiB dirty" in drawn and "0/1 clean" in drawn
    assert "━" in drawn and "[#" not in drawn  # rich's bar, not the plain one
