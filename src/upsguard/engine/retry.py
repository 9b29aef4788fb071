"""Platform requests of a step: bounded in time, and asked again when they fail for a while.

A request that hangs must not hold its step forever: after its allowance it is abandoned
(``asyncio.timeout``) and asked again, like one that failed with a ``TemporaryError``,
with a growing pause, up to the resource's ``retries``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from upsguard.config.types import format_duration
from upsguard.errors import RequestTimedOut, TemporaryError

T = TypeVar("T")

CALL_TIMEOUT_S = 120.0
"""One request to a platform; waiting for a state has its own timeout."""
MAX_BACKOFF_S = 30.0


async def ask(
    call: Callable[[], Awaitable[T]], retries: int, allowance_s: float = CALL_TIMEOUT_S
) -> T:
    """``call()``, again (with a growing pause) after a temporary error or no answer within
    the allowance, up to ``retries`` more times; then the last error."""
    attempt = 0
    while True:
        attempt += 1
        error: TemporaryError
        try:
            async with asyncio.timeout(allowance_s):
                return await call()
        except TimeoutError:
            error = RequestTimedOut(f"no answer within {format_duration(allowance_s)}")
        except TemporaryError as exc:
            error = exc
        if attempt > retries:
            raise error
        await asyncio.sleep(min(error.retry_after * attempt, MAX_BACKOFF_S))
