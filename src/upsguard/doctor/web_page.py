"""The web page's checks: what in its ``web:`` section weakens its guards.

A reverse proxy trusted on a loopback address shares that address with every process of
the machine: only its secret (``web.proxy.secret_file``) tells it apart, so that file must be
the proxy's and upsguard's alone.
"""

from __future__ import annotations

import ipaddress

from upsguard.config.site import SiteConfig
from upsguard.findings import Area, Finding, ok, warn

SUBJECT = "proxy"
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


def check_web(site: SiteConfig) -> list[Finding]:
    """One finding on the trusted proxy, when the page has one."""
    if site.web is None or site.web.proxy is None:
        return []
    proxy = site.web.proxy
    local = [
        str(network)
        for network in proxy.trusted
        if any(network.version == lo.version and network.overlaps(lo) for lo in LOOPBACK)
    ]
    if local:
        return [
            warn(
                Area.WEB,
                SUBJECT,
                "address",
                f"web.proxy.trusted {', '.join(local)} is loopback: every local process "
                "connects from it, and only the proxy's secret tells the proxy apart",
                f"keep {proxy.secret_file} readable by upsguard's user only (mode 0600; the "
                "proxy's own configuration holds a copy), or give the proxy an address of its "
                "own",
            )
        ]
    trusted = ", ".join(str(n) for n in proxy.trusted)
    return [ok(Area.WEB, SUBJECT, "address", f"web.proxy.trusted {trusted}: not loopback")]
