"""The driver's side of the chaos: timed faults on Redis, the database, the provider and the workers.

Each periodic fault fires at random intervals around its mean (``*_every_s``) while the chaos phase
lasts; every firing is recorded as an :class:`Event` (wall-clock window) for the per-fault figures.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from bench.chaos.config import ChaosConfig
    from bench.chaos.database import ChaosDatabase
    from bench.chaos.provider import Client
    from bench.chaos.stack import Stack
    from bench.chaos.workers import Workers


def applies(kind: str, cfg: ChaosConfig, db: ChaosDatabase) -> bool:
    """A restart of the one Redis on a single server, a master kill on Sentinel or a cluster, a reshard on a cluster;
    no db-kill on SQLite."""
    if kind == "db-kill":
        return db.kind != "sqlite"
    if kind in ("redis-restart", "failover"):
        return (kind == "failover") == (cfg.redis != "single")
    return kind != "reshard" or cfg.redis == "cluster"  # once, early in the run


@dataclass
class Event:
    kind: str
    t0: float  # wall clock (the provider logs wall-clock times too)
    t1: float
    detail: str = ""


class Chaos:
    """Fires the periodic faults; ``calm()`` undoes every lasting one (OOM, provider misbehaviour)."""

    def __init__(self, cfg: ChaosConfig, stack: Stack, db: ChaosDatabase, workers: Workers,
                 provider: Client) -> None:
        self.cfg, self.stack, self.db, self.workers, self.provider = cfg, stack, db, workers, provider
        self.events: list[Event] = []
        self.errors: list[str] = []  # faults the driver failed to inject (reported, never fatal)
        self.restarts = 0
        self._oom_until: float | None = None
        start = time.monotonic()
        # First firings early, so that even a short run sees each fault at least once.
        # The reshard (once) comes before the first failover, which can hold the loop while the old master rejoins.
        periods = {"kill": cfg.kill_every_s, "term": cfg.term_every_s, "redis-restart": cfg.redis_restart_every_s,
                   "reshard": 1e9, "failover": cfg.failover_every_s, "oom": cfg.oom_every_s,
                   "db-kill": cfg.db_kill_every_s}
        self.every = {k: v for k, v in periods.items() if cfg.on(k) and applies(k, cfg, db)}
        self.next_at = {k: start + min(v, 2.0 + 1.5 * i) for i, (k, v) in enumerate(self.every.items())}

    def start(self) -> None:
        """Switch on the lasting faults: provider misbehaviour and the workers' fault points."""
        c = self.cfg
        self.provider.set_faults(p_5xx=c.p_5xx if c.on("provider-5xx") else 0.0,
                                 p_hang=c.p_hang if c.on("provider-hang") else 0.0,
                                 p_drop=c.p_drop if c.on("provider-drop") else 0.0,
                                 hang_s=c.effect_timeout_s + 1.0)
        if c.on("points"):
            points = ("after_capture", "after_calling", "after_effect", "after_record", "before_commit")
            self.workers.faults_env = ",".join(f"{p}:{c.points_p}" for p in points)

    def tick(self) -> None:
        now = time.monotonic()
        if self._oom_until is not None and now >= self._oom_until:
            self._release_oom()
        for kind, at in self.next_at.items():
            if now >= at:
                self.next_at[kind] = now + self.every[kind] * random.uniform(0.5, 1.5)
                self._fire(kind)

    def _fire(self, kind: str) -> None:
        t0 = time.time()
        try:
            detail = getattr(self, "_" + kind.replace("-", "_"))()
        except Exception as exc:  # a fault that could not be injected is reported, never fatal
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return
        if detail is not None:
            self.events.append(Event(kind, t0, time.time(), detail))

    def _kill(self) -> str | None:
        pid = self.workers.kill_random()
        return None if pid is None else f"pid {pid}"

    def _term(self) -> str | None:
        pid = self.workers.term_random()
        return None if pid is None else f"pid {pid}"

    def _redis_restart(self) -> str:
        self.restarts += 1
        hard = self.restarts % 2 == 0
        if self._oom_until is not None:
            self._oom_until = None  # a restart forgets CONFIG SET; the OOM window ends with it
        down = self.stack.restart_redis(hard)
        return f"{'SIGKILL' if hard else 'SIGTERM'}, down {down:.2f}s"

    def _failover(self) -> str:
        if self._oom_until is not None:
            self._oom_until = None  # the promoted replica has no maxmemory set; the OOM window ends with it
        return self.stack.kill_master()

    def _reshard(self) -> str:
        return self.stack.reshard()

    def _oom(self) -> str | None:
        if self._oom_until is not None:
            return None
        r = self.stack.redis_client()
        try:
            used = int(r.info("memory")["used_memory"])
            r.config_set("maxmemory", used + 64 * 1024)
        finally:
            r.close()
        self._oom_until = time.monotonic() + self.cfg.oom_hold_s
        return f"maxmemory {used + 64 * 1024} (used {used}) for {self.cfg.oom_hold_s:g}s"

    def _release_oom(self) -> None:
        r = self.stack.redis_client()
        try:
            r.config_set("maxmemory", 0)
            self._oom_until = None
            # The window's event spans the hold: stretch the last oom event to now.
            for e in reversed(self.events):
                if e.kind == "oom":
                    e.t1 = time.time()
                    break
        except redis.RedisError as exc:
            self.errors.append(f"oom release: {exc}")
        finally:
            r.close()

    def _db_kill(self) -> str:
        return f"{self.db.terminate()} connection(s)"

    def calm(self) -> None:
        """End every lasting fault; workers spawned from now on have no fault points."""
        self.next_at.clear()
        self.workers.faults_env = None
        if self._oom_until is not None:
            self._release_oom()
        try:
            self.provider.set_faults(p_5xx=0.0, p_hang=0.0, p_drop=0.0)
        except Exception as exc:
            self.errors.append(f"provider calm: {exc}")
