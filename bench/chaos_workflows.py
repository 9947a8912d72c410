"""Workflows under chaos: ``python -m bench.chaos_workflows --workflows 1000`` (docs/chaos.md).

Each workflow is a chain of three fenced charges, then a chord of ten members and a fenced callback. Two worker
processes serve them while the driver SIGKILLs one of them at random (and starts it again) and SIGKILLs the
private Redis once (it comes back from its AOF; with ``--redis cluster``, the queue's master: its replica is
promoted). The provider ignores idempotency keys, so only the fences keep a
charge from happening twice; a charge in flight when its worker dies is settled by the reconcile hook. At the end
the driver checks, per workflow: done (or failed, naming its steps), each fenced step charged once at the
provider, the callback charged once, and every step's job enqueued once (the queue's ``enqueued`` counter).

The same module is the workers' app (``--app bench.chaos_workflows:app``), configured from the environment.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis

from bench.chaos.stack import Stack, killpg, python_env
from ringfence import App, RetryPolicy, chain, chord
from ringfence.faults import WORKFLOW_POINTS
from ringfence.fence import NOT_HAPPENED
from ringfence.redis.keys import Keys
from ringfence.settings import WorkerSettings
from ringfence.tasks import JobContext
from ringfence.testing import FakeProvider

QUEUE = "wfchaos"
MEMBERS = 10
STEPS = 3 + MEMBERS + 1
LEASE_S = 3.0
SETTINGS = WorkerSettings(lease_s=LEASE_S, heartbeat_s=LEASE_S / 4, recover_interval_s=0.5, promote_interval_s=0.1,
                          shutdown_timeout_s=3.0, server_ttl_s=LEASE_S + 1)
# Every kill orphans the jobs of a whole process and burns an attempt of each: many attempts.
RETRY = RetryPolicy(max_attempts=25, base_s=0.1, cap_s=1.0)
POSTGRESQL = "postgresql+psycopg://root@127.0.0.1:5432/test"
_provider: list[FakeProvider] = []


def provider() -> FakeProvider:
    """The ledger every process shares (a SQLite file); it ignores keys: a second call is a second charge."""
    if not _provider:
        _provider.append(FakeProvider(os.environ["WFCHAOS_PROVIDER_DB"], honours_keys=False))
    return _provider[0]


def find_charge(key: str, request: Any) -> Any:
    """The reconcile hook: the charge made with ``key``, else NOT_HAPPENED (safe to charge)."""
    found = provider().lookup(key)
    return found if found is not None else NOT_HAPPENED


def _charge(ctx: JobContext, amount: int) -> str:
    with ctx.fence(params={"amount": amount}, reconcile=find_charge) as step:  # business id + step name
        if step.done:
            return str(step.result["charge_id"])
        ref = step.effect(lambda: provider().charge(amount, step.key, order=ctx.id))
        with step.complete(ctx_engine(), result={"charge_id": ref}):
            pass
    return str(ref)


def charge(ctx: JobContext, amount: int, previous: Any = None) -> str:
    """A chain step: one fenced charge."""
    return _charge(ctx, amount)


def member(ctx: JobContext, x: int, previous: Any = None) -> int:
    """A chord member (no effect): its result goes to the callback."""
    return x


def settle(ctx: JobContext, previous: list[Any]) -> str:
    """The chord's callback: one fenced charge of the members' sum."""
    return _charge(ctx, sum(p for p in previous if isinstance(p, int)))


def make_app(redis_url: str | None = None, namespace: str | None = None, fence_url: str | None = None) -> App:
    """The app; without arguments configured from the environment (the workers' side)."""
    app = App(redis_url, namespace, environment="chaos", worker=SETTINGS, retry=RETRY, timeout_s=30.0,
              fence_url=fence_url or os.environ.get("WFCHAOS_FENCE_URL"))
    for fn in (charge, member, settle):
        app.task(name=f"wfchaos.{fn.__name__}", queue=QUEUE)(fn)
    return app


def ctx_engine() -> Any:
    return app.fence_store.engine


app = make_app()


# -- the driver ------------------------------------------------------------------------------------------------
@dataclass
class Run:
    workflows: int
    workers: int = 2
    concurrency: int = 8
    kill_every_s: float = 3.0
    redis_restarts: int = 1
    step_faults: float = 0.0  # p of a SIGKILL at each step-ack fault point (worker/settle.py)
    chaos_s: float = 1e9  # no kill after this many seconds: the rest drains in calm
    db: str = POSTGRESQL  # the fence's database URL, or "sqlite" (a file of the run)
    timeout_s: float = 600.0
    redis: str = "single"  # or "cluster": 3 masters with a replica each; the Redis fault is a master SIGKILL
    stats: dict[str, Any] = field(default_factory=dict)


class Driver:
    def __init__(self, run: Run) -> None:
        self.run, self.stack = run, Stack()
        self.ns = f"wfchaos{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills = self.self_killed = self.restarts = 0
        self.killed: set[int] = set()  # pids the driver SIGKILLed
        self.calm = False

    def spawn(self, slot: int) -> subprocess.Popen[bytes]:
        env = python_env(RINGFENCE_REDIS_URL=self.redis_url, RINGFENCE_NAMESPACE=self.ns,
                         WFCHAOS_FENCE_URL=self.fence_url, WFCHAOS_PROVIDER_DB=self.stack.provider_db)
        if self.run.step_faults and not self.calm:
            env["RINGFENCE_FAULTS"] = ",".join(f"{p}:{self.run.step_faults}" for p in WORKFLOW_POINTS)
        argv = [sys.executable, "-m", "ringfence.cli", "--log-level", "ERROR", "worker", "--app",
                "bench.chaos_workflows:app", "--queues", QUEUE, "--concurrency", str(self.run.concurrency)]
        return self.stack.spawn(argv, env, f"worker-{slot}.log")

    def setup(self) -> App:
        self.redis_url = self.stack.start_redis(self.run.redis)
        self.stack.queue_key = Keys(self.ns).queue(QUEUE).jobs
        self.fence_url = self.run.db if self.run.db != "sqlite" else f"sqlite:///{self.stack.root}/fence.db"
        os.environ["WFCHAOS_PROVIDER_DB"] = self.stack.provider_db
        driver_app = make_app(self.redis_url, self.ns, self.fence_url)
        driver_app.fence_store.create_all()
        provider()
        return driver_app

    def enqueue(self, driver_app: App) -> list[str]:
        tasks = {name: driver_app.resolve(f"wfchaos.{name}") for name in ("charge", "member", "settle")}
        wids = []
        for n in range(self.run.workflows):
            wids.append(chain(tasks["charge"].s(amount=1), tasks["charge"].s(amount=2), tasks["charge"].s(amount=3),
                              chord([tasks["member"].s(x=i) for i in range(MEMBERS)], tasks["settle"].s())
                              ).enqueue(business_id=f"{self.ns}:{n}"))
        return wids

    def supervise(self) -> None:
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None:
                if code == -signal.SIGKILL and proc.pid not in self.killed:
                    self.self_killed += 1
                self.procs[i] = self.spawn(i)

    def kill_one(self) -> None:
        proc = random.choice(self.procs)
        if proc.poll() is None:
            self.killed.add(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            self.kills += 1

    def go(self) -> dict[str, Any]:
        try:
            driver_app = self.setup()
            wids = self.enqueue(driver_app)
            started = time.monotonic()
            self.procs = [self.spawn(i) for i in range(self.run.workers)]
            # the Redis restarts fire as the steps go (a quarter processed, for one): each hits workflows mid-way
            restart_marks = [STEPS * len(wids) * (k + 1) / (2 * (self.run.redis_restarts + 1))
                             for k in range(self.run.redis_restarts)]
            processed = 0
            next_kill = started + random.expovariate(1 / self.run.kill_every_s)
            # a run faster than its first random kill still gets one, a third of the way through its steps
            first_kill_mark = STEPS * len(wids) / 3
            pending, checked = set(wids), 0.0
            stats_key = driver_app.broker.keys.queue(QUEUE).stats
            while pending and time.monotonic() - started < self.run.timeout_s:
                now = time.monotonic()
                self.calm = now - started >= self.run.chaos_s
                if (now >= next_kill or (self.kills == 0 and processed >= first_kill_mark)) and not self.calm:
                    self.kill_one()
                    next_kill = now + random.expovariate(1 / self.run.kill_every_s)
                if restart_marks and processed >= restart_marks[0]:
                    restart_marks.pop(0)
                    if self.run.redis == "cluster":
                        self.stack.kill_master()
                    else:
                        self.stack.restart_redis(hard=True)
                    self.restarts += 1
                self.supervise()
                time.sleep(0.2)
                if now - checked >= 1.0:
                    with contextlib.suppress(redis.ConnectionError):  # Redis restarting: next round
                        pending, checked = unsettled(driver_app, pending), now
                        processed = int(driver_app.broker.sync.hget(stats_key, "processed") or 0)
            elapsed = time.monotonic() - started
            for proc in self.procs:
                self.stack.stop(proc)
            return self.verdict(driver_app, wids, elapsed)
        finally:
            for proc in self.procs:
                killpg(proc)
            self.stack.close()

    def verdict(self, driver_app: App, wids: list[str], elapsed: float) -> dict[str, Any]:
        b = driver_app.broker
        raw = b.sync.hgetall(b.keys.queue(QUEUE).stats)
        stats = {name: int(raw.get(name.encode(), 0)) for name in ("enqueued", "orphaned", "dead")}
        views = {w: driver_app.workflow(w) for w in wids}
        states = collections.Counter(v.state if v else "expired" for v in views.values())
        failed = {w: v.failed for w, v in views.items() if v and v.state == "failed"}
        stuck = [w for w, v in views.items() if v is None or v.stuck]  # a step whose job is gone: nothing advances
        unfinished = [w for w, v in views.items() if v is not None and v.state == "running" and not v.stuck]
        # charges per fenced step: the provider's ledger, by fence key (business id + step name)
        per_key = collections.Counter(c.key for c in provider().records())
        per_job = collections.Counter(c.order for c in provider().records())  # the step's job id
        callbacks: collections.Counter[str] = collections.Counter()
        for v in views.values():
            if v is not None and v.steps[-1].state == "done":
                callbacks["once" if per_job[v.steps[-1].job_id] == 1 else "wrong"] += 1
        out: dict[str, Any] = {
               "workflows": len(wids), "done": states["done"], "failed": len(failed), "stuck": len(stuck),
               "unfinished": len(unfinished),
               "failed_named": sorted({s for names in failed.values() for s in names}),
               "failed_unnamed": sum(1 for names in failed.values() if not names),
               "callbacks_once": callbacks["once"], "callbacks_wrong": callbacks["wrong"],
               "fenced_steps": 4 * states["done"], "charges": sum(per_key.values()),
               "charged_twice": sum(1 for n in per_key.values() if n > 1),
               "steps_enqueued": stats.get("enqueued", 0), "steps_expected": STEPS * len(wids),
               "reconciled": lookups(self.stack.provider_db),
               "orphaned": stats.get("orphaned", 0), "dead": stats.get("dead", 0),
               "worker_kills": self.kills, "fault_point_kills": self.self_killed, "redis_restarts": self.restarts,
               "seconds": round(elapsed, 1)}
        out["ok"] = (not stuck and not unfinished and out["charged_twice"] == 0 and out["callbacks_wrong"] == 0
                     and out["failed_unnamed"] == 0
                     and (out["failed"] > 0 or (out["steps_enqueued"] == out["steps_expected"]
                                                and out["charges"] == out["fenced_steps"])))
        return out


def lookups(path: str) -> list[int]:
    """[charges in doubt the reconcile hook found made, found not made] (the provider's log of lookups)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        found, missing = db.execute("SELECT count(*) FILTER (WHERE found), count(*) FILTER (WHERE NOT found) "
                                    "FROM lookups").fetchone()
    return [int(found), int(missing)]


def unsettled(driver_app: App, wids: set[str]) -> set[str]:
    """The workflows still running (one pipelined HGET each: the loop keeps its pace of kills)."""
    b = driver_app.broker
    pipe = b.sync.pipeline(transaction=False)
    order = list(wids)
    for w in order:
        pipe.hget(b.keys.workflow(QUEUE, w), "state")
    return {w for w, state in zip(order, pipe.execute(), strict=True) if state in (b"running", None)}


def table(out: dict[str, Any]) -> str:
    rows = [("workflows (chain of 3 fenced charges, chord of 10 + fenced callback)", out["workflows"]),
            ("done", out["done"]), ("failed (steps named)", f"{out['failed']} {out['failed_named']}"),
            ("stuck (a step's job gone) / unfinished at the timeout", f"{out['stuck']} / {out['unfinished']}"),
            ("callbacks charged once / wrong", f"{out['callbacks_once']} / {out['callbacks_wrong']}"),
            ("fenced steps done / charges at the provider", f"{out['fenced_steps']} / {out['charges']}"),
            ("fenced steps charged twice", out["charged_twice"]),
            ("step jobs enqueued / steps", f"{out['steps_enqueued']} / {out['steps_expected']}"),
            ("charges in doubt after a kill: reconciled made / not made", "{} / {}".format(*out["reconciled"])),
            ("jobs orphaned (recovered after a kill)", out["orphaned"]), ("jobs dead", out["dead"]),
            ("workers SIGKILLed (driver / fault points)", f"{out['worker_kills']} / {out['fault_point_kills']}"),
            ("Redis SIGKILLed (single: restarted from its AOF; cluster: the queue's master)", out["redis_restarts"]),
            ("seconds (from the first worker to the last workflow)", out["seconds"]),
            ("verdict", "ok" if out["ok"] else "FAILED")]
    width = max(len(r[0]) for r in rows)
    return "\n".join(["| check | result |", "|---|---|"] + [f"| {k.ljust(width)} | {v} |" for k, v in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos_workflows", description=__doc__.splitlines()[0])
    p.add_argument("--workflows", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between worker SIGKILLs")
    p.add_argument("--chaos", type=float, default=1e9, help="seconds of kills; then the rest drains in calm")
    p.add_argument("--redis-restarts", type=int, default=1)
    p.add_argument("--step-faults", type=float, default=0.0,
                   help="probability of a SIGKILL at each step-ack fault point")
    p.add_argument("--redis", choices=("single", "cluster"), default="single",
                   help="cluster: 3 masters with a replica each; the Redis fault SIGKILLs the queue's master")
    p.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql", help="the fence's database")
    p.add_argument("--fence-url", default=POSTGRESQL, help="the PostgreSQL of --db postgresql")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", action="store_true", help="print the figures as JSON, not a table")
    a = p.parse_args(argv)
    out = Driver(Run(a.workflows, a.workers, a.concurrency, a.kill_every, a.redis_restarts, a.step_faults,
                     a.chaos, a.fence_url if a.db == "postgresql" else "sqlite", a.timeout, a.redis)).go()
    print(json.dumps(out) if a.json else table(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
