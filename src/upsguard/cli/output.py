"""Tables for people and for scripts, from one description.

A command builds its tables once with ``table()``. On a terminal rich draws them (box,
bold header, width of the window); anywhere else (a pipe, a file, the tests) they are plain
columns separated by two spaces, one line per row and no escape codes, which is what
scripts read. Cells are plain text, never rich markup: a VM called ``[red]x`` is shown as
it is called.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Sequence
from typing import TextIO

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

#: Wide enough that no plain table is ever wrapped: a script reads one row per line.
PLAIN_WIDTH = 1_000_000


def is_terminal(out: TextIO) -> bool:
    """Whether people read ``out``: rich's own test also honours FORCE_COLOR, which would put
    escape codes into what a script reads, so only a real terminal counts."""
    return out.isatty()


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> Table:
    """A table in its plain form; ``show`` gives it a frame on a terminal."""
    grid = Table(
        box=None,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        header_style="",
    )
    for i, header in enumerate(headers):
        last = i == len(headers) - 1  # free text (detail, members): it wraps on a terminal
        grid.add_column(header, no_wrap=not last, overflow="fold" if last else "ellipsis")
    for row in rows:
        grid.add_row(*(Text(cell) for cell in row))
    return grid


def plain(*parts: RenderableType) -> str:
    """What ``show`` prints when no terminal is reading: parts separated by a blank line."""
    return "\n\n".join(_plain(part) for part in parts)


def show(*parts: RenderableType, out: TextIO | None = None) -> None:
    """Print the parts (tables or text), separated by a blank line."""
    out = out if out is not None else sys.stdout
    if not is_terminal(out):
        print(plain(*parts), file=out)
        return
    console = Console(file=out, highlight=False)
    for i, part in enumerate(parts):
        if i:
            console.print()
        console.print(framed(part) if isinstance(part, Table) else part, markup=False)


def framed(grid: Table) -> Table:
    """The terminal's form of a table: a bold header ruled off from the rows, columns as
    close as in the plain form (the window is rarely wide enough to spare more)."""
    grid.box = box.SIMPLE_HEAD
    grid.padding = (0, 1, 0, 0)  # with the frame's blank column: two spaces between columns
    grid.header_style = "bold"
    return grid


def _plain(part: RenderableType) -> str:
    if isinstance(part, str):
        return part
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=PLAIN_WIDTH,
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
        markup=False,
    )
    console.print(part)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
