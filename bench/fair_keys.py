"""Per-key fairness and drain cost of concurrency keys (``python -m bench.fair_keys``).

Each drain has a private redis-server and one ``ringfence worker`` process (``--concurrency``, default 10):

- keyed: ``--big`` jobs of one key, then ``--small`` keys of ``--per-key`` jobs each, enqueued in that order (the
  small keys' jobs queued behind the backlog), of a no-op task (``async def``; ``def`` with ``--sync``) declared
  with ``concurrency_key="account:{account}"`` and ``concurrency_limit=--limit``;
- plain: the same jobs of the same task declared without a key (a plain queue: FIFO).

``--body``: the handler also runs the peer bench's equal-terms body (``bench/peers/adapters/peerjob.py``: one
pipelined round trip to a metrics database, here db 15 of the drain's redis-server), a job that does something.

A worker starts and goes idle, is stopped (SIGSTOP), the jobs are enqueued (``enqueue_many``), and it is let go
(SIGCONT): time 0. Each small key's job records when it started. The two drains of a pair run side by side, let go
together, so a host shared with other work loads both alike (``--apart``: one after the other); each one's rate
and CPU per job (worker process and redis-server, from /proc) are taken over the same window, from 0 until the
first of the two has acked its last job. Printed per drain: that rate with the load average, when the small keys'
jobs started (the last one, and the slowest key's first) and the CPU per job; then over ``--rounds`` pairs the
medians and the median of keyed/plain, for CPU per job (worker + Redis) and for the rate. ``--scripts`` adds a
pair run apart with every Redis command logged (SLOWLOG, threshold 0; wall-clock µs, not in the CPU figures): the
script calls per job and µs per call of fetch, ack and the rest::

    python -m bench.fair_keys --big 100000 --small 50 --per-key 10 --rounds 5 --limit 100
"""

from __future__ import annotations

import argparse
import contextlib
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "adapters"))
import peerjob  # the peer bench's body (its adapters are not a package)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URL = os.environ.get("FAIR_KEYS_URL")
LIMIT = int(os.environ.get("FAIR_KEYS_LIMIT", "10"))
SYNC = os.environ.get("FAIR_KEYS_SYNC") == "1"
BODY = os.environ.get("FAIR_KEYS_BODY") == "1"
_r = redis.Redis.from_url(URL) if URL else None


def _started(account: str) -> None:
    if account != "big" and _r is not None:  # when the small keys' jobs start
        _r.rpush("fair:starts", f"{account} {time.time()}")


def declare(app: App, keyed: bool, limit: int, sync: bool = False, body: bool = False) -> Any:
    """The bench's task in ``app``: with a concurrency key, or plain; ``def`` or ``async def``; a no-op, or the
    peer bench's body (``body``)."""
    key: dict[str, Any] = {"concurrency_key": "account:{account}", "concurrency_limit": limit} if keyed else {}
    if sync:
        @app.task(name="fair.job", queue="fair", **key)
        def job(ctx: JobContext, account: str, n: int) -> None:
            _started(account)
            if body:
                peerjob.body()

        return job

    @app.task(name="fair.job", queue="fair", **key)
    async def ajob(ctx: JobContext, account: str, n: int) -> None:
        _started(account)
        if body:
            await peerjob.abody()

    return ajob


keyed_app = App(URL, "fair")  # the worker's apps (``--app bench.fair_keys:keyed_app``)
plain_app = App(URL, "fair")
declare(keyed_app, True, LIMIT, SYNC, BODY)
declare(plain_app, False, LIMIT, SYNC, BODY)


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


