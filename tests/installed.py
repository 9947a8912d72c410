"""The package as a user gets it: the wheel built from this checkout, installed in a fresh virtualenv with no
dev extra (tests/test_install.py, tests/test_typing.py). The venv has no pip of its own: this venv's pip installs
into it (``pip --python``), reusing pip's cache, so a venv costs seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import ROOT

PIP = [sys.executable, "-m", "pip"]
DEV_ONLY = ("greenlet", "pytest", "mypy", "aiosqlite", "httpx")  # in the dev extra, in no documented extra


def build_wheel(into: Path) -> Path:
    """The wheel of this checkout (``pip wheel --no-deps``)."""
    run([*PIP, "wheel", "-q", "--no-deps", "-w", str(into), str(ROOT)])
    (wheel,) = into.glob("ringfence-*.whl")
    return wheel


def fresh_venv(wheel: Path, extra: str, where: Path) -> Path:
    """A new virtualenv at ``where`` with ``wheel`` installed, with ``extra`` (or none); returns its bin/."""
    run([sys.executable, "-m", "venv", "--without-pip", str(where)])
    python = where / "bin" / "python"
    target = f"ringfence[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
    run([*PIP, "--python", str(python), "install", "-q", "--disable-pip-version-check", target])
    return where / "bin"


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    """``cmd``, failing the test with its output when it fails (a pip that cannot install fails, never skips)."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


def venv_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a shell with the venv activated (its bin/ first on PATH, no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return {**env, **extra}
