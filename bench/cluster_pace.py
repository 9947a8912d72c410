"""Pick-up latency and per-queue pace on a Redis Cluster, against a single Redis, with real worker processes.

    python -m bench.cluster_pace pickup --rate 200 --seconds 10
    python -m bench.cluster_pace failover --rate 200 --seconds 16 --kill-at 4

``pickup``: a producer enqueues no-op jobs at ``--rate`` over 6 queues (two per master) for ``--seconds``, as plain
enqueues, with an explicit ``job_id`` and with ``durable=True``; 2 workers serve every queue. Latency is a job's
start (in the handler) minus the moment its enqueue returned; p50/p99/max per set-up and variant.

``failover``: the same producer on a 3-master cluster with one replica each; at ``--kill-at`` the master of two of
the queues is SIGKILLed (its replica takes over after the node timeout). Per second: jobs started on the queues
of the healthy masters; then the longest pause between two starts on a healthy queue, and the jobs of healthy
queues that ran more than once or as attempt 2+ (orphans)."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import redis

from bench.servers import Cluster, single_and_cluster, stop_workers
from ringfence import App

ROOT = Path(__file__).resolve().parent.parent

RECORD = "redis://127.0.0.1:6379/0"  # starts are recorded outside the Redis under test
APP = '''
import os, time
import redis
from ringfence import App
app = App(namespace=os.environ["RINGFENCE_NAMESPACE"], environment="bench")
record = redis.Redis.from_url(os.environ["BENCH_RECORD_URL"])

@app.task(name="stamp")
async def stamp(ctx, n: int) -> None:
    record.rpush(os.environ["RINGFENCE_NAMESPACE"] + ":runs", f"{ctx.id} {ctx.queue} {ctx.attempt} {time.time()}")
'''


def _stamp(ctx: object, n: int) -> None:
    pass


def queues_by_node(app: App, cluster: bool, per_node: int = 2) -> dict[str, list[str]]:
    """Node name -> ``per_node`` queue names whose keys it owns (one 'node' on a single Redis)."""
    if not cluster:
        return {"single": [f"q{i}" for i in range(3 * per_node)]}
    out: dict[str, list[str]] = defaultdict(list)
    for i in range(2000):
        node = app.broker.sync.get_node_from_key(  # type: ignore[attr-defined]
            app.broker.keys.queue(f"q{i}").pending).name
        if len(out[node]) < per_node:
            out[node].append(f"q{i}")
    return dict(out)


class Producer(threading.Thread):
    def __init__(self, app: App, queues: list[str], rate: float, seconds: float, variant: str) -> None:
        super().__init__(daemon=True)
        task = app.task(name="stamp")(_stamp)
        self.bound = {q: task.with_options(queue=q, durable=variant == "durable") for q in queues}
        self.queues, self.rate, self.seconds, self.variant = queues, rate, seconds, variant
        self.acked: dict[str, tuple[str, float]] = {}  # id -> (queue, when its enqueue returned)
        self.refused = 0

    def run(self) -> None:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < self.seconds:
            queue = self.queues[n % len(self.queues)]
            bound = self.bound[queue]
            try:
                if self.variant == "job_id":
                    bound = bound.with_options(job_id=f"j{uuid.uuid4().hex[:12]}")
                job_id = bound.enqueue(n=n)
                self.acked[job_id] = (queue, time.time())
            except Exception:  # a refused enqueue is counted, not fatal, during a failover
                self.refused += 1
            n += 1
            time.sleep(max(0.0, start + n / self.rate - time.monotonic()))


def start_workers(url: str, ns: str, queues: list[str], appdir: Path, n: int) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns, "BENCH_RECORD_URL": RECORD,
           "PYTHONPATH": f"{appdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    logs = os.environ.get("BENCH_LOGS")  # a folder for the workers' output
    return [subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "paceapp:app", "--queues",
                              ",".join(queues), "--concurrency", "50"], env=env, stderr=subprocess.STDOUT,
                             stdout=open(f"{logs}/{ns}-{i}.log", "w") if logs else subprocess.DEVNULL)
            for i in range(n)]


def ready(app: App, n: int) -> None:
    """Wait until ``n`` workers registered, and a second more: they are idle, waiting for jobs."""
    deadline = time.monotonic() + 60
    while len(app.broker.servers()) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)


def runs(ns: str) -> list[tuple[str, str, int, float]]:
    rows = redis.Redis.from_url(RECORD).lrange(f"{ns}:runs", 0, -1)
    out = []
    for r in rows:
        job_id, queue, attempt, at = (r.decode() if isinstance(r, bytes) else str(r)).split()
        out.append((job_id, queue, int(attempt), float(at)))
    return out


def wait_ran(ns: str, want: int, timeout: float) -> list[tuple[str, str, int, float]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len({r[0] for r in runs(ns)}) < want:
        time.sleep(0.2)
    return runs(ns)


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


def pickup(url: str, cluster: bool, variant: str, args: argparse.Namespace, appdir: Path) -> str:
    ns = f"p{uuid.uuid4().hex[:8]}"
    app = App(url, ns, environment="bench")
    queues = [q for qs in queues_by_node(app, cluster).values() for q in qs]
    procs = start_workers(url, ns, queues, appdir, 2)
    try:
        ready(app, 2)
        producer = Producer(app, queues, args.rate, args.seconds, variant)
        producer.run()
        got = wait_ran(ns, len(producer.acked), 30)
    finally:
        stop_workers(procs)
        app.close()
    first: dict[str, float] = {}
    for job_id, _, _, at in got:
        first[job_id] = min(at, first.get(job_id, at))
    lat = [(first[j] - acked) * 1000 for j, (_, acked) in producer.acked.items() if j in first]
    missing = len(producer.acked) - len(lat)
    return (f"p50 {pct(lat, 0.5):6.1f} ms  p99 {pct(lat, 0.99):7.1f} ms  max {max(lat):7.1f} ms  "
            f"({len(lat)} jobs{f', {missing} not run' if missing else ''})")


def failover(args: argparse.Namespace, appdir: Path) -> None:
    (appdir / "fc").mkdir()
    c = Cluster(appdir / "fc", replicas=1, node_timeout_ms=args.node_timeout_ms, full_coverage=args.full_coverage)
    ns = f"f{uuid.uuid4().hex[:8]}"
    app = App(c.url, ns, environment="bench")
    try:
        by_node = queues_by_node(app, True)
        victim = sorted(by_node)[0]
        healthy = [q for node, qs in by_node.items() if node != victim for q in qs]
        queues = [q for qs in by_node.values() for q in qs]
        procs = start_workers(c.url, ns, queues, appdir, 2)
        try:
            ready(app, 2)
            # one producer per queue: a producer stuck on the dead master's queue holds up no other
            producers = [Producer(app, [q], args.rate / len(queues), args.seconds, "plain") for q in queues]
            t0 = time.time()
            for producer in producers:
                producer.start()
            time.sleep(args.kill_at)
            c.kill(int(victim.rsplit(":", 1)[1]))
            killed = time.time()
            for producer in producers:
                producer.join()
                if producer is not producers[0]:
                    producers[0].acked.update(producer.acked)
                    producers[0].refused += producer.refused
            producer = producers[0]
            producer.rate = args.rate
            got = wait_ran(ns, len(producer.acked), args.lease_wait)
        finally:
            stop_workers(procs)
        report(got, producer, healthy, t0, killed, victim, queues)
    finally:
        app.close()
        c.stop()


def report(got: list[tuple[str, str, int, float]], producer: Producer, healthy: list[str], t0: float,
           killed: float, victim: str, queues: list[str]) -> None:
    per_second: dict[int, int] = defaultdict(int)
    starts: dict[str, list[float]] = defaultdict(list)
    count: dict[str, int] = defaultdict(int)
    orphans = 0
    for job_id, queue, attempt, at in got:
        count[job_id] += 1
        if queue in healthy:
            per_second[int(at - t0)] += 1
            starts[queue].append(at)
            orphans += attempt > 1
    healthy_rate = producer.rate * len(healthy) / len(queues)
    print(f"killed master {victim} at {killed - t0:.1f}s; healthy queues {' '.join(healthy)} "
          f"(offered {healthy_rate:.0f} jobs/s)")
    print("healthy jobs started per second: " + " ".join(f"{per_second.get(s, 0)}" for s in range(
        int(max(at for *_, at in got) - t0) + 1)))
    gaps = [b - a for q in starts for a, b in zip(sorted(starts[q]), sorted(starts[q])[1:], strict=False)
            if killed - 1 < b and a < t0 + producer.seconds]
    first: dict[str, float] = {}
    for job_id, _, _, at in got:
        first[job_id] = min(at, first.get(job_id, at))
    lat = [first[j] - t for j, (q, t) in producer.acked.items() if q in healthy and j in first and t >= killed]
    if lat:
        print(f"healthy jobs enqueued after the kill, enqueue to start: p50 {pct(lat, 0.5):.3f}s p99 "
              f"{pct(lat, 0.99):.3f}s max {max(lat):.3f}s ({len(lat)} jobs)")
    print(f"longest pause between starts on a healthy queue: {max(gaps, default=0):.2f}s; healthy jobs run as "
          f"attempt 2+: {orphans}; healthy jobs not run: "
          f"{sum(1 for j, (q, _) in producer.acked.items() if q in healthy and j not in count)}; "
          f"refused enqueues (all queues): {producer.refused}")
    late = [(job_id, queue, at - t0) for job_id, queue, attempt, at in got if queue in healthy and attempt > 1]
    if late:  # to look up in the workers' logs (BENCH_LOGS)
        print("healthy jobs run as attempt 2+ (id queue start): " + "; ".join(
            f"{job_id} {queue} {at:.1f}s" for job_id, queue, at in late[:10]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["pickup", "failover"])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--kill-at", type=float, default=4.0)
    ap.add_argument("--node-timeout-ms", type=int, default=2000)
    ap.add_argument("--no-full-coverage", dest="full_coverage", action="store_false",
                    help="cluster-require-full-coverage no: the other masters serve while a master's slots are down")
    ap.add_argument("--lease-wait", type=float, default=40.0, help="how long to wait for orphans to run")
    ap.add_argument("--variants", default="plain,job_id,durable")
    args = ap.parse_args()
    logging.getLogger("ringfence.redis").setLevel(logging.ERROR)  # the producer's outage lines
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "paceapp.py").write_text(APP)
        if args.mode == "failover":
            failover(args, d)
            return 0
        with single_and_cluster(d, replicas=1) as targets:
            for variant in args.variants.split(","):
                for name, url, is_cluster in targets:
                    print(f"{name:17} {variant:8} {pickup(url, is_cluster, variant, args, d)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
