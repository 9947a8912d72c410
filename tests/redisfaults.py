"""Helpers of the Redis fault tests: worker processes of tests/faultapp.py, run records in files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from support import ROOT


class FaultWorker:
    """A worker process of faultapp.py; its output goes to a file so a test can count its log lines."""

    def __init__(self, url: str, namespace: str, directory: Path, queues: str, *, prefix: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, name: str = "worker") -> None:
        self.log_path = directory / f"{name}.log"
        full_env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": namespace,
                    "FAULT_DIR": str(directory), "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}"
                    f"{os.environ.get('PYTHONPATH', '')}", **(env or {})}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "ringfence.cli", "worker", "--app", "faultapp:app", "--queues",
                 queues, "--concurrency", "10", "--no-alerts"],
                env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)


def runs(directory: Path, kind: str = "started") -> Counter[str]:
    """Job id -> how many runs left a ``kind`` mark."""
    return Counter(p.name.split(".")[0] for p in directory.glob(f"*.{kind}"))
