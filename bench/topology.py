"""Drain throughput on a 3-master Redis Cluster (3 queues, one per primary) against a single Redis, same run,
both private redis-server processes on loopback.

    python -m bench.topology --jobs 6000 --workers 3

Each set-up: enqueue ``--jobs`` no-op jobs over the 3 queues, start ``--workers`` worker processes serving all
three, time from the first worker's start until every queue is empty. Prints one line per set-up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.servers import single_and_cluster, stop_workers
from ringfence import App

ROOT = Path(__file__).resolve().parent.parent

APP = '''
import os
from ringfence import App, WorkerSettings
app = App(namespace=os.environ["RINGFENCE_NAMESPACE"], environment="bench")

@app.task(name="noop")
async def noop(ctx, n: int) -> None:
    pass
'''


def _noop(ctx: object, n: int) -> None:
    pass


def queues_on_nodes(app: App, cluster: bool) -> list[str]:
    if not cluster:
        return ["q0", "q1", "q2"]
    sync = app.broker.sync
    chosen: dict[str, str] = {}
    for i in range(1000):
        node = sync.get_node_from_key(app.broker.keys.queue(f"q{i}").pending).name  # type: ignore[attr-defined]
        chosen.setdefault(node, f"q{i}")
    return sorted(chosen.values())[:3]


def drain(url: str, jobs: int, workers: int, cluster: bool, appdir: Path) -> tuple[float, int]:
    """(seconds, jobs) from the first job done to the last: worker start-up is left out."""
    ns = f"b{os.getpid()}{int(time.time())}"
    app = App(url, ns, environment="bench")
    task = app.task(name="noop")(_noop)
    queues = queues_on_nodes(app, cluster)
    for i, q in enumerate(queues):
        bound = task.with_options(queue=q)
        app.client.enqueue_many(bound.task, [{"n": n} for n in range(i, jobs, len(queues))], bound.options)
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns,
           "PYTHONPATH": f"{appdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "benchapp:app", "--queues",
                               ",".join(queues), "--concurrency", "50"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(workers)]
    try:
        first: tuple[float, int] | None = None
        while True:
            counts = [app.broker.queue_counts(q) for q in queues]
            done = sum(int(c["stats"].get("processed", 0)) for c in counts)
            if first is None and done:
                first = (time.monotonic(), done)
            if first is not None and done >= jobs:
                return time.monotonic() - first[0], done - first[1]
            time.sleep(0.02)
    finally:
        stop_workers(procs)
        app.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=6000)
    ap.add_argument("--workers", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "benchapp.py").write_text(APP)
        with single_and_cluster(d) as targets:
            for name, url, is_cluster in targets:
                seconds, n = drain(url, args.jobs, args.workers, is_cluster, d)
                print(f"{name}: {args.jobs} jobs, 3 queues, {args.workers} workers: {n} jobs in {seconds:.2f}s "
                      f"after the first was done ({n / seconds:,.0f} jobs/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
