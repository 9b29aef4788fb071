"""Where the service's local API listens, read from the site file without building the site.

``upsguard status``, ``hold`` and ``release`` ask the running service, and of the whole site
file they need ``service.socket`` alone. Building the site for it (every pydantic model,
every check) took ~150 ms of commands meant to answer at once (``bench/cli_start.py``). So
the file is read and parsed as ``load_site`` reads and parses it (a file that cannot be
read, or is not YAML, is the same one-line ``ConfigError``), and the socket is taken from
the data when the data says plainly which it is: ``service.socket`` as a string, or no
``socket`` (nor ``service``) at all, which is the default.

Anything less plain is not guessed at: a key the site file or its ``service:`` section does
not have (a misspelt ``socket`` would send the command to the default socket, perhaps to
another service), or a socket that is not a path Linux can open. Then ``named_socket`` says
``None`` and the caller loads the whole site, whose error names the line. The other
sections are not checked here: the service checked its own copy when it started, and a
command that acts without the service loads the whole site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from upsguard.config.source import load_yaml
from upsguard.config.values import check_local_path

#: ``ServiceConfig.socket``'s default.
DEFAULT_SOCKET = Path("/run/upsguard/upsguard.sock")

#: The keys of the site file (``SiteConfig``'s fields) and of its ``service:`` section
#: (``ServiceConfig``'s): ``tests/unit/test_cli_socket.py`` keeps them the models' own.
SITE_KEYS = frozenset(
    {
        "site",
        "ups",
        "feeds",
        "platforms",
        "caches",
        "resources",
        "policies",
        "journal",
        "service",
        "web",
        "checks",
        "contacts",
        "ha",
    }
)
SERVICE_KEYS = frozenset(
    {
        "socket",
        "socket_group",
        "metrics_port",
        "metrics_address",
        "readings_every",
        "keep_readings",
        "notify",
    }
)


def named_socket(path: Path) -> Path | None:
    """The API socket the site file at ``path`` names (or the default, when it names none),
    or ``None`` when only ``load_site`` can say whether the file is right. Raises
    ``ConfigError``, as ``load_site`` does, for a file that cannot be read or is not YAML."""
    return _socket_in(load_yaml(path).data)


def _socket_in(data: Any) -> Path | None:
    if not isinstance(data, dict) or not data.keys() <= SITE_KEYS:
        return None
    service = data.get("service", {})
    if not isinstance(service, dict) or not service.keys() <= SERVICE_KEYS:
        return None
    socket = service.get("socket", str(DEFAULT_SOCKET))
    if not isinstance(socket, str):
        return None
    try:
        return check_local_path(Path(socket))
    except ValueError:
        return None
