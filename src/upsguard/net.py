"""TLS for upsguard's own client connections, and its one way of making an HTTP request.

TLS is verified unless the site file says not (``verify_tls: false``); ``ca_file`` then
replaces the system's CAs. A request (a health check's GET, the webhook's POST) never
follows a redirect: a health URL that redirects lands on a login page, not on the thing
that must answer, and a followed redirect would carry the request's credentials (basic
auth, a bearer token) to whatever host the answer names. It is reported instead, with
where it pointed reduced to its origin.

What a failed request says never holds the URL's credentials or query: callers name the
URL through ``secrecy.redact_url``, and the reasons here come from the error's kind, not
from text that may repeat the URL.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urljoin

from upsguard.errors import ConfigError
from upsguard.secrecy import redact_url

__all__ = ["http_request", "tls_context"]


def tls_context(verify_tls: bool = True, ca_file: Path | None = None) -> ssl.SSLContext:
    """A client context: verified against ``ca_file`` (or the system's CAs), or, with
    ``verify_tls`` False, encrypted but trusting any certificate. Raises ``ConfigError``
    naming ``ca_file`` when it cannot be read."""
    if not verify_tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise ConfigError(f"cannot read ca_file {ca_file}: {reason}") from exc


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer, not a pointer to follow (see the module's docstring)."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def http_request(
    url: str,
    *,
    timeout: float,
    tls: ssl.SSLContext,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> str | None:
    """Send one request and read the answer; None when it is 2xx, else why not, in words
    fit to be logged (``HTTP 503``, ``Connection refused``, ``redirected to https://sso``).
    Blocking: call it in a worker thread."""
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=tls))
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}), method=method)
    try:
        with opener.open(request, timeout=timeout) as response:
            status = int(response.status)
            response.read()
    except urllib.error.HTTPError as exc:
        location = exc.headers.get("Location") if exc.headers else None
        if 300 <= exc.code < 400 and location:
            target = redact_url(urljoin(url, location), origin_only=True)
            return f"HTTP {exc.code}, redirected to {target} (not followed)"
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return _reason(exc.reason)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return _reason(exc)
    return None if 200 <= status < 300 else f"HTTP {status}"


def _reason(exc: object) -> str:
    """Why a connection failed, from the error's kind (``str()`` of some repeats the URL)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not trusted ({exc.verify_message}): set ca_file"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason})"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, str):  # urllib's own complaint about the URL (which it repeats)
        return "not a URL it can request"
    if isinstance(exc, http.client.HTTPException | ValueError):
        return f"not a valid HTTP exchange ({type(exc).__name__})"
    return type(exc).__name__ if isinstance(exc, BaseException) else "connection failed"
