"""``scripts/setup --tests`` on a fresh Debian 12: the vCenter simulators need Go 1.22 or newer
and Debian 12's own golang is 1.19, so ``scripts/find-go`` looks for a Go that will do and, with
``--install``, installs golang-1.23-go from bookworm-backports when there is none.

The machine's own Go is hidden, never removed: each test runs the script in a mount namespace
of its own (``unshare --mount``) with an empty directory mounted over the Go it must not see,
and with a PATH whose only ``go`` is a stand-in answering as Debian 12's 1.19 does."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

# apt-get installs Go in one of them: with the package tests, one after the other (dpkg's lock)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dpkg")]

ROOT = Path(__file__).resolve().parents[2]
BACKPORTS_GO = "/usr/lib/go-1.23/bin/go"
DEBIAN_12_GO = """#!/bin/sh
# answers as Debian 12's golang-go (1.19) does
case "$*" in
  "env GOVERSION") echo go1.19.8 ;;
  version) echo "go version go1.19.8 linux/amd64" ;;
  *) echo "go: not this stand-in" >&2; exit 2 ;;
esac
"""


def find_go(tmp_path: Path, *args: str, hide: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """``scripts/find-go ARGS`` with the directories ``hide`` emptied and Debian 12's Go on
    the PATH."""
    old = tmp_path / "bin"
    old.mkdir(exist_ok=True)
    (old / "go").write_text(DEBIAN_12_GO)
    (old / "go").chmod(0o755)
    mounts = " && ".join(f"mount -t tmpfs none {shlex.quote(d)}" for d in hide if os.path.isdir(d))
    script = f"{mounts or 'true'} && exec scripts/find-go {' '.join(args)}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        cwd=ROOT,
        env={"PATH": f"{old}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ["HOME"]},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_without_a_go_that_builds_vcsim_it_says_so_and_names_the_old_one(tmp_path: Path) -> None:
    done = find_go(tmp_path, hide=("/usr/local/go", "/usr/lib/go-1.23"))
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines == [
        f"find-go: too old for vcsim (Go 1.22 or newer needed): {tmp_path}/bin/go (go1.19)",
        "find-go: no Go 1.22 or newer (vcsim needs one): run scripts/setup --tests",
    ]


def test_install_brings_go_1_23_from_backports_and_it_builds_the_simulator(
    tmp_path: Path,
) -> None:
    done = find_go(tmp_path, "--install", hide=("/usr/local/go",))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{BACKPORTS_GO}\n"
    version = subprocess.run(
        [BACKPORTS_GO, "env", "GOVERSION"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith("go1.23.")
    # the project's vcsim extension embeds govmomi v0.46.3's simulator: what vcsim is built of
    build = subprocess.run(
        [BACKPORTS_GO, "build", "-o", str(tmp_path / "upsguard-vcsim"), "."],
        cwd=ROOT / "tests" / "vcsim_ext",
        env={**os.environ, "GOTOOLCHAIN": "local"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert (tmp_path / "upsguard-vcsim").stat().st_size > 0


def test_a_go_on_the_path_that_will_do_comes_first(tmp_path: Path) -> None:
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "go").write_text(DEBIAN_12_GO.replace("1.19.8", "1.24.2"))
    (newer / "go").chmod(0o755)
    done = subprocess.run(
        ["scripts/find-go"],
        cwd=ROOT,
        env={"PATH": f"{newer}:/usr/bin:/bin", "HOME": os.environ["HOME"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{newer}/go\n", "")
