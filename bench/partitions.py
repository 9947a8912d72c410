"""A partitioned queue's drain on Redis Clusters of 1, 2 and 3 masters: per master, the commands it served and the
CPU it spent; overall, the drain rate. Private redis-server processes on loopback, made masters by hand (slots
split evenly, as ``redis-cli --cluster create`` splits them; it refuses fewer than 3 masters).

    python -m bench.partitions --jobs 12000 --workers 3 --partitions 6
    python -m bench.partitions --enqueue redis://127.0.0.1:6379/0    # one producer's plain enqueue, µs a call

Each set-up: enqueue ``--jobs`` no-op jobs into queue "hot" of ``--partitions`` partitions, start ``--workers``
worker processes serving "hot", time from the first job done to the last. Prints one line per set-up and one per
master. The CPU a master spends per job bounds what it can drain (``1 s / cpu per job``); see
docs/deployment.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench.servers import Servers, free_port, stop_workers, wait_for
from ringfence import App
from ringfence.redis.keys import partition_name

APP = '''
import os
from ringfence import App
from ringfence.redis.keys import partition_name
app = App(namespace=os.environ["RINGFENCE_NAMESPACE"], environment="bench")
app.queue("hot", partitions=int(os.environ["BENCH_PARTITIONS"]))

@app.task(name="noop", queue="hot")
async def noop(ctx, n: int) -> None:
    pass
'''
SLOTS = 16384


def _noop(ctx: object, n: int) -> None:
    pass


def cluster(directory: Path, masters: int) -> tuple[Servers, list[int]]:
    """``masters`` cluster nodes, each given an equal range of the slots, met, and agreeing the cluster is ok."""
    servers = Servers(directory)
    ports = [free_port() for _ in range(masters)]
    try:
        for p in ports:
            servers.start(p, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        for i, p in enumerate(ports):
            r = redis.Redis(port=p)
            r.execute_command(  # type: ignore[no-untyped-call]
                "CLUSTER", "ADDSLOTSRANGE", i * SLOTS // masters, (i + 1) * SLOTS // masters - 1)
            for q in ports[:i]:
                r.execute_command("CLUSTER", "MEET", "127.0.0.1", q)  # type: ignore[no-untyped-call]

        def ok() -> bool:
            return all(redis.Redis(port=p).cluster("info")["cluster_state"] == "ok" for p in ports)

        wait_for(ok, 30, f"a cluster of {masters}")
    except BaseException:
        servers.stop()
        raise
    return servers, ports


def counters(ports: list[int]) -> dict[int, tuple[int, float]]:
    """Per node: commands served (its INFO calls left out) and CPU seconds spent."""
    out = {}
    for p in ports:
        r = redis.Redis(port=p)
        stats, cpu = r.info("commandstats"), r.info("cpu")
        out[p] = (sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info"),
                  float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))
    return out


def drain(url: str, ports: list[int], jobs: int, workers: int, partitions: int, appdir: Path) -> None:
    ns = f"b{os.getpid()}{int(time.time())}"
    app = App(url, ns, environment="bench")
    app.queue("hot", partitions=partitions)
    task = app.task(name="noop", queue="hot")(_noop)
    for start in range(0, jobs, 10_000):
        app.enqueue_many(task, [{"n": n} for n in range(start, min(jobs, start + 10_000))])
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns,
           "BENCH_PARTITIONS": str(partitions),
           "PYTHONPATH": f"{appdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    names = [partition_name("hot", i, partitions) for i in range(partitions)]
    before = counters(ports)
    procs = [subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "benchapp:app", "--queues",
                               "hot", "--concurrency", "50"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(workers)]
    try:
        first: tuple[float, int] | None = None
        while True:
            done = _processed(app, names)
            if first is None and done:
                first = (time.monotonic(), done)
            if first is not None and done >= jobs:
                seconds, n = time.monotonic() - first[0], done - first[1]
                break
            time.sleep(0.1)  # its reads are commands of the masters too: few of them
        after = counters(ports)
    finally:
        stop_workers(procs)
        app.close()
    served = [after[p][0] - before[p][0] for p in ports]
    print(f"{len(ports)} master(s), {partitions} partitions, {workers} workers: {n} jobs in {seconds:.2f}s "
          f"({n / seconds:,.0f} jobs/s); commands per master {(max(served) - min(served)) / max(served):.1%} apart")
    for p in ports:
        calls, cpu = after[p][0] - before[p][0], after[p][1] - before[p][1]
        print(f"  master :{p}: {calls:,} commands, {cpu:.2f} CPU s ({cpu / jobs * len(ports) * 1e6:.0f} µs per job "
              "it held)")


def _processed(app: App, partitions: list[str]) -> int:
    return sum(int(app.broker.queue_counts(q)["stats"].get("processed", 0)) for q in partitions)


def enqueue_cost(url: str, partitions: int, calls: int = 3000, rounds: int = 2) -> None:
    """Sequential ``task.enqueue(n=...)`` on a plain queue and on a partitioned one, alternating, ``rounds`` times
    each; then each one's fastest and median run."""
    ns = f"benq{os.getpid()}{int(time.time())}"
    app = App(url, ns, environment="bench")
    app.queue("hot", partitions=partitions)
    plain = app.task(name="plain", queue="plain")(_noop)
    hot = app.task(name="hot", queue="hot")(_noop)
    runs: dict[str, list[float]] = {"plain": [], "hot": []}
    cpu: dict[str, list[float]] = {"plain": [], "hot": []}
    try:
        for task in (plain, hot) * rounds:
            task.enqueue(n=0)
            t0, c0 = time.perf_counter(), time.process_time()
            for n in range(calls):
                task.enqueue(n=n)
            runs[task.name].append((time.perf_counter() - t0) / calls)
            cpu[task.name].append((time.process_time() - c0) / calls)
            print(f"{task.name}: {runs[task.name][-1] * 1e6:.0f} µs per enqueue, {cpu[task.name][-1] * 1e6:.1f} µs "
                  "of the producer's CPU")
        for name, took in runs.items():
            print(f"{name}: fastest {min(took) * 1e6:.0f} µs ({1 / min(took):,.0f}/s), median "
                  f"{statistics.median(took) * 1e6:.0f} µs ({1 / statistics.median(took):,.0f}/s); producer CPU "
                  f"median {statistics.median(cpu[name]) * 1e6:.1f} µs")
    finally:
        for q in app.broker.queues():
            app.broker.sync.delete(*vars(app.broker.keys.queue(q)).values())
        app.broker.sync.delete(app.broker.keys.queues)
        app.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--enqueue", metavar="REDIS_URL", help="measure one producer's enqueue instead of drains")
    ap.add_argument("--jobs", type=int, default=12_000)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--masters", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=2, help="with --enqueue: runs of each queue, alternating")
    args = ap.parse_args()
    if args.enqueue:
        enqueue_cost(args.enqueue, args.partitions, rounds=args.rounds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "benchapp.py").write_text(APP)
        for m in (int(x) for x in args.masters.split(",")):
            servers, ports = cluster(d / f"c{m}", m)
            try:
                url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/"
                drain(url, ports, args.jobs, args.workers, args.partitions, d)
            finally:
                servers.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
