"""The group the site file names in ``service.socket_group``: its members use the API
socket (0660) and may read the journal (0640)."""

from __future__ import annotations

import grp

from upsguard.errors import PermanentError


def group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise PermanentError(
            f"service.socket_group: no group named '{name}': create it (groupadd {name}) "
            "or change the site file"
        ) from None
