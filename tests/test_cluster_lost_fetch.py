"""On a Redis Cluster, redis-py's cluster client sends a timed-out command once more by itself (ringfence's retry
setting): a fetch that timed out while its node stood still, then answered on the resend, ran twice, and the jobs
of its first run are nobody's. The worker learns of the resend (``connection.resent``) and gives them back within 0.5 s
(hand_back_fetch.lua), their attempt not counted."""

from __future__ import annotations

import inspect
import time
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio.cluster as aiocluster

from redisfaults import FaultWorker, ran_once_at_once
from ringfence import App
from support import wait_until
from topology import HAVE_REDIS, Cluster


def test_redis_py_still_asks_its_retry_errors_only_before_a_resend() -> None:
    """What ``_CountedRetryErrors`` (redis/connection.py) counts on: the one test of ``ERRORS_ALLOW_RETRY`` in the
    cluster client's ``execute_command``, made only while an attempt is left, the resend following."""
    source = inspect.getsource(aiocluster.RedisCluster.execute_command)
    assert source.count("ERRORS_ALLOW_RETRY") == 1
    assert "retry_attempts > 0 and type(e) in self.__class__.ERRORS_ALLOW_RETRY" in source


def _slow(ctx: object, seconds: float) -> None:
    """The producer's side of faultapp.py's slow_a."""


@pytest.mark.topology
@pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")
def test_a_job_leased_by_a_fetch_the_cluster_client_sent_twice_runs_at_once(tmp_path: Path) -> None:
    """The master of queue ``a`` blocked (``DEBUG SLEEP 1.7``) just as the queue is resumed, in the same write: an
    idle worker's fallback fetch (every 0.5 s) waits in that master's input buffer, times out after 1 s, and the
    cluster client sends it again on a new connection. After the sleep the master runs the first fetch, which
    leases the job to a reply nobody reads, then the resend, which answers with nothing. The job runs within 3 s of
    the master answering, as attempt 1, once (else: at the end of its 10 s lease, as attempt 2)."""
    cluster = Cluster(tmp_path / "cluster", node_args=("--enable-debug-command", "yes"))
    ns = f"c{uuid.uuid4().hex[:8]}"
    app = App(cluster.url, ns, environment="test")
    worker: FaultWorker | None = None
    try:
        task = app.task(name="faultapp.slow_a", queue="a")(_slow)
        k = app.broker.keys.queue("a")
        node = app.broker.sync.get_node_from_key(k.pending)  # type: ignore[attr-defined]
        r = redis.Redis(port=node.port)
        worker = FaultWorker(cluster.url + "?socket_timeout=1", ns, tmp_path, "a", name="w",
                             env={"FAULT_LEASE_S": "10", "FAULT_HEARTBEAT_S": "0.5"})
        wait_until(lambda: r.zcard(k.idle) > 0, 30)
        app.broker.set_paused("a", True)  # the job waits in pending: no wake message leases it
        job = task.enqueue(seconds=0.1)
        time.sleep(1.0)
        assert r.hget(k.lease, job) is None and r.llen(k.pending) == 1
        with r.pipeline(transaction=False) as p:  # one write: the master resumes the queue and sleeps at once
            p.delete(k.paused)
            p.execute_command("DEBUG", "SLEEP", "1.7")
            p.execute()
        answered = time.time()
        wait_until(lambda: r.hget(k.stats, "processed") == b"1", 30)
        stats = r.hgetall(k.stats)
        lines = worker.lines()
    finally:
        if worker is not None:
            worker.stop()
        app.close()
        cluster.stop()
    print(f"started {ran_once_at_once(tmp_path, job, answered, stats, lines):.3f}s after the master answered")
