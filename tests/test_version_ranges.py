"""Every runtime dependency and extra has a range: a floor and a ceiling at a next major version; the floors of the
runtime dependencies and the database extras are exactly the versions `make test-floor` runs on (.ci/floors.txt)."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

from support import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FLOOR_TESTED = ("postgres", "mysql")  # the extras test-floor installs besides the runtime dependencies


def _floors() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            [spec] = req.specifier
            assert spec.operator == "==", line
            pins[req.name.lower()] = Version(spec.version)
    return pins


def _bounds(req: Requirement) -> tuple[Version | None, Version | None]:
    low = next((Version(s.version) for s in req.specifier if s.operator == ">="), None)
    high = next((Version(s.version) for s in req.specifier if s.operator == "<"), None)
    return low, high


def _released(extra: str | None) -> list[Requirement]:
    lines = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def test_every_dependency_and_extra_has_a_floor_and_a_major_ceiling() -> None:
    extras = [None, *(e for e in PROJECT["optional-dependencies"] if e != "dev")]
    unbounded = []
    for extra in extras:
        for req in _released(extra):
            low, high = _bounds(req)
            if low is None or high is None or high <= low or high.release[1:] not in ((), (0,), (0, 0)):
                unbounded.append(f"{extra or 'dependencies'}: {req}")
    assert unbounded == []


def test_the_floors_are_the_versions_test_floor_runs_on() -> None:
    pins = _floors()
    wrong = []
    for extra in (None, *FLOOR_TESTED):
        for req in _released(extra):
            low, _ = _bounds(req)
            if pins.get(req.name.lower()) != low:
                wrong.append(f"{req} (floors.txt: {pins.get(req.name.lower())})")
    assert wrong == []