class Drain:
    """One drain on its own redis-server and worker process: ``__init__`` leaves the worker stopped (SIGSTOP) with
    the jobs enqueued; ``go`` lets it run; ``mark`` reads the CPU so far; ``result`` once it is done."""

    def __init__(self, kind: str, args: argparse.Namespace, log_dir: str, scripts: bool = False) -> None:
        self.kind, self.args, self.log = kind, args, os.path.join(log_dir, f"{kind}.log")
        self.server = EmbeddedRedis.temporary(port=free_port())
        assert self.server.process is not None
        self.pid = self.server.process.pid
        url = f"redis://127.0.0.1:{self.server.port}/0"
        self.rdb = redis.Redis.from_url(url)
        if scripts:
            self.rdb.config_set("slowlog-log-slower-than", 0)
            self.rdb.config_set("slowlog-max-len", 2_000_000)
        self.scripts = scripts
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT]), "FAIR_KEYS_URL": url,
               "FAIR_KEYS_LIMIT": str(args.limit), "FAIR_KEYS_SYNC": "1" if args.sync else "0",
               "FAIR_KEYS_BODY": "1" if args.body else "0",
               "PEERS_METRICS_URL": f"redis://127.0.0.1:{self.server.port}/15"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app",
                                          f"bench.fair_keys:{kind}_app", "--queues", "fair", "--concurrency",
                                          str(args.concurrency)], env=env, stdout=log, stderr=log)
        self.app = App(url, "fair")
        task = declare(self.app, kind == "keyed", args.limit, args.sync, args.body)
        deadline = time.monotonic() + 60
        while not self.app.broker.servers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start (log {self.log})")
            time.sleep(0.05)
        time.sleep(1.0)  # past start-up: its first idle wait
        os.kill(self.proc.pid, signal.SIGSTOP)
        payloads = [{"account": "big", "n": i} for i in range(args.big)]
        payloads += [{"account": f"small{k}", "n": i} for k in range(args.small) for i in range(args.per_key)]
        for start in range(0, len(payloads), 10_000):
            self.app.enqueue_many(task, payloads[start:start + 10_000])
        self.total = len(payloads)
        self.stats = self.app.broker.keys.queue("fair").stats
        self.rdb.slowlog_reset()
        self.t0 = 0.0
        self.cpu0 = (0.0, 0.0)
        self.at: tuple[float, int, float, float] | None = None  # (elapsed s, processed, worker CPU s, Redis CPU s)
        self.elapsed: float | None = None

    def go(self) -> None:
        self.cpu0 = cpu_s(self.proc.pid), cpu_s(self.pid)
        self.t0 = time.time()
        os.kill(self.proc.pid, signal.SIGCONT)

    def processed(self) -> int:
        if self.proc.poll() is not None:
            raise SystemExit(f"the worker exited (log {self.log})")
        return int(self.rdb.hget(self.stats, "processed") or 0)  # one HGET: the poll costs Redis little

    def mark(self) -> None:
        """The figures so far: what ``result`` counts, when the other drain of a pair ends first."""
        done = self.processed()
        self.at = (time.time() - self.t0, done, cpu_s(self.proc.pid) - self.cpu0[0], cpu_s(self.pid) - self.cpu0[1])

    def result(self) -> dict[str, Any]:
        assert self.at is not None and self.elapsed is not None
        window_s, done, cpu, rcpu = self.at
        costs = script_costs(self.rdb, self.total) if self.scripts else {}
        assert int(queue_info(self.app.broker, "fair")["pending"]) == 0
        first: dict[str, float] = {}
        last = 0.0
        for raw in self.rdb.lrange("fair:starts", 0, -1):
            key, at = (raw if isinstance(raw, str) else raw.decode()).split()
            first.setdefault(key, float(at) - self.t0)
            last = max(last, float(at) - self.t0)
        assert len(first) == self.args.small, f"{len(first)} small keys ran, {self.args.small} expected"
        if self.args.body:  # every body ran its round trip
            with redis.Redis(port=self.server.port, db=15) as metrics:
                done_bodies = int(metrics.get(peerjob.DONE) or 0)
            assert done_bodies == self.total, f"{done_bodies} bodies ran, {self.total} expected"
        return {"jobs_s": done / window_s, "elapsed_s": self.elapsed, "small_last_s": last,
                "small_first_max_s": max(first.values()), "cpu_us": cpu / done * 1e6, "redis_us": rcpu / done * 1e6,
                "total_us": (cpu + rcpu) / done * 1e6, "load": os.getloadavg()[0], "scripts": costs}

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        self.proc.wait(30)
        self.app.broker.close()
        self.server.stop()


def run(drains: list[Drain]) -> None:
    """Let the drains go at once; each one's figures are taken when the first of them ends (the same window)."""
    for d in drains:
        d.go()
    deadline = time.monotonic() + 1800
    while any(d.elapsed is None for d in drains):
        if time.monotonic() > deadline:
            raise SystemExit("the drains did not finish in 30 min")
        for d in drains:
            if d.elapsed is None and d.processed() >= d.total:
                d.elapsed = time.time() - d.t0
                if all(o.at is None for o in drains):
                    for o in drains:
                        o.mark()
        time.sleep(0.01)


