"""Per-key fairness and drain cost of concurrency keys (``python -m bench.fair_keys``).

One ``ringfence worker`` process (``--concurrency``, default 10) on a private redis-server drains, in turn:

- keyed: ``--big`` jobs of one key, then ``--small`` keys of ``--per-key`` jobs each, enqueued in that order (the
  small keys' jobs queued behind the backlog), of a no-op task (``async def``; ``def`` with ``--sync``) declared
  with ``concurrency_key="account:{account}"`` and ``concurrency_limit=--limit``;
- plain: the same jobs of the same task declared without a key (a plain queue: FIFO).

The worker starts and goes idle, is stopped (SIGSTOP), the jobs are enqueued (``enqueue_many``), and it is let go
(SIGCONT): time 0. Each small key's job records when it started. Printed per drain: the drain rate (all jobs over
the time from 0 to the last ack) with the load average, when the small keys' jobs started (the last one, and the
slowest key's first), and the CPU per job of the worker process and of redis-server over the drain (on a shared
host the CPU a job costs varies far less than the rate). ``--rounds`` alternated pairs (plain, keyed; then keyed,
plain; ...); the summary gives the medians and the median over the pairs of keyed/plain, for CPU per job (worker
+ Redis) and for the rate. ``--scripts`` adds a last pair with every Redis command logged (SLOWLOG, threshold 0;
not in the CPU figures): the script calls per job and µs per call of fetch, ack and the rest::

    python -m bench.fair_keys --big 100000 --small 50 --per-key 10 --rounds 5 --limit 100 --scripts
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
from pathlib import Path
from typing import Any

import redis

from ringfence.app import App
from ringfence.queries import queue_info
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.redis.scripts import script
from ringfence.tasks import JobContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URL = os.environ.get("FAIR_KEYS_URL")
LIMIT = int(os.environ.get("FAIR_KEYS_LIMIT", "10"))
SYNC = os.environ.get("FAIR_KEYS_SYNC") == "1"
_r = redis.Redis.from_url(URL) if URL else None


def _started(account: str) -> None:
    if account != "big" and _r is not None:  # when the small keys' jobs start
        _r.rpush("fair:starts", f"{account} {time.time()}")


def declare(app: App, keyed: bool, limit: int, sync: bool = False) -> Any:
    """The bench's no-op task in ``app``: with a concurrency key, or plain; ``def`` or ``async def``."""
    key: dict[str, Any] = {"concurrency_key": "account:{account}", "concurrency_limit": limit} if keyed else {}
    if sync:
        @app.task(name="fair.job", queue="fair", **key)
        def job(ctx: JobContext, account: str, n: int) -> None:
            _started(account)

        return job

    @app.task(name="fair.job", queue="fair", **key)
    async def ajob(ctx: JobContext, account: str, n: int) -> None:
        _started(account)

    return ajob


keyed_app = App(URL, "fair")  # the worker's apps (``--app bench.fair_keys:keyed_app``)
plain_app = App(URL, "fair")
declare(keyed_app, True, LIMIT, SYNC)
declare(plain_app, False, LIMIT, SYNC)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def script_names() -> dict[str, str]:
    """SHA -> name of every ringfence script (each variant)."""
    out = {}
    for path in (Path(ROOT) / "src" / "ringfence" / "redis" / "lua").glob("[!_]*.lua"):
        s = script(path.stem)
        for sha in (s.sha, s.legacy_sha, s.sharded_sha):
            out[sha] = s.name
    return out


def script_costs(rdb: redis.Redis, jobs: int) -> dict[str, tuple[float, float]]:
    """name -> (calls per job, µs per call) of the script calls in SLOWLOG (threshold 0: every command)."""
    names = script_names()
    calls: dict[str, list[int]] = {}
    for entry in rdb.slowlog_get(10_000_000):
        command = entry["command"].split()
        if command and command[0].upper() in (b"EVALSHA", "EVALSHA") and len(command) > 1:
            sha = command[1].decode() if isinstance(command[1], bytes) else command[1]
            calls.setdefault(names.get(sha, sha[:8]), []).append(int(entry["duration"]))
    return {name: (len(d) / jobs, sum(d) / len(d)) for name, d in sorted(calls.items(), key=lambda kv: -sum(kv[1]))}


