"""Enqueue-to-start of one idle ringfence worker at a steady rate (``python -m bench.wake_latency``).

The peer bench's latency figure (``bench/peers``: stamped peer jobs at 200 jobs/s, one worker process with
default settings, start time minus the producer's stamp) with what it costs beside it: the worker's CPU and
context switches per job, and per job the script calls Redis served (the producer's enqueue included) and all the
commands it ran (those inside scripts and the body's two included). ``--src DIR`` runs another checkout's ``src``;
several alternate, round after round, so before and after meet the same load::

    mkdir -p /tmp/before && git archive <commit> src | tar -x -C /tmp/before
    python -m bench.wake_latency --rounds 4 --src /tmp/before/src --src src
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from bench.drain_cpu import _cpu, alternate, start_worker
from ringfence.app import App

APPS = {"sync": "peer_ringfence:sync_app", "async": "peer_ringfence:async_app"}
STARTS = "peers:starts"  # as in bench/peers/adapters/peerjob.py

PRODUCE = """
import sys, time
import peer_ringfence as p
rate, n = float(sys.argv[1]), int(sys.argv[2])
producer = p.Producer() if sys.argv[3] == "sync" else __import__("peer_ringfence_async").Producer()
producer.one(0.0, 0.0)  # the warm-up job (unstamped)
time.sleep(2.0)
t0 = time.perf_counter()
for i in range(n):  # an absolute schedule: no drift
    pause = t0 + i / rate - time.perf_counter()
    if pause > 0:
        time.sleep(pause)
    producer.one(time.time(), 0.0)
"""


def _pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(len(values) * p / 100))]


def _commands(broker: object) -> tuple[int, int]:
    """Commands Redis ran (those inside scripts included) and script calls, so far."""
    stats = broker.sync.info("commandstats")  # type: ignore[attr-defined]
    return sum(int(v["calls"]) for v in stats.values()), int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def run(src: str, handler: str, rate: float, seconds: float, url: str, log_dir: str) -> dict[str, float]:
    """One run by a fresh worker running ``src``: latency percentiles (ms), and per job its CPU (µs), context
    switches and the commands Redis served."""
    broker = App(url).broker
    broker.sync.flushall()  # the private server of this run
    metrics = App(url.replace("/0", "/15")).broker.sync
    n = int(rate * seconds)
    proc, env = start_worker(src, APPS[handler], url, log_dir, broker)
    with open(os.path.join(log_dir, "worker.log"), "ab") as log:
        producer = None
        try:
            deadline = time.monotonic() + 60
            producer = subprocess.Popen([sys.executable, "-c", PRODUCE, str(rate), str(n), handler], env=env,
                                        stdout=log, stderr=log)
            while not metrics.get("peers:done"):  # the warm-up job ran
                if producer.poll() not in (None, 0) or time.monotonic() > deadline:
                    raise SystemExit(f"the warm-up job did not run (log {log_dir}/worker.log)")
                time.sleep(0.01)
            cmds0, (user0, sys0, sw0) = _commands(broker), _cpu(proc.pid)
            producer.wait(seconds * 3 + 60)
            deadline = time.monotonic() + 20
            while metrics.llen(STARTS) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            (user1, sys1, sw1), cmds1 = _cpu(proc.pid), _commands(broker)
        finally:
            for p in (producer, proc):
                if p is not None and p.poll() is None:
                    p.terminate()
                    p.wait(30)
    raw = [x.split() for x in metrics.lrange(STARTS, 0, -1)]
    lat = sorted((float(b) - float(a)) * 1000 for a, b in raw) + [float("inf")] * (n - len(raw))
    broker.close()
    return {"p50": _pct(lat, 50), "p90": _pct(lat, 90), "p99": _pct(lat, 99), "max": lat[-1],
            "cpu_us": (user1 - user0 + sys1 - sys0) / n * 1e6, "switches": (sw1 - sw0) / n,
            "commands": (cmds1[0] - cmds0[0]) / n, "scripts": (cmds1[1] - cmds0[1]) / n}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wake_latency", description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0, help="stamped jobs per second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1, help="each --src once per round, in the order given")
    ap.add_argument("--src", action="append", help="a checkout's src directory (default: this one's)")
    ap.add_argument("--handler", choices=tuple(APPS), default="sync", help="the peer body in a def or async def")
    args = ap.parse_args()

    def one(src: str, url: str, tmp: str) -> str:
        r = run(src, args.handler, args.rate, args.seconds, url, tmp)
        return (f"p50 {r['p50']:.2f} p90 {r['p90']:.2f} p99 {r['p99']:.2f} max {r['max']:.1f} ms; per job "
                f"{r['cpu_us']:,.0f} µs worker CPU, {r['switches']:.1f} switches, {r['scripts']:.2f} script calls, "
                f"{r['commands']:.1f} Redis commands")

    alternate(args.src, args.rounds, "rf-wake-", one)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    raise SystemExit(main())
