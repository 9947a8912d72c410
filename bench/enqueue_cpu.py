"""CPU per ``task.enqueue`` of one producer alone (``python -m bench.enqueue_cpu``): the peer job
(``peers.job`` with ``sent`` and ``sleep`` fields, a ``def`` handler) enqueued ``--calls`` times in a loop, one call
after the other, against a private redis-server on a loopback port. Per call: wall time, CPU of the producer
(``time.process_time``) and Redis's own time for the script (``INFO commandstats``, ``usec_per_call`` of
``evalsha``). ``--src DIR`` runs another checkout's ``src``; several alternate, round after round,
so before and after meet the same load. ``--floor`` adds, each round, a PING round trip on a plain socket to the
same server: what any one blocking call costs from Python here::

    mkdir -p /tmp/before && git archive <commit> src | tar -x -C /tmp/before
    python -m bench.enqueue_cpu --calls 20000 --rounds 4 --src /tmp/before/src --src src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import redis

from ringfence.redis.embedded import EmbeddedRedis, free_port

# Run in a child per --src, so each checkout's ringfence is the one imported.
PRODUCER = """
import json, sys, time
from ringfence import App
app = App(sys.argv[1])

@app.task(name="peers.job", queue="peersx")
def job(ctx, sent: float = 0.0, sleep: float = 0.0) -> None: ...

for _ in range(200):  # connect, load the script, measure the clock
    job.enqueue(sent=0.0, sleep=0.0)
n = int(sys.argv[2])
w0, c0 = time.perf_counter(), time.process_time()
for _ in range(n):
    job.enqueue(sent=0.0, sleep=0.0)
w, c = time.perf_counter() - w0, time.process_time() - c0
print(json.dumps({"rate": n / w, "wall_us": w / n * 1e6, "cpu_us": c / n * 1e6}))
app.close()
"""

# The floor of one blocking round trip from Python: PING over a plain socket (no client library, no parsing).
FLOOR = """
import json, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = int(sys.argv[2])
for _ in range(200):
    s.sendall(b"*1\\r\\n$4\\r\\nPING\\r\\n"); s.recv(64)
w0, c0 = time.perf_counter(), time.process_time()
for _ in range(n):
    s.sendall(b"*1\\r\\n$4\\r\\nPING\\r\\n"); s.recv(64)
w, c = time.perf_counter() - w0, time.process_time() - c0
print(json.dumps({"rate": n / w, "wall_us": w / n * 1e6, "cpu_us": c / n * 1e6}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--src", action="append", help="a checkout's src directory (default: this one's)")
    parser.add_argument("--floor", action="store_true",
                        help="also time a PING round trip on a plain socket each round: one blocking call's floor")
    args = parser.parse_args()
    srcs = args.src or [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")]
    server = EmbeddedRedis.temporary(port=free_port())
    admin = redis.Redis(port=server.port)
    url = f"redis://127.0.0.1:{server.port}/0"
    try:
        for r in range(1, args.rounds + 1):
            print(f"round {r}, load average {os.getloadavg()[0]:.1f}")
            for src in srcs:
                admin.flushall()
                admin.config_resetstat()
                out = subprocess.run([sys.executable, "-c", PRODUCER, url, str(args.calls)], check=True,
                                     capture_output=True, text=True, env={**os.environ, "PYTHONPATH": src})
                got = json.loads(out.stdout)
                script_us = admin.info("commandstats").get("cmdstat_evalsha", {}).get("usec_per_call", 0.0)
                print(f"  {src}: {got['rate']:,.0f} enqueues/s, {got['wall_us']:.1f} µs wall, "
                      f"{got['cpu_us']:.1f} µs CPU per call; Redis {script_us:.2f} µs per script call")
            if args.floor:
                out = subprocess.run([sys.executable, "-c", FLOOR, str(server.port), str(args.calls)], check=True,
                                     capture_output=True, text=True)
                got = json.loads(out.stdout)
                print(f"  floor (PING on a plain socket): {got['rate']:,.0f} round trips/s, {got['wall_us']:.1f} µs "
                      f"wall, {got['cpu_us']:.1f} µs CPU per call")
    finally:
        admin.close()
        server.stop()


if __name__ == "__main__":
    main()
