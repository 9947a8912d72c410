"""Worker CPU per job of one ringfence worker process draining the peer job (``python -m bench.drain_cpu``).

The peer bench's equal-terms body (``bench/peers/adapters/peerjob.py``: one pipelined round trip to a metrics
database) run by one ``ringfence worker`` process with default settings, against a private redis-server. The
worker starts and goes idle, is stopped (SIGSTOP), the jobs are bulk-enqueued, and it is let go (SIGCONT). Per
job: the worker's user + system CPU over the drain, the context switches of its threads, the script calls Redis
served (fetch + ack), and Redis's own CPU (those calls, the body's writes, this bench's polling); the rate runs
from the first acked job to the last. ``--handler`` picks the body in a ``def`` or ``async def`` handler, or a
no-op of either kind (the pipeline alone). ``--src DIR`` runs another checkout's ``src``; several alternate,
round after round, so before and after meet the same load::

    mkdir -p /tmp/before && git archive <commit> src | tar -x -C /tmp/before
    python -m bench.drain_cpu --jobs 6000 --rounds 4 --src /tmp/before/src --src src

``--scripts BATCH`` measures no drain: Redis's own time in the fetch and ack scripts per job, ``--jobs`` plain jobs
fetched and acked BATCH at a time by one caller.

``--keyed LIMIT``: the jobs are of a task declared with ``concurrency_key="account:{account}"`` and
``concurrency_limit=LIMIT``: all of one key but the last 500, 10 each of 50 other keys (``bench.fair_keys``'s mix);
with ``--scripts``, each fetch carries the slots the previous batch freed, as a worker's does. With
``DRAIN_CALLGRIND=1``, ``--scripts`` runs its redis-server under callgrind and counts its instructions per job over
the fetches and acks together (no load moves that count)::

    DRAIN_CALLGRIND=1 python -m bench.drain_cpu --scripts 10 --jobs 20000 --keyed 100
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ringfence.app import App
from ringfence.redis.broker import Broker
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.tasks import JobContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADAPTERS = os.path.join(ROOT, "bench", "peers", "adapters")
APPS = {"sync": "peer_ringfence:sync_app", "async": "peer_ringfence:async_app",  # --handler → worker --app
        "noop": "bench.drain_cpu:noop_app", "anoop": "bench.drain_cpu:anoop_app"}
KEYED_APPS = {"noop": "bench.drain_cpu:knoop_app", "anoop": "bench.drain_cpu:kanoop_app"}  # with --keyed
KEY_LIMIT = int(os.environ.get("DRAIN_KEY_LIMIT", "100"))


# No-op handlers under the peer job's name (the peer producer enqueues them): the cost of the pipeline alone.
noop_app = App(os.environ.get("PEERS_BROKER_URL"))
anoop_app = App(os.environ.get("PEERS_BROKER_URL"))


@noop_app.task(name="peers.job", queue="peers")
def noop(ctx: JobContext, sent: float = 0.0, sleep: float = 0.0) -> None:
    pass


@anoop_app.task(name="peers.job", queue="peers")
async def anoop(ctx: JobContext, sent: float = 0.0, sleep: float = 0.0) -> None:
    pass


# The same no-ops declared with a concurrency key (``--keyed``).
knoop_app = App(os.environ.get("PEERS_BROKER_URL"))
kanoop_app = App(os.environ.get("PEERS_BROKER_URL"))
KEYED = {"concurrency_key": "account:{account}", "concurrency_limit": KEY_LIMIT}


@knoop_app.task(name="peers.job", queue="peers", **KEYED)
def knoop(ctx: JobContext, account: str = "", n: int = 0) -> None:
    pass


@kanoop_app.task(name="peers.job", queue="peers", **KEYED)
async def kanoop(ctx: JobContext, account: str = "", n: int = 0) -> None:
    pass


def keyed_payloads(jobs: int) -> list[dict[str, object]]:
    """``jobs`` payloads: all of key "big" but the last 500, then 10 each of 50 small keys."""
    small = min(500, jobs // 2)
    return ([{"account": "big", "n": i} for i in range(jobs - small)]
            + [{"account": f"small{i % 50}", "n": i} for i in range(small)])


def keyed_bulk(jobs: int) -> None:
    """The producer of a ``--keyed`` drain: ``keyed_payloads`` enqueued 1000 a call."""
    payloads = keyed_payloads(jobs)
    for start in range(0, jobs, 1000):
        knoop_app.enqueue_many(knoop, payloads[start:start + 1000])
    knoop_app.close()


def _cpu(pid: int) -> tuple[float, float, int]:
    """User and system CPU seconds of ``pid`` so far, and the context switches of all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            switches += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    return int(fields[11]) / tick, int(fields[12]) / tick, switches


