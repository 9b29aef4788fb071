"""The locked dependencies (requirements/run.txt, requirements/test.txt, written by
``scripts/lock``) say the same as pyproject.toml's ranges: a range changed without running
``scripts/lock`` would install, everywhere the project installs, versions the range refuses or
miss a new dependency altogether (pip --require-hashes installs exactly the lock)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def locked(name: str) -> dict[str, Requirement]:
    """A lock's pins by canonical name (``pkg==1.2 ; marker``, each with its hashes)."""
    text = (ROOT / "requirements" / name).read_text()
    pins: dict[str, Requirement] = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            req = Requirement(line.removesuffix("\\").strip())
            pins[canonicalize_name(req.name)] = req
    return pins


def declared(*extras: str) -> list[Requirement]:
    """pyproject.toml's requirements with the given extras (``upsguard[x]`` expanded)."""
    reqs = [Requirement(r) for r in PYPROJECT["dependencies"]]
    for extra in extras:
        for text in PYPROJECT["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "upsguard":
                reqs += declared(*req.extras)
            else:
                reqs.append(req)
    return reqs


def version(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not pinned"
    return spec.version


@pytest.mark.parametrize(("lock", "extras"), [("run.txt", ()), ("test.txt", ("test",))])
def test_every_declared_dependency_is_locked_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    pins = locked(lock)
    for req in declared(*extras):
        pin = pins.get(canonicalize_name(req.name))
        assert pin is not None, f"{req.name} is not in requirements/{lock}: run scripts/lock"
        assert req.specifier.contains(version(pin), prereleases=True), (
            f"requirements/{lock} has {pin.name}=={version(pin)}, outside {req}: run scripts/lock"
        )


@pytest.mark.parametrize("lock", ["run.txt", "test.txt"])
def test_every_pin_has_its_hashes(lock: str) -> None:
    lines = (ROOT / "requirements" / lock).read_text().splitlines()
    pins = [n for n, line in enumerate(lines) if line and not line[0].isspace() and line[0] != "#"]
    assert len(pins) > 40
    for n in pins:
        assert lines[n + 1].startswith("    --hash=sha256:"), f"{lines[n]} has no hash"


def test_the_tests_run_the_versions_the_service_ships() -> None:
    run, test = locked("run.txt"), locked("test.txt")
    assert {n: version(r) for n, r in run.items()} == {n: version(test[n]) for n in run}, (
        "requirements/test.txt differs from run.txt: run scripts/lock"
    )


def test_the_etcd_client_is_etcd3aio() -> None:
    pins = locked("run.txt")
    assert "etcd3aio" in pins
    assert "aetcd" not in pins