def drain(kind: str, url: str, args: argparse.Namespace, log_dir: str, pid: int,
          scripts: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT]), "FAIR_KEYS_URL": url,
           "FAIR_KEYS_LIMIT": str(args.limit), "FAIR_KEYS_SYNC": "1" if args.sync else "0"}
    rdb = redis.Redis.from_url(url)
    rdb.flushall()
    rdb.config_set("slowlog-log-slower-than", 0 if scripts else 10_000)
    rdb.config_set("slowlog-max-len", 2_000_000 if scripts else 128)
    rdb.slowlog_reset()
    with open(os.path.join(log_dir, f"{kind}.log"), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app",
                                 f"bench.fair_keys:{kind}_app", "--queues", "fair", "--concurrency",
                                 str(args.concurrency)], env=env, stdout=log, stderr=log)
    app = App(url, "fair")
    task = declare(app, kind == "keyed", args.limit, args.sync)
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
        stats = app.broker.keys.queue("fair").stats
        rdb.slowlog_reset()
        cpu0, redis0 = cpu_s(proc.pid), cpu_s(pid)
        t0 = time.time()
        os.kill(proc.pid, signal.SIGCONT)
        while int(rdb.hget(stats, "processed") or 0) < total:  # one HGET: the poll costs Redis little
            if proc.poll() is not None or time.monotonic() > deadline + 1200:
                raise SystemExit(f"the drain did not finish (log {log_dir}/{kind}.log)")
            time.sleep(0.01)
        elapsed = time.time() - t0
        cpu_us, redis_us = (cpu_s(proc.pid) - cpu0) / total * 1e6, (cpu_s(pid) - redis0) / total * 1e6
        load = os.getloadavg()[0]
        costs = script_costs(rdb, total) if scripts else {}
        assert int(queue_info(app.broker, "fair")["pending"]) == 0
        first: dict[str, float] = {}
        last = 0.0
        for raw in rdb.lrange("fair:starts", 0, -1):
            key, at = (raw if isinstance(raw, str) else raw.decode()).split()
            first.setdefault(key, float(at) - t0)
            last = max(last, float(at) - t0)
        assert len(first) == args.small, f"{len(first)} small keys ran, {args.small} expected"
        return {"jobs_s": total / elapsed, "elapsed_s": elapsed, "small_last_s": last,
                "small_first_max_s": max(first.values()), "cpu_us": cpu_us, "redis_us": redis_us,
                "total_us": cpu_us + redis_us, "load": load, "scripts": costs}
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
    ap.add_argument("--rounds", type=int, default=5, help="alternated plain/keyed pairs")
    ap.add_argument("--sync", action="store_true", help="a def handler (the job threads), not async def")
    ap.add_argument("--scripts", action="store_true", help="one more pair, every Redis command logged: the "
                    "script calls per job and their µs per call")
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"plain": [], "keyed": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis.temporary(port=free_port())
        assert server.process is not None
        try:
            url = f"redis://127.0.0.1:{server.port}/0"
            for n in range(args.rounds):
                for kind in ("plain", "keyed") if n % 2 == 0 else ("keyed", "plain"):
                    got = drain(kind, url, args, tmp, server.process.pid)
                    results[kind].append(got)
                    print(f"round {n + 1} {kind:5}: {got['jobs_s']:,.0f} jobs/s ({got['elapsed_s']:.1f} s, load "
                          f"{got['load']:.1f}); small keys: last job started at {got['small_last_s']:.2f} s, slowest "
                          f"key's first at {got['small_first_max_s']:.2f} s; CPU per job: worker {got['cpu_us']:.1f} "
                          f"µs, Redis {got['redis_us']:.1f} µs", flush=True)
            profiled = {kind: drain(kind, url, args, tmp, server.process.pid, scripts=True)["scripts"]
                        for kind in ("plain", "keyed")} if args.scripts else {}
        finally:
            server.stop()
    med = {kind: {f: statistics.median(r[f] for r in rs) for f in rs[0] if f != "scripts"}
           for kind, rs in results.items()}
    pairs = list(zip(results["plain"], results["keyed"], strict=True))

    def ratio(field: str) -> str:
        rs = sorted(k[field] / p[field] for p, k in pairs)
        return f"{statistics.median(rs):.3f} ({rs[0]:.3f}-{rs[-1]:.3f})"

    print(f"{args.big:,} jobs of one key + {args.small} keys x {args.per_key}, limit {args.limit}, worker "
          f"concurrency {args.concurrency}, {'def' if args.sync else 'async def'} handler; medians of "
          f"{args.rounds} (load average {min(r['load'] for rs in results.values() for r in rs):.1f}-"
          f"{max(r['load'] for rs in results.values() for r in rs):.1f}):")
    for kind in ("plain", "keyed"):
        m = med[kind]
        print(f"  {kind:5}: {m['jobs_s']:,.0f} jobs/s; every small key's job started by {m['small_last_s']:.2f} s; "
              f"CPU per job: worker {m['cpu_us']:.1f} µs, Redis {m['redis_us']:.1f} µs, both {m['total_us']:.1f} µs")
    print(f"  keyed/plain, median of the {len(pairs)} pairs (min-max): CPU per job {ratio('total_us')}, worker "
          f"{ratio('cpu_us')}, Redis {ratio('redis_us')}; drain rate {ratio('jobs_s')}")
    for kind, costs in profiled.items():
        print(f"  scripts, {kind} (SLOWLOG): " + "; ".join(f"{name} {per_job:.3f}/job x {us:.1f} µs = "
                                                           f"{per_job * us:.2f} µs/job"
                                                           for name, (per_job, us) in costs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
