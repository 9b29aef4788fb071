"""``upsguard init``: a first site file from what vCenter and upsd say.

It reads vCenter's inventory through the vSphere platform (the read ``upsguard inventory``
makes: hosts, clusters, VMs, vCLS VMs marked as the system's) and asks vCenter which VM runs
it; it asks upsd which UPSes it serves (``LIST UPS``). ``config.draft`` writes the file from
that. The vCenter password is read from a file, never from the command line, and the file
written names that file, never the password.

Nothing is written when anything cannot be read: a site file with a UPS or a host missing
would validate and plan and still be wrong.
"""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from upsguard.cli.common import Subparsers, run_async
from upsguard.errors import PermanentError, PlatformUnreachable, UpsUnreachable

if TYPE_CHECKING:
    from upsguard.config.draft import FoundNut, FoundVcenter

NUT_PORT = 3493
VSPHERE_PORT = 443
#: How long upsd has to answer ``LIST UPS``.
NUT_TIMEOUT_S = 5.0


def register(commands: Subparsers) -> None:
    """Add ``init``."""
    p = commands.add_parser(
        "init",
        help="draft a commented site file from vCenter's inventory and upsd's UPSes",
        description="Read vCenter's hosts and VMs and the UPSes upsd serves, and write a "
        "site file that validates and plans; what only a person knows is a TODO comment.",
    )
    p.add_argument(
        "--vcenter",
        required=True,
        type=vcenter_address,
        metavar="URL",
        help="vCenter (or one ESXi host): https://HOST[:PORT] or HOST[:PORT]",
    )
    p.add_argument("--user", required=True, help="the vCenter user, e.g. upsguard@vsphere.local")
    p.add_argument(
        "--password-file",
        required=True,
        type=Path,
        metavar="FILE",
        help="a file holding the user's password (never on the command line)",
    )
    tls = p.add_mutually_exclusive_group()
    tls.add_argument(
        "--ca-file", type=Path, metavar="FILE", help="CA bundle that signs vCenter's certificate"
    )
    tls.add_argument(
        "--insecure", action="store_true", help="do not check vCenter's certificate (a lab)"
    )
    p.add_argument(
        "--nut",
        required=True,
        type=nut_address,
        metavar="HOST[:PORT]",
        help=f"the upsd whose UPSes to list (port {NUT_PORT} unless given)",
    )
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here, not to stdout")
    p.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    p.set_defaults(handler=cmd_init)


def vcenter_address(text: str) -> tuple[str, int]:
    """An argparse type: ``https://vcsa.lab[:443][/sdk]`` or ``vcsa.lab[:443]``."""
    url = urlsplit(text if "://" in text else f"https://{text}")
    if url.scheme != "https":
        raise argparse.ArgumentTypeError(f"{text!r}: vCenter speaks https://")
    try:
        port = url.port or VSPHERE_PORT
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: not a port: give HOST[:PORT]") from exc
    if not url.hostname or url.username or url.password:
        raise argparse.ArgumentTypeError(f"{text!r}: give https://HOST[:PORT], without a user")
    return url.hostname, port


