"""One virtualenv per library under bench/peers/.venvs (git-ignored), made on first use from
requirements-<name>.txt; remade when that file changes. ringfence's venv installs this repo (editable)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from bench.peers.libs import HERE, ROOT, VENVS


def _stamp(name: str) -> str:
    if name == "ringfence":
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            return "editable " + hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(HERE, f"requirements-{name}.txt"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ensure(name: str, say: object = print) -> str:
    """The venv directory of ``name``, created and installed if missing or stale."""
    path = os.path.join(VENVS, name)
    stamp_file = os.path.join(path, ".peers-stamp")
    stamp = _stamp(name)
    if os.path.exists(stamp_file):
        with open(stamp_file) as f:
            if f.read() == stamp:
                return path
    if callable(say):
        say(f"creating venv {path} (first run or changed requirements; takes a minute)")
    os.makedirs(VENVS, exist_ok=True)
    subprocess.run([_base_python(), "-m", "venv", "--clear", path],
                   check=True, timeout=300)
    pip = [os.path.join(path, "bin", "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    args = [*pip, "-e", ROOT] if name == "ringfence" else [*pip, "-r", os.path.join(HERE, f"requirements-{name}.txt")]
    with open(os.path.join(VENVS, f"{name}.log"), "wb") as log:
        subprocess.run(args, check=True, timeout=900, stdout=log, stderr=subprocess.STDOUT)
    with open(stamp_file, "w") as f:
        f.write(stamp)
    return path


def _base_python() -> str:
    """The interpreter outside any venv (the harness venv is made from it)."""
    return getattr(sys, "_base_executable", sys.executable)


def version(name: str, package: str) -> str:
    py = os.path.join(VENVS, name, "bin", "python")
    out = subprocess.run([py, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "?"
