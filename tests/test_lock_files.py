"""The image installs only what the lock files pin, by hash: they must cover pyproject.toml's dependencies (and its
build backend) at versions its ranges allow, or the image would run something the package never asked for.
`make lock` regenerates them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The platform the lock is compiled for (Makefile LOCK_ARGS): the image's Linux and Python 3.13.
LOCK_ENVIRONMENT = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.13"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pins(lock: str) -> dict[str, tuple[str, list[str], str]]:
    """name -> (version, hashes, why) of a hashed requirements file: a pin's hashes and the compiler's `# via`
    comment (which requirements asked for it) follow it on the next lines."""
    found: dict[str, tuple[str, list[str], str]] = {}
    name = ""
    for line in (ROOT / lock).read_text().splitlines():
        if match := _PIN.match(line):
            name = canonicalize_name(match.group(1))
            found[name] = (match.group(2), [], "")
        elif name and (hashed := re.search(r"--hash=(sha256:[0-9a-f]{64})", line)):
            found[name][1].append(hashed.group(1))
        elif name and line.lstrip().startswith("#"):
            version, hashes, why = found[name]
            found[name] = (version, hashes, why + line)
    return found


# The extras the image has besides the dependencies (Makefile `lock`: --extra).
IMAGE_EXTRAS = ("tracing",)


def runtime_requirements() -> dict[str, Requirement]:
    """pyproject.toml's dependencies and the image's extras that apply on the lock's platform, by name."""
    project = PYPROJECT["project"]
    texts = [
        *project["dependencies"],
        *(text for extra in IMAGE_EXTRAS for text in project["optional-dependencies"][extra]),
    ]
    requirements = (Requirement(text) for text in texts)
    return {canonicalize_name(r.name): r for r in requirements if not r.marker or r.marker.evaluate(LOCK_ENVIRONMENT)}


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [
        ("requirements.lock", list(runtime_requirements().values())),
        ("requirements-build.lock", [Requirement(text) for text in PYPROJECT["build-system"]["requires"]]),
    ],
)
def test_lock_pins_every_requirement_within_its_range_with_hashes(lock: str, requirements: list[Requirement]) -> None:
    locked = pins(lock)
    assert locked, f"{lock} pins nothing"
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{lock} lacks {requirement} (pyproject.toml); run `make lock`"
        version = locked[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{lock} pins {name}=={version} outside pyproject.toml's {requirement}; run `make lock`"
        )
    unhashed = sorted(name for name, (_, hashes, _) in locked.items() if not hashes)
    assert not unhashed, f"{lock} pins without a hash: {unhashed}"


def test_lock_has_no_direct_pin_that_pyproject_no_longer_asks_for() -> None:
    direct = {name for name, (_, _, why) in pins("requirements.lock").items() if "(pyproject.toml)" in why}
    assert direct == set(runtime_requirements()), "requirements.lock is out of date: run `make lock`"
    makefile = (ROOT / "Makefile").read_text()
    assert all(f"--extra {extra}" in makefile for extra in IMAGE_EXTRAS), "`make lock` must lock the image's extras"


def test_the_dockerfile_installs_only_from_the_lock_files_by_hash() -> None:
    dockerfile = "\n".join(line for line in (ROOT / "Dockerfile").read_text().splitlines() if not line.startswith("#"))
    for lock in ("requirements.lock", "requirements-build.lock"):
        assert f"--require-hashes --no-deps -r {lock}" in dockerfile
    # Besides the locks, pip installs only the wheel built from this tree, without resolving anything.
    installs = re.findall(r"(?:RUN|&&) pip [^\n]*", dockerfile)
    assert installs and all("--no-deps" in line for line in installs), installs
