"""Dashboard figures for concurrency keys and lookups by id: the pending page with 100,000 jobs waiting in their
keys' lists (one key holding them all, and 100,000 keys of one job each), and the job page of an id no queue
holds at 100,000 pending jobs.

Run: ``.venv/bin/python -m bench.dashboard_keyed`` (needs the ``dashboard`` extra and ``redis-server``);
``--src DIR`` serves the pages from another checkout's ``src`` (several alternate, ``--rounds`` times). Each line
gives the median and largest time of 20 loads over HTTP from a real ``ringfence dashboard`` process and the
Redis CPU per load, against a private ``redis-server`` on a free loopback port (started and stopped here). The
lookups are also timed in one process (``jobs.find_job``, 21 calls each) with the ``LRANGE`` calls one makes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.dashboard_bench import free_port, page_loads, start_redis
from ringfence.app import App

JOBS = 100_000


def keyed_app(url: str, namespace: str, keys: int) -> App:
    """``JOBS`` jobs of a task limited to one running job per key, over ``keys`` keys, sorted into their keys'
    lists by fetches as a worker's (each sorts 1,000); one job per key leased."""
    app = App(url, namespace, environment="test")

    @app.task(name="bench.keyed", concurrency_key="k:{k}", concurrency_limit=1)
    def keyed(ctx: object, k: int, n: int) -> None: ...

    for start in range(0, JOBS, 5000):
        app.enqueue_many("bench.keyed", [{"k": i % keys, "n": i} for i in range(start, start + 5000)])
    b = app.broker
    while b.sync.llen(b.keys.queue("default").pending):
        b.run(b.fetch("default", 1, b.clock() + 3_600_000, "bench"))
    return app


def plain_app(url: str, namespace: str) -> App:
    app = App(url, namespace, environment="test")
    app.task(name="bench.noop")(lambda ctx, n: None)
    for start in range(0, JOBS, 5000):
        app.enqueue_many("bench.noop", [{"n": i} for i in range(start, start + 5000)])
    return app


def serve(redis_url: str, namespace: str, src: str | None, tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "RINGFENCE_ENV": "test", "RINGFENCE_DASHBOARD_TOKEN": "bench"}
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    web = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "dashboard", "--port", str(port)], env=env,
                           stdout=subprocess.DEVNULL, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/servers")
            return web, url
        except OSError:
            time.sleep(0.1)
    raise SystemExit("ringfence dashboard did not answer in 60 s")


UNKNOWN = ("nosuchjob", "abcdefghijklmnop")  # not of the generated form; of that form (models.new_job_id)


def time_lookups(redis_url: str, namespace: str) -> None:
    """The child's part of ``--lookups-of``: ``find_job`` of each unknown id, in this process's ``ringfence``."""
    from ringfence import jobs

    app = App(redis_url, namespace, environment="test")
    r = app.broker.sync
    for job_id in UNKNOWN:
        times = []
        for _ in range(21):
            r.config_resetstat()
            t = time.perf_counter()
            jobs.find_job(app, job_id)
            times.append((time.perf_counter() - t) * 1000)
        lranges = r.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0)
        print(f"{'find_job':10} {job_id:44} {statistics.median(times):10.1f} {max(times):8.1f} {'':>12}  "
              f"{lranges} LRANGE")


def lookups(redis_url: str, namespace: str, src: str | None) -> None:
    env = {**os.environ, **({"PYTHONPATH": str(Path(src).resolve())} if src else {})}
    subprocess.run([sys.executable, "-m", "bench.dashboard_keyed", "--lookups-of", namespace, redis_url], env=env,
                   check=True, cwd=str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dashboard_keyed", description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", help="a checkout's src directory (default: this one's)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--lookups-of", nargs=2, metavar=("NAMESPACE", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.lookups_of:
        time_lookups(args.lookups_of[1], args.lookups_of[0])
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        proc, redis_url = start_redis(tmp)
        try:
            t = time.perf_counter()
            keyed_app(redis_url, "onekey", 1)
            keyed_app(redis_url, "manykeys", JOBS)
            plain = plain_app(redis_url, "plain")
            print(f"filled in {time.perf_counter() - t:.1f}s")
            r = plain.broker.sync
            pages = {"onekey": ["/queues/default/pending", "/queues/default/pending?keyed=0.50000",
                                "/queues/default/pending?keyed=0.99900",
                                "/queues/default/pending?payload=n%3D99999"],
                     "manykeys": ["/queues/default/pending", "/queues/default/pending?keyed=50000.0",
                                  "/queues/default/pending?keyed=99800.0"],
                     "plain": ["/jobs?id=nosuchjob", "/jobs?id=abcdefghijklmnop"]}
            for _ in range(args.rounds):
                for src in args.src or [None]:
                    print(f"src {src or 'this checkout'}; load average {os.getloadavg()[0]:.1f}")
                    print(f"{'namespace':10} {'page':44} {'median ms':>10} {'max ms':>8} {'Redis CPU ms':>12}")
                    for namespace, paths in pages.items():
                        web, url = serve(redis_url, namespace, src, tmp)
                        try:
                            for path, med, worst, in_redis in page_loads(url, paths, r):
                                print(f"{namespace:10} {path:44} {med:10.1f} {worst:8.1f} {in_redis:12.1f}")
                        finally:
                            web.terminate()
                            web.wait(10)
                    lookups(redis_url, "plain", src)
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