def pair(args: argparse.Namespace, log_dir: str, together: bool, order: tuple[str, str],
         scripts: bool = False) -> dict[str, dict[str, Any]]:
    out = {}
    if together:
        drains = [Drain(kind, args, log_dir) for kind in order]
        try:
            run(drains)
            return {d.kind: d.result() for d in drains}
        finally:
            for d in drains:
                d.close()
    for kind in order:
        d = Drain(kind, args, log_dir, scripts)
        try:
            run([d])
            out[kind] = d.result()
        finally:
            d.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fair_keys", description=__doc__.splitlines()[0])
    ap.add_argument("--big", type=int, default=100_000, help="jobs of the one key with a backlog")
    ap.add_argument("--small", type=int, default=50, help="small keys")
    ap.add_argument("--per-key", type=int, default=10, help="jobs per small key")
    ap.add_argument("--limit", type=int, default=10, help="concurrency_limit of each key")
    ap.add_argument("--concurrency", type=int, default=10, help="the worker's --concurrency")
    ap.add_argument("--rounds", type=int, default=5, help="plain/keyed pairs")
    ap.add_argument("--apart", action="store_true", help="a pair's drains one after the other (alternated), not "
                    "side by side")
    ap.add_argument("--sync", action="store_true", help="a def handler (the job threads), not async def")
    ap.add_argument("--body", action="store_true", help="the handler runs the peer bench's body (one pipelined "
                    "round trip to a metrics database), not a no-op")
    ap.add_argument("--scripts", action="store_true", help="one more pair, apart, every Redis command logged: the "
                    "script calls per job and their µs per call")
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"plain": [], "keyed": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            order = ("plain", "keyed") if n % 2 == 0 else ("keyed", "plain")
            for kind, got in pair(args, tmp, not args.apart, order).items():
                results[kind].append(got)
                print(f"round {n + 1} {kind:5}: {got['jobs_s']:,.0f} jobs/s ({got['elapsed_s']:.1f} s, load "
                      f"{got['load']:.1f}); small keys: last job started at {got['small_last_s']:.2f} s, slowest "
                      f"key's first at {got['small_first_max_s']:.2f} s; CPU per job: worker {got['cpu_us']:.1f} "
                      f"µs, Redis {got['redis_us']:.1f} µs", flush=True)
        profiled = pair(args, tmp, False, ("plain", "keyed"), scripts=True) if args.scripts else {}
    med = {kind: {f: statistics.median(r[f] for r in rs) for f in rs[0] if f != "scripts"}
           for kind, rs in results.items()}
    pairs = list(zip(results["plain"], results["keyed"], strict=True))

    def ratio(field: str) -> str:
        rs = sorted(k[field] / p[field] for p, k in pairs)
        return f"{statistics.median(rs):.3f} ({rs[0]:.3f}-{rs[-1]:.3f})"

    loads = [r["load"] for rs in results.values() for r in rs]
    print(f"{args.big:,} jobs of one key + {args.small} keys x {args.per_key}, limit {args.limit}, worker "
          f"concurrency {args.concurrency}, {'def' if args.sync else 'async def'} "
          f"{'handler with the peer body' if args.body else 'no-op'}, drains "
          f"{'apart' if args.apart else 'side by side'}; medians of {args.rounds} (load average {min(loads):.1f}-"
          f"{max(loads):.1f}):")
    for kind in ("plain", "keyed"):
        m = med[kind]
        print(f"  {kind:5}: {m['jobs_s']:,.0f} jobs/s; every small key's job started by {m['small_last_s']:.2f} s; "
              f"CPU per job: worker {m['cpu_us']:.1f} µs, Redis {m['redis_us']:.1f} µs, both {m['total_us']:.1f} µs")
    print(f"  keyed/plain, median of the {len(pairs)} pairs (min-max): CPU per job {ratio('total_us')}, worker "
          f"{ratio('cpu_us')}, Redis {ratio('redis_us')}; drain rate {ratio('jobs_s')}")
    for kind, got in profiled.items():
        print(f"  scripts, {kind} (SLOWLOG): " + "; ".join(f"{name} {per_job:.3f}/job x {us:.1f} µs = "
                                                           f"{per_job * us:.2f} µs/job"
                                                           for name, (per_job, us) in got["scripts"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
