"""A worker process: composition of the processor and the background loops, signals, shutdown order."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import socket
import time
from collections.abc import Coroutine
from typing import Any

from ringfence.app import App
from ringfence.errors import BrokerError, CannotConnect, ConfigError, EnvironmentMismatch, RedisFull
from ringfence.metrics import Metrics
from ringfence.models import new_job_id
from ringfence.offloop import HOP
from ringfence.redis.connect import login_refused, still_loading, until_answered, while_loading
from ringfence.redis.connection import UNAVAILABLE, redact
from ringfence.redis.keys import logical_queue
from ringfence.settings import WorkerSettings, check_name, check_threads
from ringfence.worker.acks import Acks
from ringfence.worker.admit import Admission
from ringfence.worker.calls import SyncRunner
from ringfence.worker.durable import DurableSweep
from ringfence.worker.fencing import Fencing
from ringfence.worker.fetcher import Fetcher, Stopping
from ringfence.worker.gates import Gates
from ringfence.worker.heartbeat import Heartbeat, ServerIdentity
from ringfence.worker.maintenance import DeadRetention, Promoter, QueueSet, Recoverer, SchedulerLoop
from ringfence.worker.observers import Observer, Observers
from ringfence.worker.observers.alerts import UnreadableAlerts
from ringfence.worker.observers.breakers import BreakerObserver
from ringfence.worker.observers.failed_jobs import FailedJobsObserver
from ringfence.worker.observers.hooks import DeadHooksObserver
from ringfence.worker.observers.metrics import MetricsObserver
from ringfence.worker.partitions import expand
from ringfence.worker.processor import Processor
from ringfence.worker.recycle import NO_LIMITS, Limits, Recycler
from ringfence.worker.runner import Runner
from ringfence.worker.settle import Settler
from ringfence.worker.summary import DEFAULT_SUMMARY_S, Summary, check_summary_s
from ringfence.worker.supervisor import (
    catch_stop_signals,
    hold_stop_signals,
    notify_recycling,
    notify_supervisor,
    release_stop_signals,
    replace_process,
    stop_signal_caught,
    supervised,
)

log = logging.getLogger("ringfence.worker")

EXIT_RESTART = 75  # a sync job outlived its timeout and the grace: the process must be replaced


def parse_queues(spec: str) -> list[tuple[str, int]]:
    """``critical=6,default=3,low=1`` → [("critical", 6), ...]; a bare name has weight 1."""
    out: list[tuple[str, int]] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, weight = part.partition("=")
        check_name("queue", name)
        try:
            w = int(weight) if weight else 1
        except ValueError:
            raise ConfigError(f"--queues {spec!r}: weight of {name!r} must be an integer, got {weight!r}") from None
        if w < 1:
            raise ConfigError(f"--queues {spec!r}: weight of {name!r} must be >= 1")
        out.append((name, w))
    if not out:
        raise ConfigError("--queues is empty; name at least one queue")
    return out


class Worker:
    """Runs jobs of the given queues until SIGTERM/SIGINT. ``run()`` returns the process exit code."""

    def __init__(self, app: App, queues: list[tuple[str, int]] | None = None, *, concurrency: int = 10,
                 strict: bool = False, settings: WorkerSettings | None = None,
                 max_wait: dict[str, float] | None = None, scheduler: bool = False,
                 metrics_port: int | None = None, alerts: bool = True, metrics_host: str = "127.0.0.1",
                 threads: int | None = None, summary_s: float = DEFAULT_SUMMARY_S, recycle: Limits = NO_LIMITS) -> None:
        if concurrency < 1:
            raise ConfigError(f"--concurrency {concurrency} must be >= 1")
        self.threads = check_threads(threads, concurrency)
        self.app = app
        self.settings = settings or app.worker_settings
        app.check(self.settings)
        logical = queues or [(q, 1) for q in (app.registry.queues() or ["default"])]
        self.queues = expand(logical, app.partitions)  # each partition of a partitioned queue (worker/partitions.py)
        self.concurrency = concurrency
        self.strict = strict
        self.server_id = f"{socket.gethostname()}.{os.getpid()}.{new_job_id()[:6]}"
        self.runtime = app.runtime  # the live parts; each component below gets the one it needs
        self.broker = self.runtime.broker
        self.exit_code = 0
        unknown = sorted(set(max_wait or {}) - {q for q, _ in logical})
        if unknown:
            raise ConfigError(f"--max-wait names queue(s) this worker does not serve: {', '.join(unknown)}")
        if max_wait:  # a partitioned queue's bound holds for each partition
            max_wait = {q: max_wait[logical_queue(q)] for q, _ in self.queues if logical_queue(q) in max_wait}
        self.scheduler = scheduler
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.queues_from_tasks = queues is None  # said at start: an operator may expect "every queue"
        self.alerts = alerts
        self.summary_s = check_summary_s(summary_s)
        self.metrics = Metrics()
        self.recycle = recycle.check()
        self.recycling = False
        self.processor = self._pipeline(max_wait)
        self._signals = 0

    def _pipeline(self, max_wait: dict[str, float] | None) -> Processor:
        """fetch → decode, refuse/defer → gate → run, classify → settle, with its observers (processor.py)."""
        app, rt, broker, s = self.app, self.runtime, self.broker, self.settings
        gates = Gates(broker, s, app.queue_limits, app.breakers)
        fencing = Fencing(rt, broker, s, observe=self.metrics.fence_outcome)
        watchers: list[Observer] = [MetricsObserver(self.metrics), BreakerObserver(gates)]
        if rt.fence_url:  # the failed-jobs table (opened on first use)
            watchers.append(FailedJobsObserver(rt, broker))
        watchers += [DeadHooksObserver(app.dead_hooks), UnreadableAlerts(rt.notifier, s.grace_s)]
        if self.recycle:
            watchers.append(Recycler(self.recycle, self._recycle))
        observers = Observers(watchers)
        pool = SyncRunner(self.concurrency, first_threads=self.threads)
        acks = Acks(broker, batch=max(1, self.concurrency // 2))  # the processor's refill batch
        fetcher = Fetcher(broker, self.server_id, self.queues, strict=self.strict, lease_s=s.lease_s,
                          idle_s=s.heartbeat_s, max_wait=max_wait, stopping=Stopping())
        return Processor(
            self.concurrency, fetcher, Admission(app.registry, broker.clock, s, fencing, observers), gates,
            Runner(pool, broker.clock, fencing, observers, {}, self._restart_required),
            Settler(broker, self.server_id, acks, fencing, observers, app.registry,
                    durable=bool(rt.fence_url), replicas=app.min_replicas, replica_timeout_s=app.replica_timeout_s),
            observers, pool)

    def _restart_required(self) -> None:
        if not self._signals:  # a stop asked for is a stop, not a replacement
            self.exit_code = EXIT_RESTART
        self.processor.stopping.set()

    def _recycle(self, reason: str) -> None:
        """Past a recycling limit: no new jobs; the running ones finish, then the process is replaced (at once by a
        supervisor that heard it, else as a sync job's timeout has it replaced)."""
        if self._signals or self.processor.stopping.is_set():
            return
        self.recycling = True
        self.exit_code = EXIT_RESTART
        told = notify_recycling()
        log.info("recycling: %s; no new jobs, %d running to finish, then %s", reason, len(self.processor.running),
                 "the supervisor's replacement serves" if told else "this process is replaced")
        self.processor.stopping.set()

    async def _finish_running(self) -> None:
        """A recycling worker's running jobs end as they would (their own timeouts), ``ctx.cancelled`` not set."""
        if self.recycling:  # meanwhile no job is pushed to it; those pushed already go back to their queue
            await self.processor.fetcher.waker.close()
        while self.recycling and self.processor.running and not self._signals:
            await asyncio.sleep(0.02)

    def request_stop(self) -> None:
        self._signals += 1
        if self._signals == 1:
            self.exit_code = 0
            log.info("stopping: no new jobs; running jobs get %gs", self.settings.shutdown_timeout_s)
            self.processor.stopping.set()
        else:
            log.warning("second signal: exiting at once; leases will return running jobs to their queues")
            os._exit(130)

    def stopped(self) -> bool:
        """Has a stop signal come?"""
        return self._signals > 0

    async def _connect(self) -> None:
        """Wait for Redis with backoff (one line when it does not answer, one when it does), up to
        ``first_connect_s`` (a Redis loading its data answers: it is waited for as long as it loads); then measure
        the offset to its clock."""
        b = self.broker
        deadline = loop_time() + b.connection.first_connect_s
        delay = 0.1
        while True:
            try:
                await b.server_clock.ameasure(b.aio)
                await self._guard_environment()  # a Redis still loading its data answers TIME, not this
                b.health.ok()
                return
            except UNAVAILABLE as exc:
                refused = login_refused(exc, b.url)
                if refused:
                    raise CannotConnect(refused) from exc
                b.health.lost(exc)
                if still_loading(exc):
                    deadline = loop_time() + b.connection.first_connect_s
                elif loop_time() + delay > deadline:
                    raise BrokerError(f"Redis at {redact(b.url)} did not answer within "
                                      f"{b.connection.first_connect_s:g}s: {exc}") from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _register(self, names: list[str]) -> None:
        """Registrations the worker can run without (the heartbeat registers its queues on every beat). Redis
        may stop answering after the connect (a master failing over): waited for as the connect does."""
        b = self.broker
        try:
            await until_answered(lambda: b.aregister_queues(names, "queue registration"), b.health,
                                 b.connection.first_connect_s)
            await until_answered(lambda: b.aregister_dependencies(self.app.breakers), b.health,
                                 b.connection.first_connect_s)
        except RedisFull as exc:
            log.warning("%s; starting anyway: this worker drains the queues", exc)

    async def _guard_environment(self) -> None:
        recorded = await self.broker.claim_environment(self.app.environment)
        if recorded != self.app.environment:
            raise EnvironmentMismatch(
                f"namespace {self.app.namespace!r} belongs to environment {recorded!r} but this worker is "
                f"{self.app.environment!r}; point it at the right Redis or namespace "
                "(RINGFENCE_ENV, RINGFENCE_NAMESPACE)"
            )

    def _serve_metrics(self) -> Any:
        if self.metrics_port is None:
            return None
        broker = self.broker
        self.metrics.breaker_source(lambda: {d: broker.breaker_state(d)["state"] for d in self.app.breakers})
        log.info("metrics on %s:%d/metrics", self.metrics_host, self.metrics_port)
        return self.metrics.serve(self.metrics_port, self.metrics_host)

    def identity(self) -> ServerIdentity:
        return ServerIdentity(self.server_id, dict(self.queues), self.strict, self.concurrency, self.app.namespace,
                              self.app.environment, sorted(self.app.registry.tasks), self.settings.shutdown_timeout_s)

    def _live(self) -> dict[str, Any]:
        p = self.processor
        now_ms, mono = self.broker.clock(), time.monotonic()  # the dashboard's "running since" on Redis' clock
        since = {job_id: int(now_ms - (mono - r.started) * 1000) for job_id, r in p.running.items() if r.started}
        return {"running": sorted(p.running), "processed": p.processed, "failed": p.failed,
                "duration_p95_s": self.metrics.duration_p95(), "task_stats": self.metrics.task_stats(),
                "running_since_ms": since}

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # from the start: a stop during start-up is graceful too
            loop.add_signal_handler(sig, self.request_stop)
        release_stop_signals()  # one held across this process's replacement is handled now
        if stop_signal_caught():  # one that reached another thread of the process this one replaced
            self.request_stop()
        await self._connect()
        await HOP.run(self.runtime.prepare_fence_tables)  # not raced by the first jobs
        names = [q for q, _ in self.queues]
        await self._register(names)
        for name, task in sorted(self.app.registry.tasks.items()):
            log.info("serving task %s v%d (reads versions %s; queue %s, timeout %gs, max_attempts %d)", name,
                     task.version, ",".join(map(str, task.codec.understood())), task.options.queue,
                     task.options.timeout_s, task.options.retry.max_attempts)
        queue_set = QueueSet(self.broker, names)
        s = self.settings
        heartbeat = Heartbeat(self.broker, s, self.identity(), names, self.processor, self._live)
        loops = [heartbeat, Recoverer(self.broker, queue_set, s.recover_interval_s),
                 Promoter(self.broker, queue_set, s.promote_interval_s)]
        failed_jobs = self.runtime.failed_jobs
        if failed_jobs is not None:  # rows a killed worker still owed (worker/durable.py)
            loops.append(DurableSweep(failed_jobs, self.broker, queue_set,
                                      max(1.0, s.recover_interval_s), grace_s=max(5.0, 2 * s.lease_s)))
        if s.dead_retention_s is not None:
            loops.append(DeadRetention(self.broker, queue_set, s.dead_retention_s,
                                       interval_s=min(60.0, s.dead_retention_s / 2), failed_jobs=failed_jobs))
        if self.scheduler:
            from ringfence.scheduler import Scheduler

            loops.append(SchedulerLoop(Scheduler(self.app.periodics, self.broker)))
        if s.relay_outbox_s is not None:
            from ringfence.outbox.loop import RelayLoop

            loops.append(RelayLoop(self.app, s.relay_outbox_s, owner=self.server_id))
        if self.alerts:
            from ringfence.alerts import AlertLoop

            loops.append(AlertLoop(self.app, self.app.alert_rules, owner=self.server_id))
        if self.summary_s:
            loops.append(Summary(self.metrics, self.summary_s))
        http = self._serve_metrics()
        for component in loops:
            component.health = self.broker.health
            component.start()
        notify_supervisor()
        log.info("worker %s: queues %s%s, concurrency %d", self.server_id,
                 ",".join(f"{q}={w}" for q, w in self.queues),
                 " (no --queues: the queues its tasks declare)" if self.queues_from_tasks else "", self.concurrency)
        try:
            await self.processor.run()
            await self._finish_running()
            await self.processor.drain(s.shutdown_timeout_s)
        finally:
            if http is not None:
                http.shutdown()
            await self._clean_up(loops)
        return self.exit_code

    async def _clean_up(self, loops: list[Any]) -> None:
        """Stop the loops, unregister, close: an error here is logged and never changes the exit code."""
        steps: list[tuple[str, Any]] = [(f"stopping {type(c).__name__}", c.stop) for c in loops]
        b = self.broker
        steps += [("unregistering", lambda: while_loading(lambda: b.unregister_server(self.server_id), b.health,
                                                          b.connection.first_connect_s)),
                  ("closing the Redis clients", self.broker.aclose)]
        for what, step in steps:
            try:
                await step()
            except Exception as exc:  # shutdown goes on whatever one step raised
                log.warning("shutdown: %s failed (%s: %s); exiting anyway", what, type(exc).__name__, exc)


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def parse_max_wait(spec: str) -> dict[str, float]:
    """``low=60,default=30`` → {"low": 60.0, "default": 30.0} (seconds)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        try:
            out[check_name("queue", name)] = float(value.rstrip("s"))
        except ValueError:
            raise ConfigError(f"--max-wait {spec!r}: {part!r} must look like queue=seconds") from None
        if out[name] <= 0:
            raise ConfigError(f"--max-wait {spec!r}: the bound of {name!r} must be > 0")
    return out


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run the worker's loop on uvloop where it is installed (less CPU per job for the loop and for every
    socket write); ``RINGFENCE_EVENT_LOOP=asyncio`` chooses the standard loop."""
    choice = os.environ.get("RINGFENCE_EVENT_LOOP", "uvloop")
    if choice not in ("uvloop", "asyncio"):
        raise ConfigError(f"RINGFENCE_EVENT_LOOP={choice!r} must be 'uvloop' or 'asyncio'")
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:  # not on this platform (Windows) or not installed: the standard loop
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def run_worker(app: App, queues: list[tuple[str, int]] | None = None, *, concurrency: int = 10,
               strict: bool = False, max_wait: dict[str, float] | None = None, scheduler: bool = False,
               metrics_port: int | None = None, alerts: bool = True, metrics_host: str = "127.0.0.1",
               threads: int | None = None, summary_s: float = DEFAULT_SUMMARY_S, recycle: Limits = NO_LIMITS) -> int:
    worker = Worker(app, queues, concurrency=concurrency, strict=strict, max_wait=max_wait, scheduler=scheduler,
                    metrics_port=metrics_port, alerts=alerts, metrics_host=metrics_host, threads=threads,
                    summary_s=summary_s, recycle=recycle)
    alone = not supervised()
    code = run_loop(worker.run())
    worker.processor.observers.leaving()  # the exits below (exec, os._exit) skip the exit hooks
    # The loop gave the signals back to their defaults: a second signal during the rest of the exit (threads,
    # interpreter teardown, slow under load) must still mean "exit at once" with its code, not death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.request_stop())
    if code == EXIT_RESTART and alone:
        catch_stop_signals()
        hold_stop_signals()
        if not worker.stopped():  # no stop signal came: a queue is never left without its worker
            replace_process()
        release_stop_signals()
        code = 0
    # The interpreter's own teardown, after the atexit hooks, gives Python handlers back to the default (death by
    # signal: 143, which a supervisor would report instead of the worker's code): from the hooks on, the stop
    # signals are ignored. The worker is exiting already, with its code.
    atexit.register(_ignore_stop_signals)
    if worker.processor.threads:
        # A thread cannot be stopped: leave without joining it. Its job's lease, no longer renewed, brings it back.
        log.warning("exiting with %d sync handler(s) still running; their jobs return when their leases lapse",
                    len(worker.processor.threads))
        logging.shutdown()
        os._exit(code)
    return code
