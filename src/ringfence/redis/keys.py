"""Every Redis key name ringfence uses, built in one place.

Per-queue keys share the hash tag ``{namespace:queue}`` so each script touches one slot (Redis Cluster); the
partitions of a partitioned queue each have a tag of their own, chosen to spread them over the slots (queue_tag). The
namespace keys (queues, servers, server_info, meta, dependencies) are read and written together by scripts: on a
Redis Cluster they share the hash tag ``{namespace}`` (``ns:{ns}:servers``); on a single Redis or Sentinel they
keep their untagged names (``ns:servers``), so existing deployments need no migration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

#: Specs up to this size of jobs ready now, with a generated id, no unique key and no stored result go into the
#: pending list itself (``<id><spec>``), with no ``jobs`` entry until fetch leases them: ~95 instead of ~165 bytes
#: per queued job. Larger specs stay in the hash: a lookup by id scans the list (``Reads.pending_entry``), and
#: that scan copies every entry.
INLINE_MAX_BYTES = 512


#: A partition of a queue declared with ``partitions=N`` (app.py) is a queue of its own named ``<queue>~<i>of<N>``;
#: '~' is outside the names users may give (settings.check_name), so no queue of theirs looks like one.
PARTITION = re.compile(r"(.+)~(\d+)of(\d+)")


def partition_name(queue: str, index: int, partitions: int) -> str:
    return f"{queue}~{index}of{partitions}"


def logical_queue(name: str) -> str:
    """The queue a partition belongs to (a plain queue: itself)."""
    if "~" not in name:  # asked for every job a worker admits: a plain queue skips the pattern
        return name
    m = PARTITION.fullmatch(name)
    return m.group(1) if m else name


def queue_tag(namespace: str, queue: str) -> str:
    """The hash tag of a queue's keys: ``namespace:queue``; for partition i of N, the first of ``namespace:queue``,
    ``namespace:queue.1``, ... whose slot lies in the middle half of the i-th of N equal slices of the slot space.
    Masters given equal slot ranges (``redis-cli --cluster create``) then hold N/M partitions each when N is a
    multiple of the M masters. N is part of the name, so a queue redeclared with another N gets new keys and never
    reads the old ones under a moved tag."""
    base = f"{namespace}:{queue}"
    m = PARTITION.fullmatch(queue)
    if m is None:
        return base
    index, count = int(m.group(2)), int(m.group(3))
    width = REDIS_CLUSTER_HASH_SLOTS / count
    low, high = (index + 0.25) * width, (index + 0.75) * width
    if high - low < 1:  # more partitions than a quarter of the slots: spread as the hash falls
        return base
    for n in range(100_000):
        tag = base if n == 0 else f"{base}.{n}"
        if low <= key_slot(tag.encode()) < high:
            return tag
    return base  # unreachable in practice: a slice of >= 1 slot is hit within a few thousand tries


def split_entry(entry: bytes | str) -> tuple[str, bytes | None]:
    """A pending entry as (id, spec stored inline or None: the spec is in the ``jobs`` hash). Ids never hold '{'
    (settings.check_name) and a spec always starts with it."""
    entry = entry.encode() if isinstance(entry, str) else bytes(entry)
    at = entry.find(b"{")
    if at < 0:
        return entry.decode(), None
    return entry[:at].decode(), entry[at:]


@dataclass(frozen=True)
class QueueKeys:
    pending: str     # list: ready to run, LPUSH to enqueue, RPOP to fetch (FIFO); an entry is an id (its spec is
    #                  in jobs) or, for a job stored inline (INLINE_MAX_BYTES), '<id><spec>' (the spec starts at '{')
    jobs: str        # hash: id -> job spec JSON (every job not dead nor done, except the inline pending ones)
    scheduled: str   # zset: id -> run-at ms
    retry: str       # zset: id -> retry-at ms
    active: str      # zset: id -> lease deadline ms
    lease: str       # hash: id -> lease token of the attempt that holds it
    attempts: str    # hash: id -> attempts started
    history: str     # hash: id -> JSON list of failed attempts
    dead: str        # zset: id -> died ms
    dead_jobs: str   # hash: id -> dead record JSON
    durable: str     # zset: id -> died ms, dead jobs whose failed_jobs row is still owed (worker/durable.py)
    stats: str       # hash: processed, failed, retried, dead, orphaned, ... counters
    idle: str        # zset: worker id -> ms until which it sleeps waiting for a wake-up
    idle_lease: str  # hash: idle worker id -> its lease ms, for the jobs enqueue_ready.lua pushes to it
    paused: str      # string: exists while the queue is paused
    wake: str        # pub/sub channel: published on enqueue when a worker is idle; '<wake>:<worker id>' carries
    #                  the jobs leased to that worker (enqueue_ready.lua)
    unique: str      # hash: unique key -> id of the job holding it
    unique_exp: str  # zset: unique key -> ms when the hold ends
    debounce: str     # hash: debounce key -> '<max wait end ms>:<id of its scheduled job>' (lua/debounce.lua)
    debounce_at: str  # zset: debounce key -> run-at ms of its job
    cron: str        # hash: periodic name -> last tick ms handled
    minutes: str     # hash: p<minute>/f<minute> -> processed/failed in that minute (a day kept; dashboard)
    outbox_sent: str  # zset: id -> ms the outbox relay sent it; refuses a second send (lua/relay.lua)
    waiting: str     # hash: id of a job enqueued with depends_on -> its dependencies not finished (lua/_depends.lua)
    waiters: str     # hash: dependency id -> ids of the jobs waiting for it


@dataclass(frozen=True)
class BreakerKeys:
    state: str        # hash: state, open_until, probe_until, changed_ms, rate_window, rate_count
    transitions: str  # list: "from>to@ms", newest first, 50 kept
    failures: str     # zset: failure id -> ms, within the window


class Keys:
    def __init__(self, namespace: str, cluster: bool = False) -> None:
        self.ns = namespace
        n = f"{namespace}:{{{namespace}}}" if cluster else namespace
        self.queues = f"{n}:queues"      # set: every queue name ever used
        self.servers = f"{n}:servers"    # zset: server id -> heartbeat expiry ms
        self.server_info = f"{n}:server_info"  # hash: server id -> JSON host, pid, queues, running jobs
        self.meta = f"{n}:meta"          # hash: env, created
        self.dependencies = f"{n}:dependencies"  # set: every dependency with a circuit breaker
        self.outbox_lease = f"{n}:outbox_lease"  # string: the outbox relay holding the lease (one at a time)
        self.alerts = f"{namespace}:alerts"  # hash: incident key -> JSON (since, message, status) (redis/observe.py)
        self.alerts_leader = f"{namespace}:alerts:leader"  # string: the alert evaluator holding the lease
        self._cache: dict[str, QueueKeys] = {}

    def breaker(self, dependency: str) -> BreakerKeys:
        p = f"{self.ns}:{{{self.ns}:dep:{dependency}}}"
        return BreakerKeys(state=f"{p}:breaker", transitions=f"{p}:transitions", failures=f"{p}:failures")

    def slots(self, kind: str, name: str) -> str:
        """zset of a concurrency limit: holder -> slot lease end ms. kind: task or queue (a global limit), or
        ``key:<queue>`` (the slots of concurrency key ``name`` in that queue, in its slot: lua/_keyed.lua)."""
        if kind.startswith("key:"):
            return f"{self.keyed(kind[4:])}s:{name}"
        return f"{self.ns}:{{{self.ns}:limit:{kind}:{name}}}:slots"

    def keyed(self, queue: str) -> str:
        """The prefix of a queue's concurrency-key keys (ring, parked, limit, per-key lists and slots), which
        lua/_keyed.lua lists; they share the queue's hash tag."""
        return self.queue(queue).pending.removesuffix("pending") + "ck:"

    def result(self, job_id: str) -> str:
        """list: a finished job's result record (tasks with store_result), one key (and slot) per job."""
        return f"{self.ns}:{{{self.ns}:result:{job_id}}}"

    def workflow(self, queue: str, workflow_id: str) -> str:
        """hash: one workflow's steps and state, in the slot of the queue its steps run in (redis/workflows.py)."""
        return f"{self.ns}:{{{queue_tag(self.ns, queue)}}}:wf:{workflow_id}"

    def queue(self, name: str) -> QueueKeys:
        keys = self._cache.get(name)
        if keys is None:
            p = f"{self.ns}:{{{queue_tag(self.ns, name)}}}"
            keys = QueueKeys(
                pending=f"{p}:pending",
                jobs=f"{p}:jobs",
                scheduled=f"{p}:scheduled",
                retry=f"{p}:retry",
                active=f"{p}:active",
                lease=f"{p}:lease",
                attempts=f"{p}:attempts",
                history=f"{p}:history",
                dead=f"{p}:dead",
                dead_jobs=f"{p}:dead_jobs",
                durable=f"{p}:durable",
                stats=f"{p}:stats",
                idle=f"{p}:idle",
                idle_lease=f"{p}:idle_lease",
                paused=f"{p}:paused",
                wake=f"{p}:wake",
                unique=f"{p}:unique",
                unique_exp=f"{p}:unique_exp",
                debounce=f"{p}:debounce",
                debounce_at=f"{p}:debounce_at",
                cron=f"{p}:cron",
                minutes=f"{p}:minutes",
                outbox_sent=f"{p}:outbox_sent",
                waiting=f"{p}:waiting",
                waiters=f"{p}:waiters",
            )
            self._cache[name] = keys
        return keys


def fence_key(prefix: str, subject: str, step: str) -> str:
    """string: one fence kept in Redis (redis/fence.py). The subject's length comes first, so no two (subject,
    step) pairs share a key (``order:1`` + ``refund:charge`` vs ``order:1:refund`` + ``charge``) and the key
    stays readable."""
    return f"{prefix}:fence:{len(subject)}:{subject}:{step}"
