"""The chaos driver: N orders through real worker processes while everything that can break, breaks.

Phases: set up (private Redis with AOF, provider, the run's own database, workers) → chaos (enqueue in
batches; faults fire until ``chaos_until_s`` or until every job is done) → calm (faults off; drain) →
stop (SIGTERM every worker, each timed) → collect and check. Every process and the database are removed
in ``finally`` (and at exit), whatever happened.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.chaos import app as chaos_app
from bench.chaos.checks import verdict
from bench.chaos.collect import collect
from bench.chaos.config import ChaosConfig
from bench.chaos.database import ChaosDatabase
from bench.chaos.doctor import fence_findings
from bench.chaos.faults import Chaos
from bench.chaos.feeder import Feeder
from bench.chaos.provider import Client
from bench.chaos.stack import REPO, Stack, faketime_available
from bench.chaos.workers import Workers
from ringfence.app import App
from ringfence.fence import create_all
from ringfence.redis.keys import Keys
from ringfence.worker.worker import EXIT_RESTART

Progress = Callable[[dict[str, Any]], None]


class ChaosRun:
    def __init__(self, cfg: ChaosConfig, progress: Progress | None = None) -> None:
        self.cfg, self.progress = cfg, progress or (lambda _: None)
        self.run_id = uuid.uuid4().hex[:8]
        self.stack = Stack(keep_root=cfg.keep)
        self.db = ChaosDatabase(cfg.db, self.run_id, self.stack.root)
        self.namespace = f"chaos-{self.run_id}"
        self.notes: list[str] = []
        self.started = time.monotonic()
        self.drained_s: float | None = None
        self.app: App | None = None
        self.workers: Workers | None = None
        self.chaos: Chaos | None = None

    # -- setup ------------------------------------------------------------------------------------
    def _setup(self) -> tuple[Feeder, sqlite3.Connection]:
        cfg = self.cfg
        self.stack.queue_key = Keys(self.namespace).queue(chaos_app.QUEUE).jobs
        redis_url = self.stack.start_redis(cfg.redis)
        provider_url = self.stack.start_provider()
        self.db.create()
        engine = self.db.engine()
        create_all(engine)
        chaos_app.metadata.create_all(engine)
        with engine.begin() as c:
            for lo in range(1, cfg.orders + 1, 10_000):
                rows = [{"id": o, "amount": 500 + o % 1000, "provider": "a" if o % 2 else "b"}
                        for o in range(lo, min(cfg.orders, lo + 9_999) + 1)]
                c.execute(chaos_app.orders.insert(), rows)
        engine.dispose()
        self.app = chaos_app.make_app(redis_url, self.namespace, self.db.url)
        env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": self.namespace, "RINGFENCE_ENV": "chaos",
               "RINGFENCE_FENCE_URL": self.db.url, "CHAOS_PROVIDER_URL": provider_url,
               "CHAOS_LEASE_S": str(cfg.lease_s), "CHAOS_EFFECT_TIMEOUT_S": str(cfg.effect_timeout_s),
               "CHAOS_MAX_ATTEMPTS": str(cfg.max_attempts),
               "CHAOS_HOOK_DELAY_S": str(cfg.hook_delay_s if cfg.on("slow-hook") else 0.0)}
        skew = cfg.skew_s if cfg.on("skew") else None
        if skew is not None and not faketime_available():
            self.notes.append("skew: libfaketime not installed (apt-get install faketime); no skewed worker")
            skew = None
        self.workers = Workers(self.stack, env, cfg.workers, cfg.concurrency, skew, cfg.term_bound_s)
        self.chaos = Chaos(cfg, self.stack, self.db, self.workers, Client(provider_url, 10.0, "driver"))
        ledger = sqlite3.connect(os.path.join(self.stack.root, "ledger.db"))
        feeder = Feeder(self.app, ledger, self.run_id, cfg.orders, cfg.batch,
                        cfg.dup_rate if cfg.on("duplicates") else 0.0,
                        cfg.doomed_rate if cfg.on("doomed") else 0.0, cfg.durable)
        return feeder, ledger

    # -- the run ----------------------------------------------------------------------------------
    def _backlog(self) -> int | None:
        assert self.app is not None
        try:
            c = self.app.broker.queue_counts(chaos_app.QUEUE)
        except Exception:  # Redis restarting or full: try again next tick
            return None
        return int(c["pending"] + c["active"] + c["scheduled"] + c["retry"])

    def _loop(self, feeder: Feeder) -> None:
        cfg, workers, chaos = self.cfg, self.workers, self.chaos
        assert workers is not None and chaos is not None
        chaos.start()
        workers.start()
        calm = False
        while True:
            elapsed = time.monotonic() - self.started
            backlog = self._backlog()
            if backlog is not None:
                sent = feeder.enqueued_jobs
                feeder.feed(backlog, cfg.backlog)
                if feeder.enqueued_jobs != sent:
                    backlog = None  # counted before this batch: unknown now
            drained = feeder.done and backlog == 0
            if drained:
                self.drained_s = elapsed
                break
            if elapsed > cfg.max_seconds:
                self.notes.append(f"not drained within --max-seconds {cfg.max_seconds:g}: stopped")
                break
            if not calm and elapsed > cfg.chaos_until_s:
                calm = True
                chaos.calm()
                for w in workers.alive():  # restart with no fault points (also a graceful stop each)
                    workers.term(w)
            if not calm:
                chaos.tick()
            workers.supervise()
            self.progress({"elapsed": elapsed, "enqueued": feeder.enqueued_jobs, "backlog": backlog,
                           "calm": calm, "kills": workers.ended("killed")})
            time.sleep(0.1)
        chaos.calm()

    def execute(self) -> dict[str, Any]:
        if self.cfg.seed is not None:
            random.seed(self.cfg.seed)
        atexit.register(self.close)
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            feeder, ledger = self._setup()
            self._loop(feeder)
            assert self.workers is not None and self.chaos is not None
            self.workers.stop_all()
            return self._report(feeder, ledger)
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.close()

    def _report(self, feeder: Feeder, ledger: sqlite3.Connection) -> dict[str, Any]:
        assert self.workers is not None and self.chaos is not None and self.app is not None
        w, chaos = self.workers, self.chaos
        doctor = fence_findings(self.app)
        engine = self.db.engine()
        r = self.stack.redis_client()
        try:
            collect(ledger, self.stack.provider_db, engine, r, self.namespace, chaos.events, w.ends)
        finally:
            engine.dispose()
            r.close()
        result = verdict(ledger, sorted(self.cfg.faults), self.cfg.lease_s + 1.0)
        ledger.close()
        result["workers"] = {
            "sigkilled_by_driver": w.ended("killed"), "sigkilled_themselves": w.exits.self_killed,
            "sigterm_stops": len(w.exits.term_seconds), "hung": w.exits.hung,
            "max_exit_s": round(max(w.exits.term_seconds, default=0.0), 2),
            "other_exits": {str(k): v for k, v in w.exits.other.items()}}
        result["enqueue"] = {"jobs": feeder.enqueued_jobs, "batches_failed": feeder.refused,
                            "batches_refused_full": feeder.refused_full}
        result["doctor"] = doctor
        result["injection_errors"] = chaos.errors
        result["notes"] = self.notes
        result["drained_s"] = None if self.drained_s is None else round(self.drained_s, 1)
        result["seconds"] = round(time.monotonic() - self.started, 1)
        result["settings"] = self.cfg.as_dict()
        result["commit"] = _commit()
        if self.cfg.keep:
            result["directory"] = self.stack.root
        result["checks"] = checks(result, self.cfg)
        result["ok"] = all(c["ok"] for c in result["checks"])
        return result

    def close(self) -> None:
        if self.app is not None:
            self.app.close()
            self.app = None
        self.stack.close()
        try:
            self.db.drop()
        except Exception as exc:  # reported: a database left behind must be seen
            self.notes.append(f"could not drop database {self.db.name}: {exc}")


def _commit() -> str | None:
    """The repository's commit (and whether the tree differs from it), for the figures' provenance."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{' (modified)' if dirty else ''}" if head else None


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def checks(result: dict[str, Any], cfg: ChaosConfig) -> list[dict[str, Any]]:
    """Pass/fail lines, each with the counts that decide it."""
    t, jobs, workers, doctor = result["total"], result["jobs"], result["workers"], result["doctor"]
    crashes = {code: n for code, n in workers["other_exits"].items() if code != str(EXIT_RESTART)}
    restarts = workers["other_exits"].get(str(EXIT_RESTART), 0)
    out = [
        ("one provider charge per order (none only for a dead job's order, before any call or in doubt)",
         t["charged_0"] == t["uncharged_dead"] and t["charged_2plus"] == 0,
         f"{t['charged_once']}/{t['orders']} once, {t['charged_0']} never ({t['uncharged_dead']} of them "
         f"visibly: dead before any call, or in doubt), {t['charged_2plus']} twice or more"),
        ("every fence completed, or left by a dead job that names it (in doubt / effected)",
         t["unsettled"] == 0,
         f"{t['completed']} completed, {t['in_doubt']} in doubt, {t['effected']} effected, "
         f"{t['unsettled']} unsettled"),
        ("the doctor reports every fence not completed (in_doubt, owner_gone)",
         doctor["in_doubt"] == t["in_doubt"] and doctor["owner_gone"] == t["past_capture"] and "errors" not in doctor,
         f"doctor: {doctor['in_doubt']} in doubt, {doctor['owner_gone']} owner gone; fences: {t['in_doubt']} in "
         f"doubt, {t['past_capture']} calling/effected"),
        ("local order row matches the fence and the provider",
         result["local_mismatch"] == 0, f"{result['local_mismatch']} mismatched"),
        ("every job acked or dead-lettered (none lost)",
         jobs["lost"] == 0 and jobs["unfinished"] == 0 and jobs["not_sent"] == 0,
         f"{jobs['enqueued']} enqueued: {jobs['acked']} acked, {jobs['dead']} dead, {jobs['lost']} lost, "
         f"{jobs['unfinished']} unfinished, {jobs['not_sent']} never enqueued"),
        ("every dead job kept durably (ringfence_failed_jobs) with a reason",
         jobs["dead_without_row"] == 0 and jobs["dead_without_reason"] == 0,
         f"{jobs['dead_without_row']} without a row, {jobs['dead_without_reason']} without a reason"),
        ("no worker hung (exit within the bound after SIGTERM)",
         workers["hung"] == 0,
         f"{workers['sigterm_stops']} stops, max {workers['max_exit_s']}s, bound {cfg.term_bound_s:g}s, "
         f"{workers['hung']} hung"),
        ("no worker crashed (every exit asked for: signals, fault points, exit 75 for a restart)",
         not crashes, f"unexpected exit codes {crashes or 'none'}; {restarts} exit(s) 75 (replace me)"),
        ("drained within --max-seconds",
         result["drained_s"] is not None and t["orders"] == cfg.orders,
         f"{'not drained' if result['drained_s'] is None else str(result['drained_s']) + 's'} of "
         f"{cfg.max_seconds:g}s; {t['orders']} of {cfg.orders} orders enqueued"),
    ]
    return [{"check": name, "ok": bool(ok), "detail": detail} for name, ok, detail in out]
