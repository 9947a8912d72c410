"""An attempt whose lease lapsed while its process stood still (SIGSTOP past the lease) must not start an effect:
meanwhile another worker's sweep recovered the job and, its attempts used up, dead-lettered it naming no step
(none was open then). When the stopped process resumes, its handler opens the step and asks for the effect: the
step must not go to ``calling`` and nothing is charged. Real worker processes, the shared Redis, SQLite fences;
both kinds of step: strict (``calling`` committed before the call) and ``provider_dedup`` (captured already
``calling``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.fence import FenceState
from support import FAST, REDIS_URL, ROOT, wait_until


def worker(ns: str, fence_url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": REDIS_URL, "RINGFENCE_NAMESPACE": ns, "FENCE_URL": fence_url,
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