def _redis_cpu(broker: Broker) -> float:
    """CPU seconds the private redis-server has used so far (the drain's scripts, the body's writes, this poll)."""
    info = broker.sync.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _threads(pid: int) -> int:
    """How many threads the worker has (the main thread, the job threads, any other)."""
    return len(os.listdir(f"/proc/{pid}/task"))


def _profiler(profile: str, pid: int) -> subprocess.Popen[bytes]:
    """py-spy (raw stacks of every thread, ``SPY_FLAGS`` added, e.g. ``--gil``), or ``perf record`` for a
    file named ``*.perf``."""
    if profile.endswith(".perf"):
        cmd = ["perf", "record", "-o", profile, "-p", str(pid)]
    else:
        cmd = [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--threads", "-r", "500", "-f",
               "raw", "-o", profile, *os.environ.get("SPY_FLAGS", "").split(), "--nonblocking", "--pid", str(pid)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ``DRAIN_CALLGRIND=1``: the worker runs under callgrind, counting instructions only over the drain (from the
# moment it is stopped to the last ack), all threads together: a count per job that a shared machine's load does
# not move as it moves CPU time (valgrind runs one thread at a time: the job threads' hand-overs are not the real
# ones). Slow: use a few thousand no-op jobs.
CALLGRIND = bool(os.environ.get("DRAIN_CALLGRIND"))


def _wrapper(log_dir: str) -> list[str]:
    if not CALLGRIND:
        return []
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-line=no",
            f"--callgrind-out-file={log_dir}/callgrind.%p"]


def _instructions(pid: int, log_dir: str) -> int:
    """Instructions counted so far (callgrind_control dumps them; the file's ``summary:`` line)."""
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    total = 0
    for name in os.listdir(log_dir):
        if name.startswith(f"callgrind.{pid}"):
            with open(os.path.join(log_dir, name)) as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("summary:"))
            os.remove(os.path.join(log_dir, name))
    return total


def start_worker(src: str, app: str, url: str, log_dir: str, broker: Broker) -> tuple[subprocess.Popen[bytes],
                                                                                      dict[str, str]]:
    """A ``ringfence worker`` of ``app`` on the peer queue running ``src``'s code, once it has registered (its log
    in ``log_dir``/worker.log), and the environment its producers share: the broker in db 0, metrics in db 15."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, ADAPTERS, ROOT]), "PEERS_BROKER_URL": url,
           "PEERS_METRICS_URL": url.replace("/0", "/15")}
    with open(os.path.join(log_dir, "worker.log"), "ab") as log:
        proc = subprocess.Popen([*_wrapper(log_dir), sys.executable, "-m", "ringfence.cli", "worker", "--app", app,
                                 "--queues", "peers"], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + (600 if CALLGRIND else 60)
    while not broker.servers():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the worker did not start (log {log_dir}/worker.log)")
        time.sleep(0.05)
    return proc, env


def drain(src: str, jobs: int, handler: str, url: str, log_dir: str, profile: str | None = None,
          keyed: int | None = None) -> dict[str, float]:
    """One drain of ``jobs`` by a fresh worker running ``src``: jobs/s, and per job: worker CPU (µs, user and
    system), context switches, script calls (fetch + ack), and the threads it ended with."""
    broker = App(url).broker
    broker.sync.flushall()  # the private server of this run
    if keyed is not None:
        os.environ["DRAIN_KEY_LIMIT"] = str(keyed)
    proc, env = start_worker(src, KEYED_APPS[handler] if keyed is not None else APPS[handler], url, log_dir, broker)
    try:
        deadline = time.monotonic() + 60
        time.sleep(1.0)  # past start-up: its first idle wait
        if CALLGRIND:
            subprocess.run(["callgrind_control", "--instr=on", str(proc.pid)], check=True, capture_output=True)
            _instructions(proc.pid, log_dir)  # the count starts here
        os.kill(proc.pid, signal.SIGSTOP)
        produce = (f"import bench.drain_cpu as d; d.keyed_bulk({jobs})" if keyed is not None
                   else f"import peer_ringfence as p; p.Producer().bulk({jobs})")
        subprocess.run([sys.executable, "-c", produce], env=env, check=True)
        calls0 = broker.sync.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        redis0 = _redis_cpu(broker)
        user0, sys0, sw0 = _cpu(proc.pid)
        os.kill(proc.pid, signal.SIGCONT)
        spy = _profiler(profile, proc.pid) if profile else None
        first: tuple[float, int] | None = None
        while True:
            done = int(broker.queue_counts("peers")["stats"].get("processed", 0))  # acked jobs
            now = time.perf_counter()
            first = first or ((now, done) if done else None)
            if done >= jobs:
                break
            if proc.poll() is not None or time.monotonic() > deadline + (3000 if CALLGRIND else 300):
                raise SystemExit(f"the drain did not finish (log {log_dir}/worker.log)")
            time.sleep(0.002)
        user1, sys1, sw1 = _cpu(proc.pid)
        threads = _threads(proc.pid)
        instructions = _instructions(proc.pid, log_dir) if CALLGRIND else 0
        calls1 = broker.sync.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        redis1 = _redis_cpu(broker)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        assert first is not None
        return {"jobs_s": (done - first[1]) / max(now - first[0], 1e-9),
                "cpu_us": (user1 - user0 + sys1 - sys0) / jobs * 1e6, "user_us": (user1 - user0) / jobs * 1e6,
                "sys_us": (sys1 - sys0) / jobs * 1e6, "switches": (sw1 - sw0) / jobs,
                "scripts": (calls1 - calls0) / jobs, "threads": threads, "redis_us": (redis1 - redis0) / jobs * 1e6,
                "instructions": instructions / jobs}
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(30)
        broker.close()


def _callgrind_redis(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server under callgrind (counting off until turned on), and its url."""
    port = free_port()
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-line=no",
                             f"--callgrind-out-file={tmp}/callgrind.%p", "redis-server", "--save", "", "--appendonly",
                             "no", "--port", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"redis://127.0.0.1:{port}/0"


