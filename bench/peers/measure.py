"""The figures of one library, each against a private redis-server of its own (broker db 0, metrics db 15).

How a drain is timed: the workers start on an empty queue and run one warm-up job; then every worker process
is stopped (SIGSTOP to its process group), the jobs are enqueued, and all of them are resumed at once
(SIGCONT). The clock runs from the first poll that sees the metrics counter move to the poll that sees the
goal, so neither process start-up nor the enqueue is part of the figure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.peers.libs import ADAPTERS, Lib
from bench.peers.procs import Producer, RedisServer, Workers

POLL_S = 0.005
DONE, STARTS = "peers:done", "peers:starts"  # as in adapters/peerjob.py


@dataclass(frozen=True)
class Sizes:
    single: int = 5_000        # jobs enqueued one call each (or as many as fit in enqueue_budget_s)
    bulk: int = 20_000         # jobs enqueued through the library's bulk path (the same)
    enqueue_budget_s: float = 10.0
    drain: int = 20_000        # jobs per drain
    latency_rate: int = 200    # stamped jobs/s
    latency_s: float = 10.0
    memory: int = 5_000        # jobs whose Redis memory is measured
    backlog: int = 0           # pending jobs of the backlog figure (0: skipped)
    fill_budget_s: float = 20.0      # a drain's queue gets fewer jobs from a library that enqueues slower
    drain_timeout_s: float = 30.0    # a slower drain is reported from the jobs done by then
    start_timeout_s: float = 60.0    # worker start-up until the warm-up job ran
    settle_s: float = 2.0            # after the warm-up job, for the other processes to come up
    latency_grace_s: float = 20.0    # after the last stamped job is sent
    sigkill_wait_s: float = 90.0


# memory stays at 5,000 in a quick run: a hash-table per-job cost grows with its size (1,000 jobs flatter it)
QUICK = Sizes(single=500, bulk=2_000, drain=2_000, latency_s=2.0, memory=5_000, start_timeout_s=30.0, settle_s=1.0)


class Failed(Exception):
    """A figure that could not be taken (reported as failed, the run goes on)."""


class Session:
    """One library on one private redis-server."""

    def __init__(self, lib: Lib, sizes: Sizes, log_dir: str) -> None:
        self.lib, self.sizes, self.log_dir = lib, sizes, log_dir
        self.server = RedisServer(log_dir)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFENCE_", "PYTHON", "VIRTUAL_ENV"))}
        self.env.update({"PEERS_BROKER_URL": self.server.url(0), "PEERS_METRICS_URL": self.server.url(15),
                         "PYTHONPATH": ADAPTERS, "PATH": f"{lib.bin()}{os.pathsep}{os.environ.get('PATH', '')}"})
        self.log = os.path.join(log_dir, f"{lib.name}.log")
        self._producer: Producer | None = None

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer([os.path.join(self.lib.bin(), "python"), "produce.py", self.lib.producer],
                                      self.env, ADAPTERS, self.log)
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
        self.server.close()

    def fresh(self) -> None:
        """Stop the producer (a library may cache queue state) and empty the private server."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None
        self.server.wipe()

    def done(self) -> int:
        return int(self.server.metrics.get(DONE) or 0)

    def wait(self, what: str, ready: Callable[[], bool], timeout_s: float, workers: Workers | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if workers is not None and workers.dead():
                raise Failed(f"a worker exited while waiting for {what} (log {self.log})")
            if time.monotonic() > deadline:
                raise Failed(f"timed out after {timeout_s:g} s waiting for {what} (log {self.log})")
            time.sleep(POLL_S)

    def start_workers(self, processes: int) -> Workers:
        """Workers that have run one warm-up job, given ``settle_s`` for the rest to come up."""
        workers = Workers(self.lib.worker_argvs(processes, self.server.url(0)), self.env, ADAPTERS, self.log)
        try:
            before = self.done()
            self.producer.call(60, op="warm")
            self.wait("the warm-up job", lambda: self.done() > before, self.sizes.start_timeout_s, workers)
            time.sleep(self.sizes.settle_s)
        except BaseException:
            workers.stop()
            raise
        return workers

    # -- figures ---------------------------------------------------------------------------------------
    def enqueue(self) -> dict[str, float]:
        s = self.sizes
        self.fresh()
        self.producer.call(60, op="warm")
        single = self.producer.call(300, op="single", n=s.single, budget_s=s.enqueue_budget_s)
        self.fresh()
        self.producer.call(60, op="warm")
        bulk = self.producer.call(300, op="bulk", n=s.bulk, budget_s=s.enqueue_budget_s)
        self.fresh()
        return {"enqueue_single": single["n"] / single["seconds"], "enqueue_bulk": bulk["n"] / bulk["seconds"]}

    def memory(self) -> dict[str, float]:
        self.fresh()
        answer = self.producer.call(300, op="memory", n=self.sizes.memory, budget_s=self.sizes.enqueue_budget_s)
        out = {"bytes_per_job": float(answer["bytes_per_job"])}
        self.fresh()
        return out

    def drain(self, processes: int, jobs: int | None = None, pending: int | None = None) -> dict[str, Any]:
        """jobs/s of the first ``jobs`` (default ``sizes.drain``) of ``pending`` queued jobs."""
        jobs = jobs or self.sizes.drain
        pending = pending or jobs
        self.fresh()
        workers = self.start_workers(processes)
        try:
            workers.send(signal.SIGSTOP)
            base = self.done()
            budget = self.sizes.fill_budget_s if pending == jobs else 1e9  # the backlog is filled in full
            filled = int(self.producer.call(900, op="bulk", n=pending, budget_s=budget)["n"])
            goal = base + min(jobs, filled)
            workers.send(signal.SIGCONT)
            self.wait("the first job", lambda: self.done() > base, 30, workers)
            t0, d0 = time.perf_counter(), self.done()
            deadline = time.monotonic() + self.sizes.drain_timeout_s
            while (d1 := self.done()) < goal and time.monotonic() < deadline and not workers.dead():
                time.sleep(POLL_S)
            t1 = time.perf_counter()
            if workers.dead():
                raise Failed(f"a worker exited during the drain (log {self.log})")
        finally:
            workers.stop()
        self.fresh()
        return {"rate": (d1 - d0) / (t1 - t0), "partial": d1 < goal, "jobs": d1 - d0, "queued": filled}

    def latency(self) -> dict[str, float]:
        s = self.sizes
        self.fresh()
        workers = self.start_workers(1)
        try:
            sent = self.producer.call(s.latency_s * 3 + 60, op="rate", rate=s.latency_rate, seconds=s.latency_s)
            n = int(sent["n"])
            with contextlib.suppress(Failed):  # the percentiles count the missing ones as never started
                self.wait("the stamped jobs", lambda: self.server.metrics.llen(STARTS) >= n, s.latency_grace_s,
                          workers)
            raw = [x.split() for x in self.server.metrics.lrange(STARTS, 0, -1)]
        finally:
            workers.stop()
        self.fresh()
        lat = sorted((float(b) - float(a)) * 1000 for a, b in raw) + [float("inf")] * max(0, n - len(raw))
        return {"latency_p50": _pct(lat, 50), "latency_p99": _pct(lat, 99), "latency_missing": n - len(raw),
                "latency_achieved": float(sent["achieved"])}

    def sigkill(self) -> dict[str, Any]:
        """A job sleeping 600 s; 1 s after it starts, every process of its worker gets SIGKILL and a new
        worker starts at once. Seconds from the kill to the job's second start, or None (lost) after
        ``sigkill_wait_s``."""
        self.fresh()
        first = self.start_workers(1)
        try:
            self.producer.call(60, op="sleeper", seconds=600.0)
            self.wait("the job to start", lambda: self.server.metrics.llen(STARTS) >= 1, 30, first)
            time.sleep(1.0)
            first.send(signal.SIGKILL)
            killed = time.time()
        finally:
            first.stop(0)
        second = Workers(self.lib.worker_argvs(1, self.server.url(0)), self.env, ADAPTERS, self.log)
        try:
            try:
                self.wait("the job to start again", lambda: self.server.metrics.llen(STARTS) >= 2,
                          self.sizes.sigkill_wait_s, second)
            except Failed:
                if second.dead():
                    raise
                return {"sigkill_s": None}
            second_start = self.server.metrics.lindex(STARTS, 1)
            assert isinstance(second_start, bytes)
            started = float(second_start.split()[1])
            return {"sigkill_s": started - killed}
        finally:
            second.send(signal.SIGKILL)  # its job sleeps for minutes
            second.stop(0)
            self.fresh()


def _pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not values:
        return float("nan")
    return values[max(0, min(len(values) - 1, round(p / 100 * len(values) + 0.5) - 1))]


def median_spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)
