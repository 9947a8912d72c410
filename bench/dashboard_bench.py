"""Dashboard figures: page load with 100,000 jobs in a queue, and what the per-minute history costs a worker.

Run: ``.venv/bin/python -m bench.dashboard_bench`` (needs the ``dashboard`` extra and ``redis-server``); with
``--lookup`` only the job page (``/jobs?id=``) of the newest, a middle and the oldest pending job and of an unknown
id. Each page's line says the CPU time Redis spent per load (``INFO cpu``). Everything runs against a private
``redis-server`` on a free loopback port (started and stopped here), so the shared Redis is never loaded. Pages
are fetched over HTTP from a real ``ringfence dashboard`` process.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path

import redis

from ringfence.app import App

JOBS = 100_000
DEAD = 10_000
LOADS = 20

# lua/_per_minute.lua (included by ack, dead and retry), called ARGV[2] times inside one script: its cost per
# call, server side.
PER_MINUTE = resources.files("ringfence.redis").joinpath("lua", "_per_minute.lua").read_text() + """
for i = 1, tonumber(ARGV[2]) do
  if ARGV[3] == '1' then per_minute(KEYS[1], 'p', ARGV[1], 1) end
end
return 1
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def fill(app: App) -> list[str]:
    """The pending jobs' ids, oldest first (each stored inline in its pending entry, keys.py)."""
    @app.task(name="bench.noop")
    def noop(ctx: object, n: int, email: str) -> None: ...

    ids: list[str] = []
    for start in range(0, JOBS, 5000):
        ids += app.enqueue_many("bench.noop", [{"n": i, "email": "x@y.z"} for i in range(start, start + 5000)])
    first = ids[0]
    b, k = app.broker, app.broker.keys.queue("default")
    spec = b.job_spec("default", first) or b"{}"
    with b.sync.pipeline() as p:
        for i in range(DEAD):
            p.zadd(k.dead, {f"dead{i}": i})
            p.hset(k.dead_jobs, f"dead{i}", b'{"spec":' + __import__("orjson").dumps(spec.decode()) +
                   b',"attempts":3,"history":"[]","died_ms":1,"reason":"max_attempts","error":"boom"}')
        p.execute()
    return ids


def redis_cpu_ms(r: redis.Redis) -> float:
    """CPU time of Redis's main thread so far (ms): what its commands and scripts cost."""
    cpu: dict[str, float] = r.info("cpu")
    return (cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"]) * 1000


def load(url: str) -> None:
    """One page, read whole; a 404 (the job page of an unknown id) is a page too."""
    try:
        with urllib.request.urlopen(url) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        exc.read()


def page_loads(url: str, paths: list[str], r: redis.Redis) -> list[tuple[str, float, float, float]]:
    """Per path: (path, median ms, max ms, ms of Redis CPU per load)."""
    out = []
    for path in paths:
        load(url + path)  # warm: connections, the doctor's first snapshot
        start = redis_cpu_ms(r)
        times = []
        for _ in range(LOADS):
            t = time.perf_counter()
            load(url + path)
            times.append((time.perf_counter() - t) * 1000)
        out.append((path, statistics.median(times), max(times), (redis_cpu_ms(r) - start) / LOADS))
    return out


def per_minute_cost(app: App, loops: int = 200_000) -> tuple[float, float]:
    """(µs per script call with the per-minute write, µs without): the loop's own cost cancels out."""
    r = app.broker.sync
    costs = []
    for on in ("1", "0"):
        t = time.perf_counter()
        r.eval(PER_MINUTE, 1, "bench:minutes", int(time.time() * 1000), loops, on)
        costs.append((time.perf_counter() - t) * 1e6 / loops)
    return costs[0], costs[1]


def lookups(ids: list[str]) -> list[str]:
    """The job page of the newest, a middle and the oldest pending job (the lookup scans pending newest first:
    the oldest is its longest scan), and of an id no queue holds (a whole scan, then the other places)."""
    return [f"/jobs?id={ids[-1]}", f"/jobs?id={ids[len(ids) // 2]}", f"/jobs?id={ids[0]}", "/jobs?id=nosuchjob"]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dashboard_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--lookup", action="store_true", help="time only the job page (/jobs?id=)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, redis_url = start_redis(tmp)
        try:
            app = App(redis_url, "bench", environment="test")
            t = time.perf_counter()
            ids = fill(app)
            print(f"filled {JOBS:,} pending and {DEAD:,} dead jobs in {time.perf_counter() - t:.1f}s")
            if not args.lookup:
                with_pm, without = per_minute_cost(app)
                print(f"per-minute history: {with_pm - without:.2f} µs per ack batch or failed attempt (server "
                      f"side; {with_pm:.2f} with, {without:.2f} without)")
            port = free_port()
            env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": "bench",
                   "RINGFENCE_ENV": "test", "RINGFENCE_DASHBOARD_TOKEN": "bench"}
            web = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "dashboard", "--port", str(port)],
                                   env=env, stdout=subprocess.DEVNULL, cwd=str(Path(tmp)))
            try:
                url = f"http://127.0.0.1:{port}"
                for _ in range(600):  # a loaded machine takes seconds to start it
                    try:
                        urllib.request.urlopen(url + "/servers")
                        break
                    except OSError:
                        time.sleep(0.1)
                else:
                    raise SystemExit("ringfence dashboard did not answer in 60 s")
                paths = lookups(ids) if args.lookup else [
                    "/", "/queues/default/pending", f"/queues/default/pending?offset={JOBS - 50}",
                    "/queues/default/pending?task=bench.noop&min_age_s=1", "/queues/default/dead",
                    f"/jobs?id={ids[0]}", "/servers", "/doctor", "/queues/default/pending?payload=n%3D99999",
                    "/queues/default/dead?payload=n%3D7", "/queues/default/scheduled", "/fences"]
                print(f"load average {os.getloadavg()[0]:.1f}")
                print(f"{'page':58} {'median ms':>10} {'max ms':>8} {'Redis CPU ms':>12}  ({LOADS} loads each)")
                for path, med, worst, in_redis in page_loads(url, paths, app.broker.sync):
                    print(f"{path:58} {med:10.1f} {worst:8.1f} {in_redis:12.1f}")
            finally:
                web.terminate()
                web.wait(10)
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
