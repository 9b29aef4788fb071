"""The override CLI's side of the local API: one HTTP request per call over the unix socket."""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from upsguard.controller.commands import error_from
from upsguard.errors import PermanentError, ServiceNotRunning, TemporaryError, UpsguardError
from upsguard.status import SiteStatus

Model = TypeVar("Model", bound=msgspec.Struct)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class ApiClient:
    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        self.path = path
        self.timeout = timeout

    def get(self, target: str, timeout: float | None = None) -> Any:
        return self.request("GET", target, None, timeout)

    def post(self, target: str, body: dict[str, Any]) -> Any:
        body = {"who": os.environ.get("SUDO_USER", ""), **body}
        return self.request("POST", target, body)

    def status(self) -> SiteStatus:
        """The service's status, read into the one status model."""
        return self.read(self.get("/status"), SiteStatus, "a status")

    def act(self, command: str, body: dict[str, Any], answer: type[Model]) -> Model:
        """An override command (``controller.commands``), its answer read into its model."""
        return self.read(self.post(f"/{command}", body), answer, f"to {command}")

    def read(self, raw: Any, model: type[Model], what: str) -> Model:
        """``raw``, an answer of the service, as ``model``: a service of another version may
        answer what this CLI cannot read, and that is one line, not a traceback."""
        try:
            return msgspec.convert(raw, model)
        except msgspec.ValidationError as exc:
            raise UpsguardError(
                f"the service on {self.path} answered {what} this upsguard cannot read "
                f"({exc}): are the service and the CLI one version?"
            ) from None

    def running(self) -> bool:
        try:
            self.get("/status", timeout=5.0)
        except ServiceNotRunning:
            return False
        return True

    def request(
        self, method: str, target: str, body: dict[str, Any] | None, timeout: float | None = None
    ) -> Any:
        conn = _UnixConnection(self.path, timeout or self.timeout)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            conn.request(method, target, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ServiceNotRunning(f"no upsguard service answers on {self.path}") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise TemporaryError(
                f"the service on {self.path} closed the connection without answering: it serves "
                "a bounded number of connections at a time; try again"
            ) from exc
        except PermissionError as exc:
            raise PermanentError(
                f"{self.path}: permission denied: join the socket's group "
                "(service.socket_group in the site file) or use sudo"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise TemporaryError(f"the service on {self.path} did not answer: {exc}") from exc
        finally:
            conn.close()
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise UpsguardError(f"the service on {self.path} answered garbage") from exc
        if response.status >= 400:
            raise error_from(response.status, str(answer.get("error", f"HTTP {response.status}")))
        return answer
