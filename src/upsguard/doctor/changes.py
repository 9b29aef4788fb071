"""What changed between two checkups, by each check's name (``Finding.key``): what broke (it
warns or fails now, and was ok, better or not checked before) and what was mended."""

from __future__ import annotations

from collections.abc import Sequence

from upsguard.findings import Finding, Verdict


def compare(
    before: Sequence[Finding] | None, now: Sequence[Finding]
) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """``(broke, mended)``. With no checkup before, everything that is wrong broke."""
    earlier = {f.key: f for f in before or ()}
    broke = tuple(
        f
        for f in now
        if f.verdict is not Verdict.OK
        and (f.key not in earlier or earlier[f.key].verdict.rank < f.verdict.rank)
    )
    current = {f.key: f for f in now}
    mended = tuple(
        current[f.key]
        for f in before or ()
        if f.verdict is not Verdict.OK and f.key in current and current[f.key].verdict is Verdict.OK
    )
    return broke, mended
