"""The Debian package as a sysadmin meets it: ``scripts/package`` builds it, ``apt-get install``
of the file installs it on this machine (a Debian 12), and ``apt-get purge`` takes away all it
and its service made. Each test installs it anew and purges it at its end.

The tests refuse to run where upsguard is already installed from a package: they would
purge it."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import shutil
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from upsguard.journal.schema import VERSION

# apt and dpkg hold one lock: the tests that install packages run one after the other
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dpkg"), pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
UNIT = Path("/lib/systemd/system/upsguard.service")
ENABLED = Path("/etc/systemd/system/multi-user.target.wants/upsguard.service")
COMMAND = Path("/usr/bin/upsguard")
"""The package's command, by its path: the lanes put the checkout's virtual environment, with
an ``upsguard`` of its own, first on the PATH."""
SITE = Path("/etc/upsguard/site.yaml")
EXAMPLE = Path("/etc/upsguard/site.yaml.example")
JOURNAL = Path("/var/lib/upsguard/package-test.sqlite")
"""The journal of the tests' site file (``site_file_of_its_own``)."""
# everything the package or its service makes: none of it is left after a purge
MADE = [
    Path("/usr/bin/upsguard"),
    Path("/opt/venvs/upsguard"),
    Path("/etc/upsguard"),
    UNIT,
    ENABLED,
    Path("/usr/lib/sysusers.d/upsguard.conf"),
    Path("/var/lib/upsguard"),
    Path("/run/upsguard"),
    Path("/var/lib/systemd/deb-systemd-helper-enabled/upsguard.service.dsh-also"),
    Path("/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/upsguard.service"),
]
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=120"]
ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def run(*argv: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=ENV, timeout=timeout
    )


def package_installed() -> bool:
    status = run("dpkg-query", "-W", "-f=${Status}", "upsguard")
    return status.returncode == 0 and "installed" in status.stdout


@pytest.fixture(scope="module")
def deb() -> Path:
    """The package of this checkout, built once (``scripts/package``: one and a half minutes
    on a quiet two-core machine, under three on a busy one)."""
    built = subprocess.run(
        ["scripts/package"], cwd=ROOT, capture_output=True, text=True, timeout=500
    )
    assert built.returncode == 0, built.stdout + built.stderr
    said = re.search(
        r"^package: (dist/upsguard_\S+\.deb) \((\S+), (\d+) KiB installed\)$", built.stdout, re.M
    )
    assert said is not None, built.stdout
    arch = run("dpkg", "--print-architecture").stdout.strip()
    assert re.fullmatch(rf"dist/upsguard_[0-9.]+(\+git\d+)?_{arch}\.deb", said[1])
    return ROOT / said[1]


@pytest.fixture
def installed(deb: Path) -> Iterator[subprocess.CompletedProcess[str]]:
    """The package installed (``apt-get install ./dist/...deb``, what the README says), and
    purged afterwards; yields the install's output."""
    if package_installed():
        pytest.fail("upsguard is installed from a package on this machine: purge it first")
    done = run(*APT, "install", deb, timeout=280)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield done
    finally:
        if package_installed():
            run(*APT, "purge", "upsguard")


def site_file_of_its_own() -> None:
    """The example as the site file, with a journal no other test's site names: the unit
    tests plan and simulate the example itself, and read its journal's learned durations."""
    example = EXAMPLE.read_text()
    assert f"journal: {JOURNAL.parent}/homelab.sqlite" in example
    SITE.write_text(example.replace("homelab.sqlite", JOURNAL.name, 1))


def reconfigure() -> subprocess.CompletedProcess[str]:
    """The package's postinst again, as an upgrade or ``dpkg-reconfigure`` runs it."""
    return run("dpkg-reconfigure", "-fnoninteractive", "upsguard")


