"""``ringfence info`` on a Redis Cluster with a master down: it answers for the queues the live masters hold,
names the queues it cannot read with their node, and exits 4 (a partial answer), within a bounded time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.errors import BrokerError
from support import ROOT, wait_until
from topology import HAVE_REDIS, Cluster, SentinelSet, silence_a_master

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


def _stamp(ctx: object, n: int) -> None:
    pass


def _info(url: str, ns: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ringfence.cli", "info", *extra], env=env, capture_output=True,
                          text=True, timeout=120)
    return done, time.monotonic() - started


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_info_answers_for_the_live_masters_and_names_the_dead_one(tmp_path: Path, fault: str) -> None:
    """No replica, node timeout 60 s: the master's slots stay unserved, and no failover meanwhile. A hung master
    (SIGSTOP: connections open, no answer) costs a short timeout, not the client's socket timeout per retry."""
    cluster = Cluster(tmp_path, node_timeout_ms=60_000)
    try:
        ns = f"inf{uuid.uuid4().hex[:6]}"
        by_master, victim = silence_a_master(cluster, ns, fault)

        done, took = _info(cluster.url, ns, "--json")
        assert done.returncode == 4, done.stdout + done.stderr
        out = json.loads(done.stdout)
        assert {r["queue"]: r["pending"] for r in out["queues"]} == {q: 1 for m, q in by_master.items() if m != victim}
        assert [(u["queue"], u["node"]) for u in out["unreachable"]] == [(by_master[victim], victim)]
        assert took < 10, f"info took {took:.1f}s"

        done, took = _info(cluster.url, ns)
        assert done.returncode == 4, done.stdout + done.stderr
        for m, q in by_master.items():
            assert (q in done.stdout) == (m != victim), done.stdout
        assert f"queue {by_master[victim]} cannot be read: node {victim} does not answer" in done.stderr
        assert took < 10, f"info took {took:.1f}s"
    finally:
        for proc in cluster.procs.values():
            proc.send_signal(signal.SIGCONT)
        cluster.stop()


def _doctor(url: str, ns: str) -> dict[str, dict[str, object]]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns}
    done = subprocess.run([sys.executable, "-m", "ringfence.cli", "doctor", "--json", "--sample-s", "0"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1, 2), done.stdout + done.stderr
    return {f["subject"]: f for f in json.loads(done.stdout)["findings"] if f["check"] == "failover" and f["subject"]}


def test_the_doctor_names_a_sentinel_failover_and_what_it_may_have_lost(tmp_path: Path) -> None:
    """The master SIGKILLed, Sentinel promotes the replica: the doctor names the promoted master (no finding on
    the set before) and what a failover loses (writes not replicated: jobs without durable=True)."""
    s = SentinelSet(tmp_path)
    try:
        ns = f"fo{uuid.uuid4().hex[:6]}"
        app = App(s.url, ns)
        app.task(name="stamp")(_stamp).enqueue(n=1)
        app.close()
        assert _doctor(s.url, ns) == {}
        old = s.master_port()
        s.kill(old)
        deadline = time.monotonic() + 60
        while s.master_port() == old:
            assert time.monotonic() < deadline, "no failover within 60 s"
            time.sleep(0.5)
        new = f"127.0.0.1:{s.master_port()}"
        found = _doctor(s.url, ns)
        assert list(found) == [new], found
        assert "promoted by a failover" in str(found[new]["symptom"])
        assert "durable=True" in str(found[new]["hypothesis"])
        assert found[new]["status"] == "ok"  # no orphaned attempt since: nothing blamed
    finally:
        s.stop()


def test_orphans_after_a_failover_are_not_blamed_on_dead_workers(tmp_path: Path) -> None:
    """A job runs (lease 3 s, renewed); the replica stops (SIGSTOP) and falls behind while the lease is renewed on
    the master alone; the master is SIGKILLed and the stale replica promoted: its copy of the lease has lapsed and
    the job is recovered as orphaned. The worker is paused (SIGSTOP) across the failover so that its next renewal
    cannot extend the lapsed lease before the sweep takes it; it lives on. No worker died: the doctor's failover
    check warns and the orphaned check names the failover, not killed workers."""
    s = SentinelSet(tmp_path)
    ns = f"fo{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "RINGFENCE_REDIS_URL": s.url, "RINGFENCE_NAMESPACE": ns,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    w = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "failoverapp:app", "--queues",
                          "default"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    app = App(s.url, ns)
    try:
        app.task(name="slow")(_slow).with_options(durable=True).enqueue(s=30.0)
        active = app.broker.keys.queue("default").active
        wait_until(lambda: redis.Redis(port=s.replica).zcard(active) == 1, timeout=30)
        os.kill(s.procs[s.replica].pid, signal.SIGSTOP)
        master = redis.Redis(port=s.master)
        for i in range(16):  # the replication stream outgrows the stopped replica's socket buffers
            master.set(f"filler:{i}", "x" * 1_000_000)
        time.sleep(5)  # renewals past the replica's lease deadline, on the master alone
        os.kill(w.pid, signal.SIGSTOP)
        s.kill(s.master)
        os.kill(s.procs[s.replica].pid, signal.SIGCONT)
        wait_until(lambda: _recovered(app), timeout=60)  # the sweep any worker runs, on the promoted replica
        os.kill(w.pid, signal.SIGCONT)
        stats = app.broker.keys.queue("default").stats
        assert redis.Redis(port=s.replica).hget(stats, "orphaned") == b"1"
        assert w.poll() is None, "the worker died"
        done = subprocess.run([sys.executable, "-m", "ringfence.cli", "doctor", "--json", "--sample-s", "0"], env=env,
                              capture_output=True, text=True, timeout=120)
        found = {f["check"]: f for f in json.loads(done.stdout)["findings"] if f["subject"]}
        assert found["failover"]["status"] == "warning", found
        assert found["failover"]["subject"] == f"127.0.0.1:{s.replica}"
        assert "failover" in found["orphaned"]["hypothesis"], found["orphaned"]
        assert "killed" not in found["orphaned"]["hypothesis"], found["orphaned"]
    finally:
        os.kill(s.procs[s.replica].pid, signal.SIGCONT)
        os.kill(w.pid, signal.SIGCONT)
        w.kill()
        w.wait(10)
        app.close()
        s.stop()


def _recovered(app: App) -> bool:
    try:
        return bool(app.broker.run(app.broker.recover("default")))
    except (redis.RedisError, BrokerError):  # the master is down until Sentinel promotes the replica
        return False


def _slow(ctx: object, s: float) -> None:
    pass
