"""Loaded only by the chaos run's skewed worker (its PYTHONPATH starts here), under libfaketime.

libfaketime 0.9.10 (Debian 12) fails every ``time.sleep`` with ``OSError: [Errno 22]``: Python 3.11 sleeps with
``clock_nanosleep(TIMER_ABSTIME)``, whose wrapper breaks the deadline. Every backoff of that worker would raise,
and the skew fault would test a worker that cannot sleep instead of a clock ahead. ``select`` sleeps as long and
is passed through unfaked.
"""

import select
import time
from typing import SupportsIndex


def _sleep(seconds: float | SupportsIndex) -> None:
    s = float(seconds)
    if s < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], s)


time.sleep = _sleep