def test_the_package_installs_the_command_a_sandboxed_unit_and_an_example_and_says_what_next(
    installed: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    assert Path("/usr/bin/upsguard").resolve() == Path("/opt/venvs/upsguard/bin/upsguard")
    assert (
        "upsguard: installed; the service waits for /etc/upsguard/site.yaml. Next:\n"
        "  cp /etc/upsguard/site.yaml.example /etc/upsguard/site.yaml"
    ) in installed.stdout
    # the group the socket and the site file belong to, from sysusers.d
    group = grp.getgrnam("upsguard")
    assert pwd.getpwnam("upsguard").pw_shell == "/usr/sbin/nologin"
    etc = Path("/etc/upsguard").stat()
    assert (etc.st_uid, etc.st_gid, stat.S_IMODE(etc.st_mode)) == (0, group.gr_gid, 0o750)
    conffiles = run("dpkg-query", "-W", "-f=${Conffiles}", "upsguard").stdout
    assert str(EXAMPLE) in conffiles
    assert not SITE.exists()
    assert not ENABLED.exists(), "enabled before there is a site file"

    demo = run(COMMAND, "demo", "--speed", "600", timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "final phase: normal" in demo.stdout

    validate = run(COMMAND, "validate", "-c", EXAMPLE)
    assert validate.returncode == 0, validate.stderr
    assert validate.stdout.startswith(f"{EXAMPLE}: ok: site 'homelab'")

    # the unit as installed: it verifies, and its sandbox scores 4.0 or less
    verify = run("systemd-analyze", "verify", UNIT)
    assert (verify.returncode, verify.stdout, verify.stderr) == (0, "", "")
    security = run("systemd-analyze", "security", "--offline=true", UNIT)
    figure = re.search(
        r"Overall exposure level for upsguard\.service: (\d+\.\d) (\w+)", security.stdout
    )
    assert figure is not None, security.stdout + security.stderr
    assert float(figure[1]) <= 4.0, security.stdout

    # the venv is whole: every dependency the lock gave, none missing
    check = run("/opt/venvs/upsguard/bin/python", "-m", "pip", "check")
    assert check.returncode == 0, check.stdout


def test_the_unit_is_enabled_only_once_the_site_file_validates(
    installed: subprocess.CompletedProcess[str],
) -> None:
    SITE.write_text("site: hq\nups: [{name: a}]\n")
    refused = reconfigure()
    assert refused.returncode == 0
    assert f"{SITE} does not validate; the service was neither enabled nor restarted" in (
        refused.stderr
    )
    assert not ENABLED.exists()

    shutil.copy(EXAMPLE, SITE)
    accepted = reconfigure()
    assert accepted.returncode == 0, accepted.stderr
    assert f"{SITE} validates; the service is enabled" in accepted.stdout
    assert ENABLED.resolve() == UNIT.resolve()


def test_purge_removes_everything_the_package_and_its_service_made(
    installed: subprocess.CompletedProcess[str],
) -> None:
    site_file_of_its_own()
    Path("/etc/upsguard/nut.pw").write_text("secret\n")
    assert reconfigure().returncode == 0
    assert ENABLED.exists()
    # what the service makes as it runs: its journal, its socket's directory
    demo = run(COMMAND, "demo", "--speed", "600", "--journal", JOURNAL, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert JOURNAL.exists()
    Path("/run/upsguard").mkdir(exist_ok=True)

    purged = run(*APT, "purge", "upsguard")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert not package_installed()
    assert [p for p in MADE if p.exists() or p.is_symlink()] == []
    with pytest.raises(KeyError):
        pwd.getpwnam("upsguard")
    with pytest.raises(KeyError):
        grp.getgrnam("upsguard")


@pytest.fixture(scope="module")
def previous_deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package of the commit before the journal's last migration was added (its schema
    one older), built from a clone of this checkout's history."""
    last = run("git", "-C", ROOT, "log", "-1", "--format=%H", "-G", "ALTER TABLE|CREATE TABLE",
               "--", "src/upsguard/journal/schema.py")  # fmt: skip
    if last.returncode != 0 or not last.stdout.strip():
        pytest.fail(f"the upgrade test needs this checkout's git history: {last.stderr.strip()}")
    clone = tmp_path_factory.mktemp("previous") / "upsguard"
    for argv in (
        ("git", "clone", "-q", "--no-checkout", ROOT, clone),
        ("git", "-C", clone, "checkout", "-q", f"{last.stdout.strip()}^"),
    ):
        done = run(*argv)
        assert done.returncode == 0, done.stderr
    built = subprocess.run(
        ["scripts/package"], cwd=clone, capture_output=True, text=True, timeout=500
    )
    assert built.returncode == 0, built.stdout + built.stderr
    said = re.search(r"^package: (dist/upsguard_\S+\.deb) ", built.stdout, re.M)
    assert said is not None, built.stdout
    return clone / said[1]


def test_an_upgrade_from_the_package_before_keeps_the_site_file_and_migrates_the_journal(
    previous_deb: Path, deb: Path
) -> None:
    """The package built before the journal's last migration, installed, with a site file
    and a journal holding an outage (the demo's); then ``apt-get install`` of this one over
    it. The site file stays as it was, the outage is in the report from the journal (which
    a read leaves at its schema), and the first write migrates it to this upsguard's: the
    service's start does, and here (no systemd) a ``release`` journaled while it is
    stopped."""
    if package_installed():
        pytest.fail("upsguard is installed from a package on this machine: purge it first")
    try:
        done = run(*APT, "install", previous_deb, timeout=280)
        assert done.returncode == 0, done.stdout + done.stderr
        site_file_of_its_own()
        site = SITE.read_bytes()
        demo = run(COMMAND, "demo", "--speed", "600", "--journal", JOURNAL, timeout=120)
        assert demo.returncode == 0, demo.stderr
        old_schema = user_version(JOURNAL)

        upgraded = run(*APT, "install", deb, timeout=280)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert "Unpacking upsguard" in upgraded.stdout and "over (" in upgraded.stdout
        assert SITE.read_bytes() == site
        report = run(COMMAND, "report", "-c", SITE, "--format", "md")
        assert report.returncode == 0, report.stderr
        assert "shutdown" in report.stdout, report.stdout
        assert user_version(JOURNAL) == old_schema < VERSION
        released = run(COMMAND, "release", "--yes", "-c", SITE)
        assert released.returncode == 0, released.stderr
        assert user_version(JOURNAL) == VERSION
    finally:
        if package_installed():
            run(*APT, "purge", "upsguard")


def user_version(journal: Path) -> int:
    with contextlib.closing(sqlite3.connect(journal)) as db:
        (version,) = db.execute("PRAGMA user_version").fetchone()
    return int(version)
