"""Settings of an app and its tasks: frozen, and checked against the invariants at construction.

Every check runs and all violations are reported together in one ``ConfigError``, each naming the
values involved and the fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ringfence.errors import ConfigError

MAX_ATTEMPTS_LIMIT = 100
# Job threads a worker starts with for sync handlers (``--threads``): two calls' I/O overlap; more start while calls
# wait and the threads are held by slow calls or sleep on I/O (worker/calls.py, SyncRunner._grows).
DEFAULT_THREADS = 2
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # always fullmatch: "^...$" accepts a final "\n"
NAME_RULE = "must be 1 to 64 characters of A-Z a-z 0-9 _ . - (nothing else: no space, no newline)"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt ``n`` waits ``uniform(0, min(cap_s, base_s * 2**(n-1)))``.

    ``max_attempts`` counts runs, the first one included.
    """

    max_attempts: int = 3
    base_s: float = 2.0
    cap_s: float = 300.0
    jitter: bool = True

    def ceiling_s(self, attempt: int) -> float:
        """The longest delay after failed attempt ``attempt`` (1-based)."""
        return float(min(self.cap_s, self.base_s * 2.0 ** (attempt - 1)))

    def total_ceiling_s(self) -> float:
        """The longest time all retries of one job can wait, added up."""
        return sum(self.ceiling_s(n) for n in range(1, self.max_attempts))

    def problems(self, where: str) -> list[str]:
        out = []
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            out.append(
                f"{where}: max_attempts={self.max_attempts} must be between 1 and {MAX_ATTEMPTS_LIMIT}; "
                "unbounded retries turn an outage into a retry storm"
            )
        if self.base_s <= 0 or self.cap_s < self.base_s:
            out.append(f"{where}: retry base_s={self.base_s} must be > 0 and cap_s={self.cap_s} >= base_s")
        return out


@dataclass(frozen=True)
class BreakerPolicy:
    """A circuit breaker for one dependency, shared by all workers through Redis.

    ``failures`` failed jobs within ``window_s`` open it; while open, jobs of the dependency wait (without
    burning attempts) for ``open_s``; then one probe job runs (half-open): success closes it, failure opens it
    again. ``rate_per_s`` optionally caps the jobs per second started against the dependency, across workers.
    """

    failures: int = 5
    window_s: float = 60.0
    open_s: float = 30.0
    probe_timeout_s: float = 60.0
    rate_per_s: int | None = None

    def problems(self, name: str) -> list[str]:
        out = []
        if self.failures < 1 or self.window_s <= 0 or self.open_s <= 0 or self.probe_timeout_s <= 0:
            out.append(f"breaker {name!r}: failures >= 1 and window_s, open_s, probe_timeout_s > 0 "
                       f"(got {self.failures}, {self.window_s}, {self.open_s}, {self.probe_timeout_s})")
        if self.rate_per_s is not None and self.rate_per_s < 1:
            out.append(f"breaker {name!r}: rate_per_s={self.rate_per_s} must be >= 1 or None")
        return out


@dataclass(frozen=True)
class WorkerSettings:
    """Timing of leases, heartbeats and shutdown, shared by the app's workers."""

    lease_s: float = 20.0
    max_lease_s: float = 3600.0
    heartbeat_s: float = 5.0
    recover_interval_s: float = 2.0
    promote_interval_s: float = 0.5
    shutdown_timeout_s: float = 25.0
    server_ttl_s: float = 30.0
    # A job this worker cannot read yet (newer payload version, unknown task) waits defer_s and is retried
    # without burning an attempt; past grace_s after its enqueue it alerts (newer version) or goes to
    # dead-letter (unknown task).
    defer_s: float = 30.0
    grace_s: float = 3600.0
    # Dead-letter retention: None keeps every dead job until you delete or prune it (the default).
    dead_retention_s: float | None = None
    # The outbox relay inside workers (docs/outbox.md): None is off; else seconds between looks at the outbox.
    # Every worker may run it; a lease in Redis lets one relay at a time.
    relay_outbox_s: float | None = None

    def problems(self) -> list[str]:
        out = []
        if self.heartbeat_s * 2 > self.lease_s:
            out.append(
                f"heartbeat_s={self.heartbeat_s} must be at most half of lease_s={self.lease_s}, "
                "or a live job loses its lease between two heartbeats; lower heartbeat_s or raise lease_s"
            )
        if self.lease_s > self.max_lease_s:
            out.append(f"lease_s={self.lease_s} must not exceed max_lease_s={self.max_lease_s}")
        if self.shutdown_timeout_s >= self.max_lease_s:
            out.append(
                f"shutdown_timeout_s={self.shutdown_timeout_s} must be below max_lease_s={self.max_lease_s}"
            )
        if self.defer_s <= 0 or self.grace_s < self.defer_s:
            out.append(f"defer_s={self.defer_s} must be > 0 and grace_s={self.grace_s} >= defer_s")
        if self.dead_retention_s is not None and self.dead_retention_s <= 0:
            out.append(f"dead_retention_s={self.dead_retention_s} must be > 0, or None to keep dead jobs")
        if self.relay_outbox_s is not None and not self.relay_outbox_s > 0:
            out.append(f"relay_outbox_s={self.relay_outbox_s} must be > 0 seconds, or None to relay elsewhere")
        if self.server_ttl_s <= self.heartbeat_s:
            out.append(f"server_ttl_s={self.server_ttl_s} must exceed heartbeat_s={self.heartbeat_s}")
        return out


@dataclass(frozen=True)
class TaskOptions:
    """Per-task options after defaults are applied."""

    name: str
    queue: str = "default"
    timeout_s: float = 300.0
    expiry_s: float | None = 86400.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def problems(self, worker: WorkerSettings) -> list[str]:
        where = f"task {self.name!r}"
        out = list(self.retry.problems(where))
        if not _NAME.fullmatch(self.queue):
            out.append(f"{where}: queue name {self.queue!r} {NAME_RULE}")
        if self.timeout_s <= 0:
            out.append(f"{where}: timeout_s={self.timeout_s} must be > 0")
        elif self.timeout_s >= worker.max_lease_s:
            out.append(
                f"{where}: timeout_s={self.timeout_s} must be below max_lease_s={worker.max_lease_s} "
                "(a job must be stopped before its lease can end); lower the timeout or raise max_lease_s"
            )
        if self.expiry_s is not None:
            total = self.retry.total_ceiling_s()
            if total >= self.expiry_s:
                out.append(
                    f"{where}: retries may wait {total:.0f}s in total (max_attempts="
                    f"{self.retry.max_attempts}, cap_s={self.retry.cap_s}) but expiry_s={self.expiry_s:.0f}; "
                    "the job would expire while waiting to retry: lower the attempts or cap, or raise expiry_s"
                )
        return out


def check(problems: list[str]) -> None:
    """Raise one ConfigError listing every problem, if any."""
    if problems:
        raise ConfigError(problems)


def check_name(kind: str, value: str) -> str:
    if type(value) is not str or not _NAME.fullmatch(value):
        raise ConfigError(f"{kind} {value!r} {NAME_RULE}")
    return value


def env_default(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def check_threads(threads: int | None, concurrency: int) -> int:
    """The job threads a worker starts with: ``threads`` when given (1 to ``concurrency``), else the default (one
    per slot at most)."""
    if threads is None:
        return min(DEFAULT_THREADS, concurrency)
    if not 1 <= threads <= concurrency:
        raise ConfigError(f"--threads {threads} must be between 1 and --concurrency ({concurrency}): "
                          "one job thread per slot at most")
    return threads
