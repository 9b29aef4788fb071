"""The journal: the SQLite record of every reading, decision, run, step, request, cache flip
and override, and what is read back from it: the runs a restarted controller resumes, the
durations plans learn, the facts a retrospective tells.

A layer of its own, under the service (``controller/``) and the dry run (``simulation/``),
which both keep one; above the engine, whose events it records and whose runs it resumes.
"""

from upsguard.journal.store import Journal, parse_iso

__all__ = ["Journal", "parse_iso"]
