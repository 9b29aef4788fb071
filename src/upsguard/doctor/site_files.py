"""The files checks: every file the site names can be read, no secret is readable by
everyone, and the journal can be written (without creating or touching it)."""

from __future__ import annotations

import os
from pathlib import Path

from upsguard.config.files import missing, named_files, world_readable
from upsguard.config.site import SiteConfig
from upsguard.config.source import format_path
from upsguard.findings import Area, Finding, fail, ok, warn


def check_files(site: SiteConfig) -> list[Finding]:
    """One finding per distinct file (a BMC password shared by four platforms is one row)."""
    found: dict[Path, Finding] = {}
    for named in named_files(site):
        if named.path in found:
            continue
        subject, field = str(named.path), format_path(named.loc)
        why = missing(named)
        if why is not None:
            found[named.path] = fail(Area.FILE, subject, "readable", f"{field}: {why}", _fix(why))
        elif named.secret and world_readable(named):
            found[named.path] = warn(
                Area.FILE,
                subject,
                "readable",
                f"{field}: a secret every user of this machine can read",
                f"chmod o-rwx {named.path}",
            )
        else:
            kind = "secret, readable by its owner" if named.secret else "readable"
            found[named.path] = ok(Area.FILE, subject, "readable", f"{field}: {kind}")
    return list(found.values())


def _fix(why: str) -> str:
    if why.endswith("does not exist"):
        return "create it (mode 0600 for a secret), or fix the path in the site file"
    return "make it a file the user upsguard runs as can read (mode 0600 for a secret)"


def journal(site: SiteConfig) -> list[Finding]:
    """Writable where it is, or creatable where it will be; never created here."""
    path = Path(site.journal)
    subject = str(path)
    if path.exists():
        writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)
        if writable:
            return [ok(Area.FILE, subject, "journal", "writable")]
        return [
            fail(
                Area.FILE,
                subject,
                "journal",
                "the journal (or its directory, for SQLite's -wal file) is not writable by "
                "this user",
                "run upsguard as the user that owns it, or fix the owner of the file and its "
                "directory",
            )
        ]
    parent = next((p for p in path.parents if p.exists()), Path("/"))
    if os.access(parent, os.W_OK | os.X_OK):
        return [ok(Area.FILE, subject, "journal", f"not there yet; {parent} lets it be made")]
    return [
        fail(
            Area.FILE,
            subject,
            "journal",
            f"not there, and {parent} does not let this user make it",
            f"create {path.parent} for the user upsguard runs as (systemd: StateDirectory)",
        )
    ]