def _cost_app(url: str, jobs: int, keyed: int | None) -> tuple[App, Any]:
    """An app on ``url`` (once it answers) with ``jobs`` jobs of its task enqueued in queue "q"."""
    app = App(url)
    deadline = time.monotonic() + 120
    while True:
        try:
            app.broker.sync.ping()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    app.broker.sync.flushall()
    options: dict[str, Any] = {} if keyed is None else {"concurrency_key": "account:{account}",
                                                        "concurrency_limit": keyed}

    @app.task(name="cost.job", queue="q", **options)
    def job(ctx: JobContext, account: str = "", n: int = 0) -> None:
        pass

    payloads = keyed_payloads(jobs)
    for start in range(0, jobs, 1000):
        app.enqueue_many(job, payloads[start:start + 1000])
    return app, job


def script_cost(url: str, batch: int, jobs: int, keyed: int | None = None) -> str:
    """Redis's own time in fetch.lua and ack.lua (``INFO commandstats``, µs per job): ``jobs`` jobs fetched
    ``batch`` at a time, each batch acked after it, one call after another (no worker: the scripts alone). A keyed
    job's slot is freed by the next fetch (``fetch_marking`` carries it, as a worker's does). With
    ``DRAIN_CALLGRIND=1`` the redis-server runs under callgrind here and the figure is its instructions per job
    (every command served, fetches and acks together). Run in a process of its own on the checkout being measured
    (``--scripts``)."""
    with tempfile.TemporaryDirectory(prefix="rf-scripts-") as tmp:
        if not CALLGRIND:
            return _script_cost(url, batch, jobs, keyed, None, tmp)
        proc, url = _callgrind_redis(tmp)
        try:
            return _script_cost(url, batch, jobs, keyed, proc, tmp)
        finally:
            proc.terminate()
            proc.wait(60)


