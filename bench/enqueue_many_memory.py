"""One ``app.enqueue_many`` of many jobs (``python -m bench.enqueue_many_memory``): the producer's peak memory
(``ru_maxrss`` above its level just before the call) and wall time, and the longest PING another client saw
meanwhile (it pings in a loop on its own connection), against a private redis-server on a loopback port.
``--src DIR`` runs another checkout's ``src`` (several alternate)::

    mkdir -p /tmp/before && git archive <commit> src | tar -x -C /tmp/before
    python -m bench.enqueue_many_memory --jobs 100000 --src /tmp/before/src --src src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ringfence.redis.embedded import EmbeddedRedis, free_port

# Run in a child per --src, so each checkout's ringfence is the one imported.
PRODUCER = """
import json, resource, sys, time
from ringfence import App
app = App(sys.argv[1])

@app.task(name="peers.job", queue="many")
def job(ctx, sent: float = 0.0, sleep: float = 0.0, order: int = 0) -> None: ...

app.enqueue_many(job, [{"order": i} for i in range(10)])  # connect, load the script, measure the clock
n = int(sys.argv[2])
payloads = [{"sent": 0.0, "sleep": 0.0, "order": i} for i in range(n)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("ready", flush=True)
sys.stdin.readline()
w0 = time.perf_counter()
ids = app.enqueue_many(job, payloads)
wall = time.perf_counter() - w0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"jobs": len(ids), "wall_s": round(wall, 3), "peak_mb": round((peak - before) / 1024, 1)}))
"""

# Pings until its stdin closes; prints the longest and the 99th percentile in ms.
PINGER = """
import json, sys, threading, time
import redis
r = redis.Redis.from_url(sys.argv[1])
r.ping()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
took = []
while not stop.is_set():
    t0 = time.perf_counter()
    r.ping()
    took.append((time.perf_counter() - t0) * 1000)
    time.sleep(0.001)
took.sort()
print(json.dumps({"pings": len(took), "ping_max_ms": round(took[-1], 1),
                  "ping_p99_ms": round(took[int(len(took) * 0.99)], 2)}))
"""


def one(url: str, src: str, jobs: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": src}
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, url, str(jobs)], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    pinger = subprocess.Popen([sys.executable, "-c", PINGER, url], env=env, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    assert producer.stdout is not None and producer.stdin is not None and pinger.stdout is not None
    assert producer.stdout.readline().strip() == "ready" and pinger.stdout.readline().strip() == "ready"
    producer.stdin.write("go\n")
    producer.stdin.flush()
    made = json.loads(producer.stdout.readline())
    producer.wait(60)
    pings = json.loads(pinger.communicate("", timeout=60)[0])
    return {"src": src, **made, **pings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--src", action="append", help="a checkout's src directory (default: this one's)")
    args = parser.parse_args()
    server = EmbeddedRedis.temporary(port=free_port())
    try:
        for _ in range(args.rounds):
            for src in args.src or ["src"]:
                import redis

                redis.Redis.from_url(server.url).flushall()
                print(json.dumps(one(server.url, os.path.abspath(src), args.jobs)), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
