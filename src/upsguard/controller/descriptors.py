"""How many file descriptors the process has left, for the listeners that must never take the
last ones: the runbook's commands, SSH and HTTPS sessions, the journal and the UPS readers need
them more than any client of the local API or the web page.

The reserves nest: the API keeps ``API_RESERVE`` for the runbook; the web page keeps that and
room for every connection the API may hold, so a flood of the page never silences the API.
"""

from __future__ import annotations

import asyncio
import os
import resource

API_RESERVE = 256
"""Left to the runbook: the local API takes no new connection below it."""


def to_spare(reserve: int, share: float) -> bool:
    """Whether one more connection leaves ``reserve`` descriptors under the soft open-file
    limit, or ``share`` of that limit when it is so small that the reserve would take it all
    (a tiny limit still gets an API)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return True
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except FileNotFoundError:
        return True  # no /proc to count with: the connection ceilings alone bound the listeners
    except OSError:
        return False  # not even a directory can be opened: certainly none to spare
    return soft - in_use > min(reserve, int(soft * share))


class Refused(asyncio.Protocol):
    """A connection past the ceiling, closed at once so that its descriptor is free again. No
    answer: the request may not have arrived yet, and reading it would hold the descriptor."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()
