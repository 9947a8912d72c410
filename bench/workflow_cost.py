"""The cost of a workflow step against a plain job (``python -m bench.workflow_cost``).

One ``ringfence worker`` process (default settings) against a private redis-server drains, alternately, ``--jobs``
plain no-op jobs (``enqueue_many``), the same number of steps as chains of ``--length`` no-op steps (each step
takes the previous result as ``previous``), and as many steps in chains whose steps alternate between two queues
(``across``: each step handed over to the other queue; the worker serves both). The worker is started, stopped
(SIGSTOP) while the work is enqueued, and let go. Per job or step: the commands Redis ran (``INFO commandstats``,
those inside scripts included), the script calls (round trips: the producer's enqueue or start, the worker's
fetches, acks, advances and hand-overs), the worker's CPU, Redis's CPU; and the drain's rate (a chain's steps run
one after the other). Medians of ``--rounds``.
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

import ringfence
from ringfence.app import App
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.tasks import JobContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
app = App(os.environ.get("WF_BENCH_URL"), namespace="wfbench")


@app.task(queue="bench")
def plain(ctx: JobContext, n: int) -> None:
    pass


@app.task(queue="bench")
def step(ctx: JobContext, n: int, previous: Any = None) -> int:
    return n


@app.task(queue="bench2")
def step2(ctx: JobContext, n: int, previous: Any = None) -> int:
    return n


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _calls(info: dict[str, Any]) -> int:
    return sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_"))


def _redis_cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(mod: Any, url: str, kind: str, jobs: int, length: int, log: str) -> dict[str, float]:
    b = mod.app.broker
    b.sync.flushall()
    env = {**os.environ, "WF_BENCH_URL": url, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "src")])}
    with open(log, "ab") as out:
        queues = "bench,bench2" if kind == "across" else "bench"
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "bench.workflow_cost:app",
                                 "--queues", queues], env=env, stdout=out, stderr=out)
    try:
        while not b.servers():
            if proc.poll() is not None:
                raise SystemExit(f"the worker did not start (log {log})")
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGSTOP)
        b.sync.config_resetstat()
        if kind == "plain":
            mod.app.enqueue_many(mod.plain, [{"n": i} for i in range(jobs)])
        else:
            tasks = [mod.step, mod.step2] if kind == "across" else [mod.step]
            for c in range(jobs // length):
                ringfence.chain(*[tasks[i % len(tasks)].s(n=c * length + i) for i in range(length)]).enqueue()
        info0, cpu0 = b.sync.info("all"), _cpu(proc.pid)
        start = time.perf_counter()
        os.kill(proc.pid, signal.SIGCONT)
        polls = 0
        stats = [b.keys.queue(q).stats for q in ("bench", "bench2")]
        while sum(int(b.sync.hget(k, "processed") or 0) for k in stats) < jobs:
            polls += 1
            if time.perf_counter() - start > 300:
                raise SystemExit(f"the drain did not finish (log {log})")
            time.sleep(0.02)
        took = time.perf_counter() - start
        info1, cpu1 = b.sync.info("all"), _cpu(proc.pid)
        scripts = int(info1.get("cmdstat_evalsha", {}).get("calls", 0))
        # commandstats counts the commands a script runs too: "calls" is Redis's work, "scripts" the round trips
        return {"per_s": jobs / took, "calls": (_calls(info1) - polls * 2 - 2) / jobs, "scripts": scripts / jobs,
                "worker_us": (cpu1 - cpu0) / jobs * 1e6,
                "redis_us": (_redis_cpu(info1) - _redis_cpu(info0)) / jobs * 1e6}
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = EmbeddedRedis.temporary(port=free_port())
    url = server.url
    os.environ["WF_BENCH_URL"] = url
    from bench import workflow_cost as mod  # imported again, now that its App has the server's URL
    log = os.path.join(tempfile.mkdtemp(prefix="wf-bench-"), "worker.log")
    found: dict[str, list[dict[str, float]]] = {"plain": [], "step": [], "across": []}
    try:
        for _ in range(args.rounds):
            for kind in found:
                found[kind].append(drain(mod, url, kind, args.jobs, args.length, log))
    finally:
        mod.app.close()
        server.stop()
    print(f"{args.jobs} per kind, chains of {args.length}, medians of {args.rounds} rounds (worker log {log})")
    print(f"{'':6} {'per s':>8} {'commands':>9} {'scripts':>8} {'worker CPU µs':>14} {'Redis CPU µs':>13}")
    for kind, rows in found.items():
        m = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{kind:6} {m['per_s']:8.0f} {m['calls']:9.2f} {m['scripts']:8.2f} {m['worker_us']:14.1f} "
              f"{m['redis_us']:13.1f}")


if __name__ == "__main__":
    main()
