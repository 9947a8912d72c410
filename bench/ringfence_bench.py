"""The ringfence benchmark: ``python -m bench [--quick] [--json] [--only NAMES]`` from the repo root (``make bench``).

Everything runs against a private redis-server started on a free loopback port and stopped at the end;
workers are real ``python -m ringfence.cli worker --app bench.ringfence_bench:app`` processes, so this module
also defines the app they serve (importing it starts nothing). Figures:

- ``enqueue``  jobs/s: one ``task.enqueue`` per job, and ``app.enqueue_many`` in batches of 1,000
- ``drain``    jobs/s for 1 and 2 worker processes on 20,000 queued no-op jobs
- ``latency``  enqueue-to-start p50/p99 at a steady 200 jobs/s, one warm worker
- ``memory``   Redis bytes per queued no-op job (``used_memory`` before/after 100,000 jobs)
- ``backlog``  drain jobs/s of the first 20,000 of 1,000,000 pending, against the same drain on an empty queue
- ``sigkill``  seconds until a job whose worker was SIGKILLed mid-job starts again (default settings)
- ``fence``    opt-in (``--only fence``, needs PostgreSQL): fenced no-op effects vs plain no-op jobs, 1 and 2
               processes, sync and async handlers; round trips and ms per fenced job (``bench/fence_bench.py``)

How a drain is timed: the jobs are enqueued into a paused queue, the workers start and go idle, the queue is
unpaused and one more job is enqueued, whose wake-up message starts every worker at once. The clock runs
from the first poll that sees the queue's ``processed`` counter move to the poll that sees the goal reached,
and the rate counts only the jobs acked in between, so process start-up is never part of the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

from bench import fence_bench as bench_fence
from bench.servers import stop_workers
from ringfence.app import App
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.tasks import JobContext, Task

QUEUE = "bench"
BACKLOG_QUEUE = "bench-backlog"
LATENCY_KEY = "bench:latency"   # list: "<ms from ctx.enqueued_ms> <ms from the float send time>" per probe job
STARTS_KEY = "bench:starts"     # list: "<attempt> <unix time s>" per sleeper start
POLL_S = 0.005
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: `bench` is imported from it


# -- the app the worker processes serve ----------------------------------------------------------------
async def noop(ctx: JobContext) -> None:
    """The no-op job of the throughput figures."""


async def probe(ctx: JobContext, sent: float) -> None:
    """Record how long after its enqueue this job started (``sent`` is the producer's time.time())."""
    now_ms = time.time() * 1000
    await app.broker.aio.rpush(LATENCY_KEY, f"{now_ms - ctx.enqueued_ms:.3f} {now_ms - sent * 1000:.3f}")


async def sleeper(ctx: JobContext, seconds: float) -> None:
    """Record each start, then sleep: the job the SIGKILL figure kills its worker under."""
    await app.broker.aio.rpush(STARTS_KEY, f"{ctx.attempt} {time.time():.6f}")
    await asyncio.sleep(seconds)


def build_app(redis_url: str | None = None, fence_url: str | None = None) -> App:
    """The bench app with default settings. Names are explicit: under ``-m`` this module is ``__main__``.
    The fence figure's workers get their database from ``RINGFENCE_FENCE_URL``."""
    bench = App(redis_url, fence_url=fence_url)
    bench.task(name="bench.noop", queue=QUEUE)(noop)
    bench.task(name="bench.probe", queue=QUEUE)(probe)
    bench.task(name="bench.sleeper", queue=QUEUE)(sleeper)
    for fn in (bench_fence.fenced_sync, bench_fence.fenced_async, bench_fence.noop_sync, bench_fence.noop_async):
        bench.task(name=f"bench.{fn.__name__}", queue=QUEUE)(fn)
    return bench


app = build_app()  # what `ringfence worker --app bench.ringfence_bench:app` runs; the URL comes from the environment


# -- sizes and results ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    single: int = 10_000          # jobs enqueued one call each
    bulk: int = 200_000           # jobs enqueued by enqueue_many
    batch: int = 1_000            # jobs per enqueue_many call
    drain: int = 20_000           # no-op jobs drained per run
    reps: int = 5                 # drain runs per figure; the median is reported
    latency_rate: int = 200       # probe jobs/s
    latency_s: float = 10.0
    memory: int = 100_000         # jobs whose memory is measured
    backlog: int = 1_000_000      # pending jobs of the backlog figure
    concurrency: int = 10         # --concurrency of every worker (the CLI default)
    threads: int | None = None    # --threads of every worker (None: the CLI default)
    fence: int = 5_000            # jobs per drain of the fence figure (fenced, and plain for comparison)
    fence_reps: int = 3           # interleaved plain/fenced drain pairs per fence figure; medians reported
    fence_alone: int = 300        # fenced jobs run one after another in-process (latency of one job)


QUICK = Sizes(single=2_000, bulk=30_000, drain=5_000, reps=1, latency_s=3.0, memory=20_000, backlog=100_000,
              fence=1_000, fence_reps=1, fence_alone=50)
FIGURES = ("enqueue", "drain", "latency", "memory", "backlog", "sigkill", "fence")
OPT_IN = ("fence",)  # needs PostgreSQL: only with --only
QUICK_SKIPS = ("sigkill",)  # ~20 s of waiting for a lease to expire does not fit a 30-second run


@dataclass(frozen=True)
class Target:
    figure: str
    text: str
    check: Callable[[dict[str, Any]], bool | None]


def _ratio(r: dict[str, Any]) -> float | None:
    """Backlog drain over the empty-queue drain of the runs interleaved with it."""
    if "drain_backlog_jobs_s" not in r:
        return None
    return float(r["drain_backlog_jobs_s"] / r["drain_backlog_empty_jobs_s"])


def _cmp(key: str, ok: Callable[[float], bool]) -> Callable[[dict[str, Any]], bool | None]:
    return lambda r: None if r.get(key) is None else ok(r[key])


def _backlog_ok(r: dict[str, Any]) -> bool | None:
    ratio = _ratio(r)
    return None if ratio is None else ratio >= 0.9


TARGETS = (
    Target("drain", "drain, 1 process >= 5,000 jobs/s", _cmp("drain_1_jobs_s", lambda v: v >= 5_000)),
    Target("enqueue", "bulk enqueue >= 30,000 jobs/s", _cmp("enqueue_bulk_jobs_s", lambda v: v >= 30_000)),
    Target("latency", "p99 enqueue-to-start <= 2 ms at 200 jobs/s (ctx.enqueued_ms, whole ms)",
           _cmp("latency_p99_ms", lambda v: v <= 2.0)),
    Target("latency", "  same, timed from a float time.time() taken before the enqueue call",
           _cmp("latency_exact_p99_ms", lambda v: v <= 2.0)),
    Target("memory", "<= 200 bytes per queued job", _cmp("bytes_per_job", lambda v: v <= 200)),
    Target("backlog", "drain with 1M pending within 10% of an empty queue", _backlog_ok),
    Target("sigkill", "SIGKILL recovery <= 30 s", _cmp("sigkill_recovery_s", lambda v: v <= 30.0)),
)


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the harness ---------------------------------------------------------------------------------------
class Bench:
    def __init__(self, redis_url: str, sizes: Sizes, log_dir: str) -> None:
        self.url = redis_url
        self.sizes = sizes
        self.log_dir = log_dir
        self.app = build_app(redis_url)
        self.broker = self.app.broker
        self.results: dict[str, Any] = {}
        self._workers = 0
        self.worker_env: dict[str, str] = {}  # extra environment of the worker processes
        self.last_drain_cpu_s = 0.0            # worker CPU (user + system) over the last timed drain
        self.last_drain_jobs = 0               # jobs acked in that interval
        self.last_drain_busy_cores = 0.0       # busy cores of the whole machine over that interval
        self.fence_url = bench_fence.DEFAULT_FENCE_URL

    def task(self, name: str) -> Task:
        found = self.app.registry.get(name)
        assert found is not None
        return found

    def reset(self) -> None:
        self.broker.sync.flushall()
        self.app.client._known_queues.clear()  # the queue set was flushed with the rest

    def enqueue_bulk(self, n: int, queue: str = QUEUE) -> float:
        """Enqueue ``n`` no-op jobs in batches; returns the seconds it took."""
        noop_task, batch = self.task("bench.noop"), self.sizes.batch
        t0 = time.perf_counter()
        for done in range(0, n, batch):
            self.app.enqueue_many(noop_task, [{}] * min(batch, n - done), queue=queue)
        return time.perf_counter() - t0

    @contextmanager
    def workers(self, n: int, queue: str = QUEUE) -> Iterator[list[subprocess.Popen[bytes]]]:
        """``n`` real worker processes, stopped with SIGTERM (then SIGKILL) on exit."""
        env = {**os.environ, "RINGFENCE_REDIS_URL": self.url, **self.worker_env,
               "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
        procs = []
        for _ in range(n):
            self._workers += 1
            with open(os.path.join(self.log_dir, f"worker-{self._workers}.log"), "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "ringfence.cli", "--log-level", "WARNING", "worker",
                     "--app", "bench.ringfence_bench:app", "--queues", queue,
                     "--concurrency", str(self.sizes.concurrency),
                     *(["--threads", str(self.sizes.threads)] if self.sizes.threads else [])],
                    env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        try:
            yield procs
        finally:
            stop_workers(procs)

    def wait_for(self, what: str, ready: Callable[[], bool], timeout_s: float = 60.0,
                 procs: Sequence[subprocess.Popen[bytes]] = ()) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a worker exited while waiting for {what}; logs in {self.log_dir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}; logs in {self.log_dir}")
            time.sleep(POLL_S)

    def wait_idle(self, procs: list[subprocess.Popen[bytes]], queue: str = QUEUE) -> None:
        idle = self.broker.keys.queue(queue).idle
        self.wait_for(f"{len(procs)} idle worker(s)", lambda: self.broker.sync.zcard(idle) >= len(procs),
                      procs=procs)

    def processed(self, queue: str) -> int:
        return int(self.broker.queue_counts(queue)["stats"].get("processed", 0))

    def timed_drain(self, n_workers: int, jobs: int, queue: str = QUEUE) -> float:
        """Drain ``jobs`` of the paused, filled ``queue`` with fresh workers; returns jobs/s. Leaves it paused."""
        with self.workers(n_workers, queue) as procs:
            self.wait_idle(procs, queue)
            before = self.processed(queue)
            self.broker.set_paused(queue, False)
            # The wake-up job: its message starts every idle worker at once. It is the newest, so it runs last.
            self.task("bench.noop").with_options(queue=queue).enqueue()
            goal = before + jobs
            self.wait_for("the first ack", lambda: self.processed(queue) > before, procs=procs)
            pids = [p.pid for p in procs]
            t0, p0, c0, m0 = (time.perf_counter(), self.processed(queue), bench_fence.proc_cpu_s(pids),
                              bench_fence.machine_busy_s())
            self.wait_for(f"{jobs} acks", lambda: self.processed(queue) >= goal, timeout_s=300, procs=procs)
            t1, p1, c1, m1 = (time.perf_counter(), self.processed(queue), bench_fence.proc_cpu_s(pids),
                              bench_fence.machine_busy_s())
            self.broker.set_paused(queue, True)
        self.last_drain_cpu_s, self.last_drain_jobs = c1 - c0, p1 - p0
        self.last_drain_busy_cores = (m1 - m0) / (t1 - t0)
        return (p1 - p0) / (t1 - t0)

    def drain_empty(self, n_workers: int) -> float:
        """Fill the paused, empty ``QUEUE`` with ``sizes.drain`` jobs and drain all of them."""
        self.broker.set_paused(QUEUE, True)
        self.enqueue_bulk(self.sizes.drain)
        rate = self.timed_drain(n_workers, self.sizes.drain + 1)  # +1: the wake-up job, acked last
        say(f"  drain of {self.sizes.drain:,} queued, {n_workers} process(es): {rate:,.0f} jobs/s")
        return rate

    # -- figures -------------------------------------------------------------------------------------
    def fig_enqueue(self) -> None:
        s, r = self.sizes, self.results
        self.reset()
        noop_task = self.task("bench.noop")
        noop_task.enqueue()  # connect and load the script outside the timing
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(s.single):
            noop_task.enqueue()
        r["enqueue_single_jobs_s"] = s.single / (time.perf_counter() - t0)
        # The producer's own CPU (user + system) per call: steadier than the rate on a shared machine.
        r["enqueue_single_cpu_us"] = (time.process_time() - c0) / s.single * 1e6
        self.reset()
        noop_task.enqueue()
        r["enqueue_bulk_jobs_s"] = s.bulk / self.enqueue_bulk(s.bulk)
        r["enqueue_bulk_batch"] = s.batch

    def fig_drain(self) -> None:
        self.reset()
        for n in (1, 2):
            runs = [self.drain_empty(n) for _ in range(self.sizes.reps)]
            self.results[f"drain_{n}_jobs_s"] = statistics.median(runs)
            self.results[f"drain_{n}_runs"] = [round(x) for x in runs]

    def fig_backlog(self) -> None:
        """Runs alternate between the backlog queue and an empty one, so drift of the machine hits both."""
        s = self.sizes
        self.reset()
        self.broker.set_paused(BACKLOG_QUEUE, True)
        say(f"  enqueueing {s.backlog:,} jobs")
        self.enqueue_bulk(s.backlog, BACKLOG_QUEUE)
        empty, full = [], []
        for _ in range(s.reps):
            empty.append(self.drain_empty(1))
            full.append(self.timed_drain(1, s.drain, BACKLOG_QUEUE))
            say(f"  drain of the first {s.drain:,} of {s.backlog:,} pending, 1 process: {full[-1]:,.0f} jobs/s")
        self.results.update({
            "backlog_jobs": s.backlog,
            "drain_backlog_jobs_s": statistics.median(full),
            "drain_backlog_empty_jobs_s": statistics.median(empty),
            "drain_backlog_runs": [round(x) for x in full], "drain_backlog_empty_runs": [round(x) for x in empty],
        })
        self.results["drain_backlog_ratio"] = _ratio(self.results)

    def fig_memory(self) -> None:
        self.reset()
        self.task("bench.noop").enqueue()
        keys = self.broker.keys.queue(QUEUE)
        self.broker.sync.delete(keys.pending, keys.jobs)  # keep the queue's small keys, not the job
        before = self.broker.memory_usage()
        self.enqueue_bulk(self.sizes.memory)
        self.results["bytes_per_job"] = (self.broker.memory_usage() - before) / self.sizes.memory

    def fig_latency(self) -> None:
        s = self.sizes
        self.reset()
        probe_task = self.task("bench.probe")
        with self.workers(1) as procs:
            self.wait_idle(procs)
            self.send_probes(probe_task, s.latency_rate, 1.0, procs)  # warm-up, not counted
            self.broker.sync.delete(LATENCY_KEY)
            n, achieved = self.send_probes(probe_task, s.latency_rate, s.latency_s, procs)
            raw = [x.split() for x in self.broker.sync.lrange(LATENCY_KEY, 0, -1)]
        by_ctx = sorted(float(a) for a, _ in raw)
        exact = sorted(float(b) for _, b in raw)
        self.results.update({
            "latency_jobs": n, "latency_rate_jobs_s": achieved,
            "latency_p50_ms": _pct(by_ctx, 50), "latency_p99_ms": _pct(by_ctx, 99), "latency_max_ms": by_ctx[-1],
            "latency_exact_p50_ms": _pct(exact, 50), "latency_exact_p99_ms": _pct(exact, 99),
        })

    def send_probes(self, task: Task, rate: int, seconds: float,
                    procs: list[subprocess.Popen[bytes]]) -> tuple[int, float]:
        """Enqueue at a steady ``rate`` (absolute schedule, no drift); wait until every probe ran."""
        n = int(rate * seconds)
        start = self.broker.sync.llen(LATENCY_KEY)
        t0 = time.perf_counter()
        for i in range(n):
            # A random sub-ms phase: on an exact 5 ms grid every send would sit at the same point of the
            # millisecond, and the truncation of ctx.enqueued_ms would bias every sample by the same amount.
            pause = t0 + i / rate + random.random() / 1000 - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            task.enqueue(sent=time.time())
        achieved = n / (time.perf_counter() - t0) if n > 1 else float(rate)
        self.wait_for("the probes", lambda: self.broker.sync.llen(LATENCY_KEY) >= start + n, procs=procs)
        return n, achieved

    def build_app(self, fence_url: str | None = None) -> App:
        return build_app(self.url, fence_url=fence_url)

    def fig_fence(self) -> None:
        bench_fence.fig_fence(self, self.fence_url)

    def fig_sigkill(self) -> None:
        self.reset()
        with self.workers(1) as first:
            self.wait_idle(first)
            self.task("bench.sleeper").enqueue(seconds=600.0)
            self.wait_for("the job to start", lambda: self.broker.sync.llen(STARTS_KEY) >= 1, procs=first)
            time.sleep(1.0)  # mid-job
            killed = time.time()
            first[0].kill()
            first[0].wait()
        with self.workers(1) as second:
            self.wait_for("the job to run again", lambda: self.broker.sync.llen(STARTS_KEY) >= 2, timeout_s=120,
                          procs=second)
            attempt, started = _text(self.broker.sync.lindex(STARTS_KEY, 1)).split()
            second[0].kill()  # its job sleeps for minutes; a clean stop would wait out shutdown_timeout_s
        self.results["sigkill_recovery_s"] = float(started) - killed
        self.results["sigkill_second_attempt"] = int(attempt)
        s = self.app.worker_settings
        self.results["sigkill_settings"] = {"lease_s": s.lease_s, "heartbeat_s": s.heartbeat_s,
                                            "recover_interval_s": s.recover_interval_s}


def _text(raw: bytes | str | None) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return values[max(0, min(len(values) - 1, round(p / 100 * len(values) + 0.5) - 1))]


# -- report --------------------------------------------------------------------------------------------
ROWS = (
    ("enqueue_single_jobs_s", "enqueue, single (task.enqueue)", "{:,.0f} jobs/s"),
    ("enqueue_single_cpu_us", "enqueue, single: producer CPU per call", "{:,.0f} µs"),
    ("enqueue_bulk_jobs_s", "enqueue, bulk (enqueue_many x1,000)", "{:,.0f} jobs/s"),
    ("drain_1_jobs_s", "drain, 1 worker process", "{:,.0f} jobs/s"),
    ("drain_2_jobs_s", "drain, 2 worker processes", "{:,.0f} jobs/s"),
    ("latency_p50_ms", "enqueue-to-start p50 (ctx.enqueued_ms)", "{:.2f} ms"),
    ("latency_p99_ms", "enqueue-to-start p99 (ctx.enqueued_ms)", "{:.2f} ms"),
    ("latency_exact_p50_ms", "enqueue-to-start p50 (float send time)", "{:.2f} ms"),
    ("latency_exact_p99_ms", "enqueue-to-start p99 (float send time)", "{:.2f} ms"),
    ("bytes_per_job", "Redis bytes per queued no-op job", "{:,.0f} B"),
    ("drain_backlog_jobs_s", "drain, 1 process, backlog pending", "{:,.0f} jobs/s"),
    ("drain_backlog_empty_jobs_s", "drain, 1 process, empty (interleaved runs)", "{:,.0f} jobs/s"),
    ("drain_backlog_ratio", "  backlog / empty", "{:.2f}"),
    ("sigkill_recovery_s", "SIGKILL to the job's next start", "{:.1f} s"),
    *((f"fence_{kind}_{n}_{what}", f"{label}{kind}, {n} process{'es' if n > 1 else ''}", fmt)
      for kind in ("sync", "async") for n in (1, 2)
      for what, label, fmt in (("jobs_s", "fenced no-op, ", "{:,.0f} jobs/s"),
                               ("plain_jobs_s", "  plain no-op, ", "{:,.0f} jobs/s"),
                               ("cost_ms", "  fence wall ms/job/process, ", "{:.2f} ms"),
                               ("cpu_ms", "  worker CPU ms/job fenced, ", "{:.3f} ms"),
                               ("plain_cpu_ms", "  worker CPU ms/job plain, ", "{:.3f} ms"),
                               ("busy_cores", "  machine cores busy, fenced, ", "{:.2f}"))),
    *((f"fence_{kind}_{what}", f"{label}{kind}", fmt) for kind in ("sync", "async")
      for what, label, fmt in (("round_trips", "DB round trips, one fenced job, ", "{}"),
                               ("xacts", "DB transactions, one fenced job, ", "{}"),
                               ("rerun_round_trips", "DB round trips, rerun of a done job, ", "{}"),
                               ("rerun_xacts", "DB transactions, rerun of a done job, ", "{}"),
                               ("alone_ms", "one fenced job alone (in-process), ", "{:.2f} ms"))),
    ("db_round_trip_ms", "fence database round trip (SELECT 1)", "{:.3f} ms"),
)


def verdicts(results: dict[str, Any], skipped: set[str]) -> list[dict[str, str]]:
    out = []
    for t in TARGETS:
        ok = t.check(results)
        status = "SKIP" if t.figure in skipped or ok is None else ("PASS" if ok else "MISS")
        out.append({"target": t.text, "status": status})
    return out


def report(meta: dict[str, Any], results: dict[str, Any], targets: list[dict[str, str]]) -> str:
    lines = [f"ringfence bench ({meta['mode']}): redis-server {meta['redis']}, {meta['cores']} cores, "
             f"Python {meta['python']}, worker --concurrency {meta['concurrency']}"
             + (f" --threads {meta['threads']}" if meta.get("threads") else ""), ""]
    rows = [(label, fmt.format(results[key])) for key, label, fmt in ROWS if key in results]
    width = max((len(label) for label, _ in rows), default=0)
    lines += [f"  {label:<{width}} {value}" for label, value in rows]
    if "backlog_jobs" in results:
        lines.append(f"  (backlog: {results['backlog_jobs']:,} pending; drains of {meta['drain']:,} jobs, "
                     f"median of {meta['reps']})")
    for kind in ("sync", "async"):
        if f"fence_{kind}_trips" in results:
            lines.append(f"  ({kind} fenced job, one [transaction] each, r = rolled back, a = autocommit: "
                         f"{results[f'fence_{kind}_transactions']}; "
                         f"rerun of a done one: {results[f'fence_{kind}_rerun_transactions']})")
    if "pg_settings" in results:
        lines.append(f"  (PostgreSQL: {results['pg_settings']}; {meta['fence']:,} jobs per drain, medians of "
                     f"{meta['fence_reps']} interleaved plain/fenced pairs)")
    lines += ["", "targets:"] + [f"  {t['status']:<5} {t['target']}" for t in targets]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, no SIGKILL figure (about 30 s)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(FIGURES)} ({','.join(OPT_IN)}: only here)")
    ap.add_argument("--fence-url", default=os.environ.get("RINGFENCE_BENCH_FENCE_URL", bench_fence.DEFAULT_FENCE_URL),
                    help="PostgreSQL or MariaDB (mysql+pymysql) server of the fence figure; a private database "
                         "is created on it and dropped "
                         "(default $RINGFENCE_BENCH_FENCE_URL or %(default)s)")
    ap.add_argument("--fence-jobs", type=int, help="jobs per drain of the fence figure (default 5,000)")
    ap.add_argument("--concurrency", type=int, help="worker --concurrency (default 10)")
    ap.add_argument("--threads", type=int, help="worker --threads (default: the CLI's)")
    ap.add_argument("--reps", type=int, help="drain runs per figure (median reported)")
    ap.add_argument("--backlog", type=int, help="pending jobs of the backlog figure (default 1,000,000)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    overrides = {k: v for k, v in (("concurrency", args.concurrency), ("threads", args.threads), ("reps", args.reps),
                                   ("backlog", args.backlog), ("fence", args.fence_jobs)) if v is not None}
    sizes = replace(sizes, **overrides)
    if args.only:
        unknown = set(args.only.split(",")) - set(FIGURES)
        if unknown:
            ap.error(f"--only: unknown figure(s) {','.join(sorted(unknown))}")
        skipped = set(FIGURES) - set(args.only.split(","))
    else:
        skipped = set(QUICK_SKIPS + OPT_IN) if args.quick else set(OPT_IN)
    server = EmbeddedRedis.temporary(port=free_port())
    try:
        bench = Bench(server.url, sizes, tempfile.mkdtemp(prefix="ringfence-bench-"))
        bench.fence_url = args.fence_url
        say(f"private redis-server at {server.url}; worker logs in {bench.log_dir}")
        for figure in FIGURES:
            if figure not in skipped:
                say(f"{figure} ...")
                getattr(bench, f"fig_{figure}")()
        meta = {"mode": "quick" if args.quick else "full", "redis": bench.broker.sync.info()["redis_version"],
                "cores": os.cpu_count(), "python": platform.python_version(), **asdict(sizes)}
        bench.app.close()
    finally:
        server.stop()
    targets = verdicts(bench.results, skipped)
    if args.json:
        print(json.dumps({"meta": meta, "results": bench.results, "targets": targets}, indent=2))
    else:
        print(report(meta, bench.results, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
