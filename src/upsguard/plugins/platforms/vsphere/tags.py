"""vSphere tags, which live outside the SOAP API: the vAPI REST endpoints of vCenter.

A selector ``tag: "category:name"`` (or just ``"name"``) is answered with a
handful of requests whatever the number of VMs: log in, list categories and
tags, then list the objects attached to the one tag that matches.
"""

from __future__ import annotations

import base64
import contextlib
import json
import urllib.error
import urllib.request
from typing import Any

from upsguard.errors import PermanentError, PlatformUnreachable
from upsguard.plugins.platforms.vsphere.endpoint import Endpoint

_BASE = "/rest/com/vmware/cis"


class _Rest:
    def __init__(self, ep: Endpoint) -> None:
        self._root = f"https://{ep.host}:{ep.port}{_BASE}"
        self._context = ep.ssl_context()
        self._label = ep.label
        user_pass = f"{ep.user}:{ep.password()}".encode()
        self._headers = {"Authorization": "Basic " + base64.b64encode(user_pass).decode()}
        self._token = self._request("POST", "/session")
        self._headers = {"vmware-api-session-id": str(self._token)}

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self._headers, "Content-Type": "application/json"}
        request = urllib.request.Request(self._root + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=30) as answer:
                data = json.loads(answer.read() or b"null")
                return data.get("value") if isinstance(data, dict) else None
        except urllib.error.HTTPError as exc:
            raise PermanentError(
                f"{self._label}: the tagging API answered {exc.code} to {method} {path}"
            ) from exc
        except (OSError, ValueError, KeyError) as exc:
            raise PlatformUnreachable(f"{self._label}: the tagging API failed: {exc}") from exc

    def get(self, path: str) -> Any:
        return self._request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self._request("POST", path, body)

    def logout(self) -> None:
        with contextlib.suppress(PermanentError, PlatformUnreachable):
            self._request("DELETE", "/session")


def tagged_vm_ids(endpoint: Endpoint, resource: str, tag: str) -> set[str]:
    """Managed object ids of the VMs carrying ``tag`` ("category:name" or "name")."""
    category, _, name = tag.rpartition(":")
    rest = _Rest(endpoint)
    try:
        categories = {
            c: rest.get(f"/tagging/category/id:{c}")["name"] for c in rest.get("/tagging/category")
        }
        matches = []
        for tag_id in rest.get("/tagging/tag"):
            info = rest.get(f"/tagging/tag/id:{tag_id}")
            in_category = not category or categories.get(info["category_id"]) == category
            if info["name"] == name and in_category:
                matches.append(tag_id)
        if not matches:
            raise PermanentError(f"resource '{resource}': no vSphere tag '{tag}'")
        ids: set[str] = set()
        for tag_id in matches:
            path = f"/tagging/tag-association/id:{tag_id}?~action=list-attached-objects"
            attached = rest.post(path, {})  # vcsim insists on a JSON body
            ids |= {o["id"] for o in attached or [] if o.get("type") == "VirtualMachine"}
        return ids
    finally:
        rest.logout()
