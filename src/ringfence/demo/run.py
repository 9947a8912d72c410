"""Run the double-charge demo: the same chaos against a naive handler and a fenced one.

Everything is private and temporary: an embedded redis-server on a unix socket, SQLite files
and a fake payment provider process, all under one temp dir removed at the end (also on
Ctrl-C). Workers are real ``ringfence worker`` processes with ``RINGFENCE_FAULTS=after_effect:P``:
each charge call that has just got the provider's 200 SIGKILLs its process with probability P,
before the local commit. The demo restarts a killed worker at once and counts the kills.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import event, func, insert, select

from ringfence.demo.app import QUEUE, make_app, metadata, orders
from ringfence.demo.provider import ProviderClient
from ringfence.redis.embedded import EmbeddedRedis

MODES = ("naive", "fenced")
TARGET_KILLS = 15  # enough kills to make the point, few enough to finish in well under a minute
MAX_PROBABILITY = 0.2  # small runs: still ~10 kills, and a kill-free run is a 1-in-10,000 event at 40 orders


@dataclass(frozen=True)
class DemoConfig:
    orders: int = 200
    workers: int = 2
    concurrency: int = 4
    kill_probability: float | None = None  # None: aim at about TARGET_KILLS kills per run
    timeout_s: float = 300.0

    @property
    def probability(self) -> float:
        if self.kill_probability is not None:
            return self.kill_probability
        return round(min(MAX_PROBABILITY, TARGET_KILLS / max(self.orders, 1)), 3)


@dataclass
class RunResult:
    """The figures of one run; ``as_dict`` holds exactly what ``--json`` prints per mode."""

    orders: int
    charges: int = 0
    double_charged_orders: int = 0
    fence_rows: int = 0
    in_doubt: int = 0
    dead: int = 0
    kills: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[str, int, int], None]  # (mode, jobs finished, kills so far)


@dataclass
class Stack:
    """Owns every process and file the demo creates; ``close()`` removes them all."""

    root: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="ringfence-demo-"))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    redis: EmbeddedRedis | None = None

    def start_redis(self) -> str:
        self.redis = EmbeddedRedis(os.path.join(self.root, "redis")).start()
        return self.redis.url

    def spawn(self, argv: list[str], env: dict[str, str], log_path: str, **kw: Any) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            # Own session: a Ctrl-C in the terminal reaches the demo only, which then tears down in order.
            proc = subprocess.Popen(argv, env=env, stderr=log, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def start_provider(self, name: str) -> str:
        argv = [sys.executable, "-m", "ringfence.demo.provider", "--db", os.path.join(self.root, f"{name}.db")]
        proc = self.spawn(argv, dict(os.environ), os.path.join(self.root, f"{name}.log"), stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("port="):
            raise RuntimeError(f"the fake provider did not start (said {line!r}); see {self.root}/{name}.log")
        return f"http://127.0.0.1:{line.removeprefix('port=')}"

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait_s: float = 5.0) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        for proc in self.procs:
            self.stop(proc, signal.SIGKILL)  # a demo's workers have nothing to finish
        if self.redis is not None:
            self.redis.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _wal(dbapi_conn: Any, _record: Any) -> None:
    # Several worker processes write one SQLite file: WAL lets readers and one writer proceed together.
    dbapi_conn.execute("PRAGMA journal_mode=WAL")
    dbapi_conn.execute("PRAGMA busy_timeout=10000")


class Run:
    """One mode's run: its own namespace, database and provider on the shared embedded Redis."""

    def __init__(self, stack: Stack, redis_url: str, mode: str, cfg: DemoConfig) -> None:
        self.stack, self.mode, self.cfg = stack, mode, cfg
        self.dir = os.path.join(stack.root, mode)
        os.makedirs(self.dir)
        self.fence_url = f"sqlite:///{self.dir}/app.db"
        self.app = make_app(redis_url, f"demo-{mode}", self.fence_url)
        self.task = self.app.registry.tasks[f"demo.charge_{mode}"]
        self.workers: list[subprocess.Popen[bytes]] = []
        self.result = RunResult(orders=cfg.orders)
        self.provider_url = ""
        self.redis_url = redis_url

    def prepare(self) -> None:
        engine = self.app.fence_store.engine  # creates the fence tables (SQLite needs no migration)
        event.listen(engine, "connect", _wal)
        engine.dispose()
        metadata.create_all(engine)
        with engine.begin() as c:
            c.execute(insert(orders), [{"id": i, "amount": 500 + i} for i in range(1, self.cfg.orders + 1)])
        self.provider_url = self.stack.start_provider(f"provider-{self.mode}")
        self.app.enqueue_many(self.task, [{"order_id": i, "amount": 500 + i} for i in range(1, self.cfg.orders + 1)])

    def worker_env(self) -> dict[str, str]:
        return {**os.environ, "RINGFENCE_REDIS_URL": self.redis_url, "RINGFENCE_NAMESPACE": f"demo-{self.mode}",
                "RINGFENCE_FENCE_URL": self.fence_url, "RINGFENCE_DEMO_PROVIDER": self.provider_url,
                "RINGFENCE_ENV": "demo", "RINGFENCE_FAULTS": f"after_effect:{self.cfg.probability}"}

    def spawn_worker(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "ringfence.cli", "--log-level", "WARNING", "worker",
                "--app", "ringfence.demo.app:app", "--queues", QUEUE, "--concurrency", str(self.cfg.concurrency)]
        return self.stack.spawn(argv, self.worker_env(), os.path.join(self.dir, "workers.log"))

    def remaining(self) -> int:
        c = self.app.broker.queue_counts(QUEUE)
        return int(c["pending"] + c["active"] + c["scheduled"] + c["retry"])

    def supervise(self, progress: Progress) -> None:
        """Keep K workers running (restart the killed ones) until every job is acked or dead."""
        self.workers = [self.spawn_worker() for _ in range(self.cfg.workers)]
        deadline = time.monotonic() + self.cfg.timeout_s
        while (left := self.remaining()) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.mode}: {left} job(s) unfinished after {self.cfg.timeout_s:g}s; "
                                   f"logs in {self.dir}")
            for i, w in enumerate(self.workers):
                code = w.poll()
                if code is None:
                    continue
                if code == -signal.SIGKILL:
                    self.result.kills += 1
                self.workers[i] = self.spawn_worker()
            progress(self.mode, self.cfg.orders - left, self.result.kills)
            time.sleep(0.05)
        progress(self.mode, self.cfg.orders, self.result.kills)
        for w in self.workers:
            self.stack.stop(w)

    def measure(self) -> None:
        r, store = self.result, self.app.fence_store
        stats = ProviderClient(self.provider_url).stats()
        r.charges, r.double_charged_orders = stats["charges"], stats["double_charged_orders"]
        with store.engine.connect() as c:
            r.fence_rows = int(c.execute(select(func.count()).select_from(store.table)).scalar_one())
        r.in_doubt = len(store.list_steps(state="in_doubt"))
        r.dead = int(self.app.broker.queue_counts(QUEUE)["dead"])

    def execute(self, progress: Progress) -> RunResult:
        started = time.monotonic()
        try:
            self.prepare()
            self.supervise(progress)
            self.measure()
        finally:
            self.app.fence_store.engine.dispose()
            self.app.close()
        self.result.seconds = round(time.monotonic() - started, 1)
        return self.result


def run_demo(cfg: DemoConfig, progress: Progress) -> dict[str, RunResult]:
    """Run the naive then the fenced handler under the same kills; everything is torn down after."""
    stack = Stack()
    try:
        redis_url = stack.start_redis()
        return {mode: Run(stack, redis_url, mode, cfg).execute(progress) for mode in MODES}
    finally:
        stack.close()
