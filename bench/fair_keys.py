"""Per-key fairness and drain rate of concurrency keys (``python -m bench.fair_keys``).

One ``ringfence worker`` process (``--concurrency``, default 10) on a private redis-server drains, in turn:

- keyed: ``--big`` jobs of one key, then ``--small`` keys of ``--per-key`` jobs each, enqueued in that order (the
  small keys' jobs queued behind the backlog), of a no-op ``async def`` task declared with
  ``concurrency_key="account:{account}"`` and ``concurrency_limit=--limit``;
- plain: the same jobs of the same task declared without a key (a plain queue: FIFO).

The worker starts and goes idle, is stopped (SIGSTOP), the jobs are enqueued (``enqueue_many``), and it is let go
(SIGCONT): time 0. Each small key's job records when it started. Printed per drain: the drain rate (all jobs over
the time from 0 to the last ack), and when the small keys' jobs started (the last one, and the slowest key's
first), and CPU per job of the worker and of Redis over the drain (a measure a loaded host disturbs less than
the rate); the keyed rate over the plain rate; medians over ``--rounds`` alternated pairs::

    python -m bench.fair_keys --big 100000 --small 50 --per-key 10 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis

from ringfence.app import App
from ringfence.queries import queue_info
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.tasks import JobContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URL = os.environ.get("FAIR_KEYS_URL")
LIMIT = int(os.environ.get("FAIR_KEYS_LIMIT", "10"))
_r = redis.Redis.from_url(URL) if URL else None

def declare(app: App, keyed: bool, limit: int) -> Any:
    """The bench's no-op task in ``app``: with a concurrency key, or plain."""
    key: dict[str, Any] = {"concurrency_key": "account:{account}", "concurrency_limit": limit} if keyed else {}

    @app.task(name="fair.job", queue="fair", **key)
    async def job(ctx: JobContext, account: str, n: int) -> None:
        if account != "big" and _r is not None:  # when the small keys' jobs start
            _r.rpush("fair:starts", f"{account} {time.time()}")

    return job


keyed_app = App(URL, "fair")  # the worker's apps (``--app bench.fair_keys:keyed_app``)
plain_app = App(URL, "fair")
declare(keyed_app, True, LIMIT)
declare(plain_app, False, LIMIT)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(rdb: redis.Redis) -> float:
    info = rdb.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(kind: str, url: str, args: argparse.Namespace, log_dir: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT]), "FAIR_KEYS_URL": url,
           "FAIR_KEYS_LIMIT": str(args.limit)}
    rdb = redis.Redis.from_url(url)
    rdb.flushall()
    with open(os.path.join(log_dir, f"{kind}.log"), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app",
                                 f"bench.fair_keys:{kind}_app", "--queues", "fair", "--concurrency",
                                 str(args.concurrency)], env=env, stdout=log, stderr=log)
    app = App(url, "fair")
    task = declare(app, kind == "keyed", args.limit)
    try:
        deadline = time.monotonic() + 60
        while not app.broker.servers():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start (log {log_dir}/{kind}.log)")
            time.sleep(0.05)
        time.sleep(1.0)  # past start-up: its first idle wait
        os.kill(proc.pid, signal.SIGSTOP)
        payloads = [{"account": "big", "n": i} for i in range(args.big)]
        payloads += [{"account": f"small{k}", "n": i} for k in range(args.small) for i in range(args.per_key)]
        for start in range(0, len(payloads), 10_000):
            app.enqueue_many(task, payloads[start:start + 10_000])
        total = len(payloads)
        cpu0, redis0 = cpu_s(proc.pid), redis_cpu_s(rdb)
        t0 = time.time()
        os.kill(proc.pid, signal.SIGCONT)
        while int(queue_info(app.broker, "fair")["processed"]) < total:
            if proc.poll() is not None or time.monotonic() > deadline + 1200:
                raise SystemExit(f"the drain did not finish (log {log_dir}/{kind}.log)")
            time.sleep(0.01)
        elapsed = time.time() - t0
        cpu_us, redis_us = (cpu_s(proc.pid) - cpu0) / total * 1e6, (redis_cpu_s(rdb) - redis0) / total * 1e6
        first: dict[str, float] = {}
        last = 0.0
        for raw in rdb.lrange("fair:starts", 0, -1):
            key, at = (raw if isinstance(raw, str) else raw.decode()).split()
            first.setdefault(key, float(at) - t0)
            last = max(last, float(at) - t0)
        assert len(first) == args.small, f"{len(first)} small keys ran, {args.small} expected"
        return {"jobs_s": total / elapsed, "elapsed_s": elapsed, "small_last_s": last,
                "small_first_max_s": max(first.values()), "cpu_us": cpu_us, "redis_us": redis_us}
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(30)
        app.broker.close()


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fair_keys", description=__doc__.splitlines()[0])
    ap.add_argument("--big", type=int, default=100_000, help="jobs of the one key with a backlog")
    ap.add_argument("--small", type=int, default=50, help="small keys")
    ap.add_argument("--per-key", type=int, default=10, help="jobs per small key")
    ap.add_argument("--limit", type=int, default=10, help="concurrency_limit of each key")
    ap.add_argument("--concurrency", type=int, default=10, help="the worker's --concurrency")
    ap.add_argument("--rounds", type=int, default=3, help="alternated plain/keyed pairs")
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"plain": [], "keyed": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis.temporary(port=free_port())
        try:
            url = f"redis://127.0.0.1:{server.port}/0"
            for n in range(args.rounds):
                for kind in ("plain", "keyed") if n % 2 == 0 else ("keyed", "plain"):
                    got = drain(kind, url, args, tmp)
                    results[kind].append(got)
                    print(f"round {n + 1} {kind:5}: {got['jobs_s']:,.0f} jobs/s ({got['elapsed_s']:.1f} s); small "
                          f"keys: last job started at {got['small_last_s']:.2f} s, slowest key's first at "
                          f"{got['small_first_max_s']:.2f} s; CPU per job: worker {got['cpu_us']:.0f} µs, Redis "
                          f"{got['redis_us']:.0f} µs", flush=True)
        finally:
            server.stop()
    med = {kind: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for kind, rs in results.items()}
    print(f"{args.big:,} jobs of one key + {args.small} keys x {args.per_key}, limit {args.limit}, worker "
          f"concurrency {args.concurrency}; medians of {args.rounds}:")
    for kind in ("plain", "keyed"):
        m = med[kind]
        print(f"  {kind:5}: {m['jobs_s']:,.0f} jobs/s; every small key's job started by {m['small_last_s']:.2f} s; "
              f"CPU per job: worker {m['cpu_us']:.0f} µs, Redis {m['redis_us']:.0f} µs")
    print(f"  keyed/plain drain rate: {med['keyed']['jobs_s'] / med['plain']['jobs_s']:.3f}; worker CPU per job: "
          f"{med['keyed']['cpu_us'] / med['plain']['cpu_us']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
