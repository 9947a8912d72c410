"""workerapp's app, in a process whose interpreter teardown is slow: an object freed with the module writes a
file (TEST_TEARDOWN_MARK), then sleeps. The interpreter gives signal handlers back to their defaults before it
frees modules, so a signal sent after the mark lands in the part of the exit no Python handler covers."""

from __future__ import annotations

import os
import time
from pathlib import Path

from workerapp import app


class _SlowTeardown:
    def __del__(self) -> None:
        Path(os.environ["TEST_TEARDOWN_MARK"]).write_text("1")
        time.sleep(3)


_slow = _SlowTeardown()

__all__ = ["app"]
