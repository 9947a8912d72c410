"""Worker recycling: ``--max-jobs-per-child`` and ``--max-memory-mb``. Past a limit, checked after each job, the
worker stops fetching, lets its running jobs finish and exits to be replaced (worker.py, supervisor.py)."""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ringfence.errors import ConfigError
from ringfence.worker.observers import Observer
from ringfence.worker.outcomes import Outcome


@dataclass(frozen=True)
class Limits:
    max_jobs: int | None = None
    max_memory_mb: float | None = None

    def check(self) -> Limits:
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError(f"--max-jobs-per-child {self.max_jobs} must be >= 1")
        if self.max_memory_mb is not None and not self.max_memory_mb > 0:
            raise ConfigError(f"--max-memory-mb {self.max_memory_mb:g} must be > 0")
        return self

    @classmethod
    def parse(cls, max_jobs: str | None, max_memory_mb: str | None) -> Limits:
        """The CLI's values, refused in one line unless a whole number >= 1 and a number of MB > 0."""
        try:
            jobs = None if max_jobs is None else int(max_jobs)
        except ValueError:
            raise ConfigError(f"--max-jobs-per-child {max_jobs!r} must be a whole number of jobs >= 1") from None
        try:
            mb = None if max_memory_mb is None else float(max_memory_mb)
        except ValueError:
            raise ConfigError(f"--max-memory-mb {max_memory_mb!r} must be a number of MB > 0") from None
        return cls(jobs, mb).check()

    def __bool__(self) -> bool:
        return self.max_jobs is not None or self.max_memory_mb is not None


def resident_mb() -> float:
    """This process's resident memory now (Linux: /proc/self/statm); elsewhere its peak."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KiB elsewhere
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class Recycler(Observer):
    """Counts the attempts that ran; tells ``on_limit`` once, with the reason, when a limit is passed."""

    def __init__(self, limits: Limits, on_limit: Callable[[str], None]) -> None:
        self.limits, self.on_limit = limits, on_limit
        self.jobs = 0
        self.fired = False

    def finished(self, task: str, queue: str, outcome: Outcome, duration_s: float) -> None:
        self.jobs += 1
        reason = self.reason()
        if reason is not None and not self.fired:
            self.fired = True
            self.on_limit(reason)

    def reason(self) -> str | None:
        limits = self.limits
        if limits.max_jobs is not None and self.jobs >= limits.max_jobs:
            return f"ran {self.jobs} job(s) (--max-jobs-per-child {limits.max_jobs})"
        if limits.max_memory_mb is not None:
            rss = resident_mb()
            if rss > limits.max_memory_mb:
                return f"resident memory {rss:.0f} MB (--max-memory-mb {limits.max_memory_mb:g})"
        return None


NO_LIMITS = Limits()
