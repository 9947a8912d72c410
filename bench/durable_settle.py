"""The cost of ``durable_settle=True`` per job (``python -m bench.durable_settle``): one ``ringfence worker``
process (default settings) drains no-op jobs from a private redis-server master with one replica (loopback),
once with a plain task and once with the same task under ``durable_settle=True``, alternated round after round
so both meet the same load. Per drain: jobs/s from the first ack to the last, and the worker's CPU per job::

    python -m bench.durable_settle --jobs 3000 --rounds 4
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

from ringfence.app import App
from ringfence.models import JobSpec
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.tasks import JobContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URL = os.environ.get("BENCH_DURABLE_URL")
plain_app, durable_app = App(URL), App(URL)


@plain_app.task(name="bench.job", queue="bench")
def plain(ctx: JobContext) -> None:
    pass


@durable_app.task(name="bench.job", queue="bench", durable_settle=True)
def durable(ctx: JobContext) -> None:
    pass


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(url: str, app: str, jobs: int, log: str) -> tuple[float, float]:
    """jobs/s and worker CPU µs per job of one drain by a fresh worker of ``app``."""
    broker = App(url).broker
    broker.sync.flushall()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT]), "BENCH_DURABLE_URL": url}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", app, "--queues", "bench"],
                                env=env, stdout=out, stderr=out)
    try:
        while not broker.servers():
            if proc.poll() is not None:
                raise SystemExit(f"the worker did not start (log {log})")
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGSTOP)
        spec = JobSpec(task="bench.job", args={}, enqueued_ms=time.time() * 1000).encode()
        for start in range(0, jobs, 1000):
            broker.run(broker.enqueue("bench", [(f"j{i}", spec, 0) for i in range(start, min(start + 1000, jobs))]))
        cpu0 = _cpu_s(proc.pid)
        os.kill(proc.pid, signal.SIGCONT)
        first: tuple[float, int] | None = None
        while True:
            done = int(broker.queue_counts("bench")["stats"].get("processed", 0))
            now = time.perf_counter()
            first = first or ((now, done) if done else None)
            if done >= jobs:
                break
            time.sleep(0.002)
        assert first is not None
        return (done - first[1]) / max(now - first[0], 1e-9), (_cpu_s(proc.pid) - cpu0) / jobs * 1e6
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(30)
        broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        master = EmbeddedRedis(os.path.join(tmp, "m"), port=free_port()).start()
        replica = EmbeddedRedis(os.path.join(tmp, "r"), port=free_port(),
                                extra=("--replicaof", "127.0.0.1", str(master.port))).start()
        try:
            results: dict[str, list[tuple[float, float]]] = {"plain": [], "durable_settle": []}
            for _ in range(a.rounds):
                for name, app in (("plain", "bench.durable_settle:plain_app"),
                                  ("durable_settle", "bench.durable_settle:durable_app")):
                    results[name].append(drain(master.url, app, a.jobs, os.path.join(tmp, "worker.log")))
                    print(f"{name:15} {results[name][-1][0]:8.0f} jobs/s {results[name][-1][1]:7.0f} µs CPU/job",
                          flush=True)
            for name, rows in results.items():
                print(f"median {name:15} {statistics.median(r[0] for r in rows):8.0f} jobs/s "
                      f"{statistics.median(r[1] for r in rows):7.0f} µs CPU/job")
        finally:
            replica.stop()
            master.stop()


if __name__ == "__main__":
    main()
