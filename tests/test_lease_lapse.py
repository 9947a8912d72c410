"""An attempt whose lease lapsed while its process stood still (SIGSTOP past the lease) must not start an effect:
meanwhile another worker's sweep recovered the job and, its attempts used up, dead-lettered it naming no step
(none was open then). When the stopped process resumes, its handler opens the step and asks for the effect: the
step must not go to ``calling`` and nothing is charged. Real worker processes, the shared Redis, SQLite fences;
both kinds of step: strict (``calling`` committed before the call) and ``provider_dedup`` (captured already
``calling``). The lease the worker counts on ends where Redis's does, for a fetched job and for one leased in a wake
message that reached the worker late."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.fence import FenceState
from support import FAST, REDIS_URL, ROOT, wait_until


def worker(ns: str, fence_url: str, lease_s: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": REDIS_URL, "RINGFENCE_NAMESPACE": ns, "FENCE_URL": fence_url,
           "LAPSE_LEASE_S": lease_s,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "lapseapp:app"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _charge(ctx: object, where: str, dedup: bool) -> None:
    """The producer's side of lapseapp's task."""


@pytest.mark.parametrize("dedup", [False, True], ids=["strict", "provider_dedup"])
def test_a_lapsed_attempt_starts_no_effect(tmp_path: Path, redis_url: str, namespace: str, dedup: bool) -> None:
    fence_url = f"sqlite:///{tmp_path}/fences.db"
    app = App(redis_url, namespace, environment="test", fence_url=fence_url, worker=FAST)
    app.fence_store.create_all()
    first = worker(namespace, fence_url)
    second: subprocess.Popen[bytes] | None = None
    try:
        job = app.task(name="charge", max_attempts=1)(_charge).enqueue(where=str(tmp_path), dedup=dedup)
        wait_until(lambda: (tmp_path / "started-1").exists(), timeout=15)
        first.send_signal(signal.SIGSTOP)  # its handler waits for the go-ahead: it has opened no step yet
        second = worker(namespace, fence_url)  # its sweep recovers the lapsed job; attempts used up: dead
        dead = app.broker.keys.queue("default").dead
        r = redis.Redis.from_url(redis_url)
        wait_until(lambda: r.zscore(dead, job) is not None, timeout=15)
        assert not (tmp_path / "started-2").exists()
        (tmp_path / "go").write_text("")
        first.send_signal(signal.SIGCONT)
        wait_until(lambda: (tmp_path / "finished-1").exists(), timeout=10)
        assert not (tmp_path / "charges").exists(), "the lapsed attempt charged behind its dead job"
        row = app.fence_store.get("order:1", "charge")
        assert row is None or row.state is FenceState.CLAIMED, row
        assert first.poll() is None, "the resumed worker died"
    finally:
        first.send_signal(signal.SIGCONT)
        for w in (first, second):
            if w is not None:
                w.send_signal(signal.SIGTERM)
        for w in (first, second):
            if w is not None:
                try:
                    w.wait(10)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait(5)
        app.close()


def _probe(ctx: object, where: str, lapse: bool) -> None:
    """The producer's side of lapseapp's ``probe``."""


def _seen(where: Path) -> dict[str, object]:
    return json.loads((where / "seen").read_text())


def test_a_delayed_wake_message_leases_no_longer_than_redis(tmp_path: Path, redis_url: str, namespace: str) -> None:
    """A job leased to an idle worker in its wake message, the message read late (the worker SIGSTOPped at its
    receipt for most of the lease): the worker's lease book ends the lease where Redis does, not a whole lease
    after the read. Its handler, no heartbeat renewing the lease meanwhile, asks for an effect once Redis's clock
    passed that deadline: refused (FencedOut), nothing charged; the job's next attempt charges once. Lease 6 s
    (margin 1.5 s), a heartbeat every 3 s; the worker is stopped just after one, so the next comes only once the
    handler holds the event loop."""
    fence_url = f"sqlite:///{tmp_path}/fences.db"
    app = App(redis_url, namespace, environment="test", fence_url=fence_url, worker=FAST)
    app.fence_store.create_all()
    keys = app.broker.keys.queue("default")
    r = redis.Redis.from_url(redis_url)
    w = worker(namespace, fence_url, lease_s="6")
    try:
        wait_until(lambda: r.zcard(keys.idle) > 0, timeout=15)  # idle, its wake channel subscribed
        beat = r.zrange(app.broker.keys.servers, 0, -1, withscores=True)
        wait_until(lambda: r.zrange(app.broker.keys.servers, 0, -1, withscores=True) != beat, timeout=5,
                   interval=0.005)
        w.send_signal(signal.SIGSTOP)  # just after a heartbeat
        job = app.task(name="probe", max_attempts=2)(_probe).enqueue(where=str(tmp_path), lapse=True)
        token = r.hget(keys.lease, job)
        assert token is not None and f".p{job}.".encode() in token, "not leased in a wake message"
        leased_until = int(r.zscore(keys.active, job) or 0)
        time.sleep(2.2)  # the message waits unread; 3.8 s of the lease are left when it is read
        w.send_signal(signal.SIGCONT)
        wait_until(lambda: (tmp_path / "finished-1").exists(), timeout=10)
        seen = _seen(tmp_path)
        assert seen["deadline"] == leased_until, "the lease was renewed before the handler looked (inconclusive)"
        assert not (tmp_path / "charges").exists(), f"an effect started after the lease lapsed: {seen}"
        assert (tmp_path / "finished-1").read_text() == "FencedOut"
        assert seen["book"] == leased_until, seen
        # The job's next attempt takes the step over and makes the effect, once.
        wait_until(lambda: (tmp_path / "finished-2").exists(), timeout=10)
        assert (tmp_path / "finished-2").read_text() == "charged"
        assert (tmp_path / "charges").read_text().splitlines() == ["ch_1"]
        row = app.fence_store.get("order:2", "charge")
        assert row is not None and row.state in (FenceState.EFFECTED, FenceState.COMPLETED), row
    finally:
        _stop(w)
        app.close()


def test_a_fetched_job_is_leased_until_the_deadline_redis_set(tmp_path: Path, redis_url: str,
                                                              namespace: str) -> None:
    """A job taken by a fetch: the worker's lease book holds the deadline of its lease in Redis."""
    app = App(redis_url, namespace, environment="test", worker=FAST)
    r = redis.Redis.from_url(redis_url)
    job = app.task(name="probe", max_attempts=2)(_probe).enqueue(where=str(tmp_path), lapse=False)
    w = worker(namespace, f"sqlite:///{tmp_path}/fences.db")
    try:
        wait_until(lambda: (tmp_path / "seen").exists(), timeout=15)
        seen = _seen(tmp_path)
        token = seen["token"]
        assert isinstance(token, str) and f".p{job}." not in token, "not fetched"
        assert r.hget(app.broker.keys.queue("default").lease, job) in (token.encode(), None)
        assert seen["book"] == seen["deadline"] > 0, seen
    finally:
        _stop(w)
        app.close()


def _stop(w: subprocess.Popen[bytes]) -> None:
    w.send_signal(signal.SIGCONT)
    w.send_signal(signal.SIGTERM)
    try:
        w.wait(10)
    except subprocess.TimeoutExpired:
        w.kill()
        w.wait(5)
