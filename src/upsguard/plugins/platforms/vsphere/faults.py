"""What pyVmomi, ssl and the socket raise, turned into upsguard's errors at one boundary.

Every call to vSphere, VM and host steps alike, runs inside ``vsphere_faults``
(as httpx runs httpcore inside ``map_httpcore_exceptions``); the most specific
match wins, and the original stays attached (``raise ... from exc``)::

    vim.fault.InvalidLogin           AuthenticationError   the login was refused
    vim.fault.NotAuthenticated       AuthenticationError   the session is gone, even after
                                                           logging in again
    vim.fault.ToolsUnavailable       GracefulUnavailable   no VMware Tools: the executor falls back
    vmodl.MethodFault (any other)    PermanentError        vSphere refused; its message, one line
    ssl.SSLCertVerificationError     PermanentError        the certificate is not trusted
    ssl.SSLError                     PlatformUnreachable   the TLS handshake failed
    OSError, http.client errors      PlatformUnreachable   the endpoint did not answer

Faults that mean "already in that state" (``InvalidPowerState``) are no errors
for an idempotent step: the steps catch them inside their call, before this map.
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

from pyVmomi import vim, vmodl

from upsguard.errors import (
    AuthenticationError,
    GracefulUnavailable,
    PermanentError,
    PlatformUnreachable,
)
from upsguard.plugins.platforms.vsphere.endpoint import Endpoint

#: ``doing`` of the login itself: its messages name the address, not a step.
LOGIN = "log in"
DROPPED = (OSError, http.client.HTTPException)  # ConnectionError and TimeoutError are OSErrors


@contextmanager
def vsphere_faults(endpoint: Endpoint, doing: str = LOGIN) -> Iterator[None]:
    """Run a call to ``endpoint``; what it raises leaves as upsguard's error, on one line."""
    where = endpoint.label if doing == LOGIN else f"{endpoint.label}: {doing}"
    try:
        yield
    except vim.fault.InvalidLogin as exc:
        raise AuthenticationError(
            f"{endpoint.label}: {endpoint.address} refused the login of user "
            f"'{endpoint.user}': check the user and its password file or variable"
        ) from exc
    except vim.fault.NotAuthenticated as exc:
        raise AuthenticationError(f"{where}: session lost") from exc
    except vim.fault.ToolsUnavailable as exc:
        # the executor prefixes the target's name and says what it falls back to
        raise GracefulUnavailable("VMware Tools are not running") from exc
    except vmodl.MethodFault as exc:
        failed = f"{endpoint.label}: login failed" if doing == LOGIN else where
        raise PermanentError(f"{failed}: {fault_text(exc)}") from exc
    except ssl.SSLCertVerificationError as exc:
        raise PermanentError(
            f"{endpoint.label}: the TLS certificate of {endpoint.address} is not trusted "
            f"({exc.verify_message}): set ca_file to its CA bundle "
            "(or verify_tls: false, which trusts anyone on the path)"
        ) from exc
    except ssl.SSLError as exc:
        raise PlatformUnreachable(
            f"{endpoint.label}: TLS handshake with {endpoint.address} failed: {exc.reason}"
        ) from exc
    except DROPPED as exc:
        if doing == LOGIN:
            message = f"{endpoint.label}: cannot reach {endpoint.address}: {reason(exc)}"
        else:
            message = f"{where}: {endpoint.address} did not answer: {reason(exc)}"
        raise PlatformUnreachable(message) from exc


def fault_text(exc: BaseException) -> str:
    """What vSphere said, on one line: the fault's message, or its type when it has none."""
    msg = getattr(exc, "msg", None) or ""
    if not msg and isinstance(exc, vmodl.MethodFault):
        faults = getattr(exc, "faultMessage", None) or []
        msg = "; ".join(m.message for m in faults if getattr(m, "message", None))
    name = type(exc).__name__.split(".")[-1]
    text = str(msg).strip() or name
    if name not in text:
        text = f"{text} ({name})"
    return " ".join(text.split())


def reason(exc: BaseException) -> str:
    """Why a connection failed, as the system says it (``connection refused``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