def nut_address(text: str) -> tuple[str, int]:
    """An argparse type: ``HOST``, ``HOST:PORT``, ``[IPv6]:PORT`` or a bare IPv6 address."""
    host, port = text, NUT_PORT
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            port = _port(text, rest.removeprefix(":"))
    elif text.count(":") == 1:
        host, _, given = text.partition(":")
        port = _port(text, given)
    elif ":" in text:
        try:
            ipaddress.IPv6Address(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: write [ADDRESS]:PORT") from exc
    if not host:
        raise argparse.ArgumentTypeError(f"{text!r}: give HOST[:PORT]")
    return host, port


def _port(text: str, given: str) -> int:
    if not given.isdigit() or not 1 <= int(given) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: the port is a number from 1 to 65535")
    return int(given)


def cmd_init(args: argparse.Namespace) -> int:
    from upsguard.cli.reports import write_output
    from upsguard.config.draft import draft_site

    output: Path | None = args.output
    if output is not None and output.exists() and not args.force:
        raise PermanentError(f"{output} exists: give --force to overwrite it, or another -o")
    password_file = _checked_password_file(args.password_file)
    nut = run_async(read_upsd(*args.nut))
    host, port = args.vcenter
    vcenter = run_async(
        read_vcenter(
            host,
            port,
            args.user,
            password_file,
            verify_tls=not args.insecure,
            ca_file=args.ca_file.absolute() if args.ca_file else None,
        )
    )
    text = draft_site(vcenter, nut)
    write_output(text, output, "the site file")
    if output is not None:
        print(
            f"{output}: {len(nut.upses)} UPS, {len(vcenter.hosts)} host(s), "
            f"{sum(not v.system for v in vcenter.vms)} VM(s): fill in its TODOs, then "
            f"'upsguard validate -c {output}'"
        )
    return 0


def _checked_password_file(path: Path) -> Path:
    """The password file as the site file will name it (absolute), once it reads here."""
    from upsguard.config.types import resolve_secret
    from upsguard.errors import ConfigError

    try:
        secret = resolve_secret("--password-file", path, None)
    except ConfigError as exc:
        raise PermanentError(f"{exc}: give a file holding the vCenter user's password") from None
    if not secret:
        raise PermanentError(f"--password-file: {path} is empty: write the password into it")
    return path.absolute()


async def read_upsd(host: str, port: int) -> FoundNut:
    """The UPSes upsd serves; ``UpsUnreachable`` naming it when it does not answer."""
    from upsguard.config.draft import FoundNut
    from upsguard.plugins.ups.nut import served_upses

    try:
        upses = await served_upses(host, port, NUT_TIMEOUT_S)
    except UpsUnreachable as exc:
        raise UpsUnreachable(
            f"{exc}: check --nut, and that upsd listens there (LISTEN in upsd.conf)"
        ) from exc
    if not upses:
        raise PermanentError(
            f"upsd {host}:{port} serves no UPS: configure one in ups.conf and start its driver"
        )
    return FoundNut(host, port, upses)


async def read_vcenter(
    host: str,
    port: int,
    user: str,
    password_file: Path,
    *,
    verify_tls: bool,
    ca_file: Path | None,
) -> FoundVcenter:
    """vCenter's hosts and VMs through the vSphere platform, and which VM runs vCenter."""
    from upsguard.clock import SystemClock
    from upsguard.config.draft import PLATFORM, FoundHost, FoundVcenter, FoundVm
    from upsguard.config.platforms import VsphereSettings
    from upsguard.models import PlatformName
    from upsguard.plugins import catalog
    from upsguard.plugins.platforms.base import InventorySource, ManagerVmSource, Platform

    settings = VsphereSettings(
        type="vsphere",
        host=host,
        port=port,
        user=user,
        password_file=password_file,
        verify_tls=verify_tls,
        ca_file=ca_file,
    )
    vsphere = catalog.load("platform", "vsphere")
    platform: Platform = vsphere(PlatformName(PLATFORM), settings, SystemClock())
    assert isinstance(platform, InventorySource)
    try:
        await platform.open()
        report = await platform.inventory_report()
        manager = await platform.manager_vm() if isinstance(platform, ManagerVmSource) else None
    except PlatformUnreachable as exc:
        raise PlatformUnreachable(f"{exc}: check --vcenter") from exc
    finally:
        await platform.close()
    return FoundVcenter(
        host=host,
        port=port,
        user=user,
        password_file=password_file,
        verify_tls=verify_tls,
        ca_file=ca_file,
        hosts=[FoundHost(h["name"], h["cluster"]) for h in report["hosts"]],
        vms=[FoundVm(v["name"], v["host"], v["power"], v["system"]) for v in report["vms"]],
        manager_vm=manager,
    )
