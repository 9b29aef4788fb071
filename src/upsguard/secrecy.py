"""What never leaves the process: the secrets in a URL, and the service's environment.

Two rules for the whole code base, each kept here and nowhere else:

* ``redact_url``: a URL that is logged, journaled, notified or shown goes through it
  first. The service's log, the journal's events, ``history``, the notify hook's stdin and
  the webhook's body all repeat a step's error, so a URL with ``user:password@`` or
  ``?token=...`` in it would be copied everywhere. ``origin_only`` keeps no more than the
  scheme, host and port, for URLs whose path itself is a secret (a chat webhook's
  ``/services/T0/B0/XXXX``).
* ``child_env``: every process upsguard starts gets this environment instead of its own.
  The service's environment holds the secrets that ``password_env`` and its kin name
  (NUT, Redfish, SNMP keys, Proxmox tokens); a notify hook or a resource's command has no
  business with them. A child gets the few variables any program needs (``PATH``, home,
  user, locale, time zone) and the ones its own settings name in ``pass_env``.
* ``program_name``: a resource's ``shutdown:``/``startup:`` command line that is described
  (a plan's steps, and through them the web page, the journal and reports) is shown as its
  program's name: its arguments may hold a password, and its path whatever a directory says.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["BASE_ENV", "HIDDEN", "child_env", "program_name", "redact_url"]

#: What stands in for a hidden part of a URL.
HIDDEN = "***"

#: What any program needs to run as the user the service runs as; nothing here is a secret.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")
_LOCALE = re.compile(r"LC_[A-Z_]+")


def redact_url(url: str, *, origin_only: bool = False) -> str:
    """``url`` fit to be shown: credentials and query values replaced by ``***``.

    ``https://admin:pw@nas/api?token=t&v=1`` becomes ``https://***@nas/api?token=***&v=***``
    (which credentials and which parameters were given stays visible: that is what a
    person debugging needs). With ``origin_only``: ``https://nas``. Text that is not a URL
    (no scheme or host, a bad port) comes back as ``scheme://***``, never as it was.
    """
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:  # a bad port, an unbalanced bracket: hide what could be secret
        return _hide_all(url)
    if not parts.scheme or not host:
        return _hide_all(url)
    where = f"[{host}]" if ":" in host else host
    if port is not None:
        where = f"{where}:{port}"
    if origin_only:
        return f"{parts.scheme}://{where}"
    if parts.username is not None or parts.password is not None:
        where = f"{HIDDEN}@{where}"
    query = "&".join(_hide_value(item) for item in parts.query.split("&")) if parts.query else ""
    fragment = HIDDEN if parts.fragment else ""
    return urlunsplit(SplitResult(parts.scheme, where, parts.path, query, fragment))


def _hide_value(item: str) -> str:
    name, sep, _ = item.partition("=")
    return f"{name}={HIDDEN}" if sep else HIDDEN


def _hide_all(text: str) -> str:
    """No telling which part of a malformed URL is a secret: only its scheme is shown."""
    scheme, sep, _ = text.strip().partition("://")
    return f"{scheme}://{HIDDEN}" if sep and scheme.isalnum() else HIDDEN


def child_env(
    pass_env: Iterable[str] = (),
    extra: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a process upsguard starts: ``BASE_ENV`` and the ``LC_*``
    variables, the variables ``pass_env`` names (from the service's own environment, when
    set there), then ``extra`` (what upsguard tells the child, such as ``UPSGUARD_EVENT``)."""
    source = os.environ if environ is None else environ
    wanted = set(BASE_ENV) | set(pass_env)
    env = {k: v for k, v in source.items() if k in wanted or _LOCALE.fullmatch(k)}
    env.update(extra or {})
    return env


def program_name(command: str) -> str:
    """The name of the program a command line runs, without its directory, its arguments or
    the ``NAME=value`` assignments before it (``PDU_TOKEN=x /opt/bin/pductl --password y``:
    ``pductl``); ``?`` when there is none to be found."""
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote: the shell's concern, not the description's
        words = command.split()
    program = next((w for w in words if not _ASSIGNMENT.match(w)), "")
    return PurePosixPath(program).name or "?"


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