def _script_cost(url: str, batch: int, jobs: int, keyed: int | None, proc: subprocess.Popen[bytes] | None,
                 tmp: str) -> str:
    app, _ = _cost_app(url, jobs, keyed)
    broker = app.broker
    last = [0.0]

    def since() -> float:
        """Redis's µs in scripts since the last call (none under callgrind: a dump per call takes too long)."""
        if proc is not None:
            return 0.0
        usec = float(broker.sync.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))
        out, last[0] = usec - last[0], usec
        return out

    if proc is not None:
        subprocess.run(["callgrind_control", "--instr=on", str(proc.pid)], check=True, capture_output=True)
        _instructions(proc.pid, tmp)  # the count starts here
    fetch_t = ack_t = 0.0
    done = n = 0
    held: list[tuple[str, str]] = []
    while done < jobs:
        since()
        for key, who in held:
            broker.free_key_slot("q", key, who)
        got, _ = broker.run(broker.fetch_marking("q", batch, broker.clock() + 600_000, f"w.{n}", "w",
                                                 broker.clock() + 1000))
        fetch_t += since()
        broker.run(broker.ack("q", [(job_id, f"w.{n}") for job_id, _, _ in got]))
        ack_t += since()
        done += len(got)
        held = [(spec.split(b'"ck":"', 1)[1].split(b'"', 1)[0].decode(), f"{job_id}:w.{n}")
                for job_id, spec, _ in got if b'"ck":"' in spec]
        n += 1
        if not got and not held:
            raise SystemExit(f"fetch returned nothing with {jobs - done} jobs left")
    if proc is not None:
        total = _instructions(proc.pid, tmp)
        broker.close()
        return (f"{total / jobs / 1000:.2f} k instructions/job in redis-server (fetch and ack, batches of {batch}, "
                f"{n} fetches)")
    broker.close()
    return (f"fetch {fetch_t / jobs:.2f} µs/job, ack {ack_t / jobs:.2f} µs/job (Redis, batches of {batch}, "
            f"{n} fetches)")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.drain_cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=1, help="each --src once per round, in the order given")
    ap.add_argument("--src", action="append", help="a checkout's src directory (default: this one's)")
    ap.add_argument("--handler", choices=("sync", "async", "noop", "anoop"), default="sync",
                    help="the peer body in a def or async def handler, or a no-op def or async def handler")
    ap.add_argument("--profile", help="write a py-spy raw profile (or perf's, for *.perf) of each drain here")
    ap.add_argument("--scripts", type=int, metavar="BATCH",
                    help="no drain: Redis's time in the fetch and ack scripts per job, BATCH jobs a call")
    ap.add_argument("--keyed", type=int, metavar="LIMIT", help="jobs of a task with a concurrency key of this limit")
    ap.add_argument("--script-cost", nargs=4, help=argparse.SUPPRESS)  # url batch jobs keyed: one --scripts measure
    args = ap.parse_args()
    if args.script_cost:
        url, batch, jobs, keyed = args.script_cost
        print(script_cost(url, int(batch), int(jobs), int(keyed) if keyed != "-" else None))
        return 0

    def one(src: str, url: str, tmp: str) -> str:
        if args.scripts:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, ROOT])}
            keyed = "-" if args.keyed is None else str(args.keyed)
            return subprocess.run([sys.executable, "-m", "bench.drain_cpu", "--script-cost", url, str(args.scripts),
                                   str(args.jobs), keyed], env=env, check=True, capture_output=True,
                                  text=True).stdout.strip()
        if args.keyed is not None and args.handler not in KEYED_APPS:
            raise SystemExit("--keyed drains a no-op handler: --handler noop or anoop")
        r = drain(src, args.jobs, args.handler, url, tmp, args.profile, args.keyed)
        return (f"{r['jobs_s']:,.0f} jobs/s, {r['cpu_us']:,.0f} µs CPU/job (user {r['user_us']:,.0f}, "
                f"sys {r['sys_us']:,.0f}), {r['switches']:.1f} switches/job, {r['scripts']:.2f} script calls/job, "
                f"Redis {r['redis_us']:,.1f} µs CPU/job, {r['threads']} threads"
                + (f", {r['instructions'] / 1000:,.1f} k instructions/job" if CALLGRIND else ""))

    alternate(args.src, args.rounds, "rf-drain-cpu-", one)
    return 0


def alternate(srcs: list[str] | None, rounds: int, prefix: str, one: Callable[[str, str, str], str]) -> None:
    """Each checkout's ``src`` once per round, in the order given, against one private redis-server: before and
    after share the machine's state. ``one(src, redis_url, tmp)`` measures and returns the figures' line."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        server = EmbeddedRedis(tmp, port=free_port()).start()
        try:
            for n in range(rounds):
                for src in srcs or [os.path.join(ROOT, "src")]:
                    load = os.getloadavg()[0]
                    line = one(src, server.url, tmp)
                    print(f"round {n + 1} {src}: {line} (load {load:.2f})", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
