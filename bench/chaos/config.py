"""The chaos run's settings: every fault kind can be switched off, every rate tuned."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Fault kinds, in the order the report lists them.
KINDS = ("kill", "term", "points", "doomed", "duplicates", "redis-restart", "failover", "reshard", "oom", "db-kill",
         "skew", "provider-5xx", "provider-hang", "provider-drop", "slow-hook")
TOPOLOGIES = ("single", "sentinel", "cluster")
DESCRIPTIONS = {
    "kill": "SIGKILL a random worker (restarted at once)",
    "term": "SIGTERM a random worker (graceful restart; its exit time is measured)",
    "points": "RINGFENCE_FAULTS: workers SIGKILL themselves at the fence's fault points",
    "doomed": "orders whose worker dies right after the provider's answer on every attempt (dead owner)",
    "duplicates": "orders enqueued twice (two job ids, one order)",
    "redis-restart": "restart the private Redis (AOF, appendfsync always); every other one by SIGKILL",
    "failover": "SIGKILL the Redis master (of the queue's slot on a cluster): its replica promoted, it comes back as a "
                "replica",
    "reshard": "cluster: redis-cli --cluster reshard of 100 slots of the queue's master, then the queue's own slot",
    "oom": "CONFIG SET maxmemory just above used memory for a while (noeviction), then release",
    "db-kill": "terminate the run's database connections (pg_terminate_backend / KILL)",
    "skew": "one worker's clock runs ahead (libfaketime)",
    "provider-5xx": "the provider answers 503 and charges nothing",
    "provider-hang": "the provider charges, then answers only after the effect's timeout",
    "provider-drop": "the provider charges, then drops the connection without an answer",
    "slow-hook": "provider b's reconcile hook takes longer than the heartbeat (issue 9 item 4)",
}


@dataclass
class ChaosConfig:
    orders: int = 1000
    workers: int = 4
    concurrency: int = 8
    db: str = "postgresql"
    redis: str = "single"          # single, sentinel, cluster
    durable: bool = False          # enqueue with durable=True (a replica confirms each batch)
    max_seconds: float = 300.0
    chaos_seconds: float | None = None  # faults stop after this (default: 60 % of max_seconds), then drain
    faults: frozenset[str] = field(default_factory=lambda: frozenset(KINDS))
    seed: int | None = None
    batch: int = 100               # jobs per enqueue round trip
    backlog: int = 300             # enqueue more only while fewer jobs than this wait or run (enqueue meets the faults)
    lease_s: float = 3.0
    effect_timeout_s: float = 2.0  # the provider client's timeout; a hang lasts this + 1 s
    max_attempts: int = 25
    kill_every_s: float = 4.0
    term_every_s: float = 15.0
    points_p: float = 0.002        # kill probability at each of the five fault points
    doomed_rate: float = 0.005
    dup_rate: float = 0.10
    redis_restart_every_s: float = 20.0
    failover_every_s: float = 20.0
    oom_every_s: float = 20.0
    oom_hold_s: float = 4.0
    db_kill_every_s: float = 5.0
    skew_s: float = 10.0           # ahead; more than lease_s is what breaks worker-clock comparisons
    p_5xx: float = 0.03
    p_hang: float = 0.01
    p_drop: float = 0.02
    hook_delay_s: float = 1.3      # slower than the heartbeat (lease_s / 4)
    term_bound_s: float = 15.0     # a worker that has not exited this long after SIGTERM is hung
    keep: bool = False             # keep the run's directory (logs) after the run

    @property
    def chaos_until_s(self) -> float:
        return self.chaos_seconds if self.chaos_seconds is not None else 0.6 * self.max_seconds

    def on(self, kind: str) -> bool:
        return kind in self.faults

    def problems(self) -> list[str]:
        out = [f"unknown fault kind {k!r}; known: {', '.join(KINDS)}" for k in sorted(self.faults - set(KINDS))]
        if self.orders < 1 or self.workers < 1 or self.concurrency < 1:
            out.append("--orders, --workers and --concurrency must be >= 1")
        if self.db not in ("sqlite", "postgresql", "mariadb"):
            out.append(f"--db {self.db!r}: one of sqlite, postgresql, mariadb")
        if self.redis not in TOPOLOGIES:
            out.append(f"--redis {self.redis!r}: one of {', '.join(TOPOLOGIES)}")
        if self.durable and self.redis == "single":
            out.append("--durable needs a replica: --redis sentinel or cluster")
        if self.on("skew") and self.workers < 2:
            out.append("skew needs --workers >= 2 (one skewed worker among healthy ones)")
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = [k for k in KINDS if k in self.faults]
        return d
