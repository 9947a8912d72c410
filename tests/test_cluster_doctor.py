"""``ringfence doctor`` on a Redis Cluster with a master down, killed or hung (SIGSTOP: connections open, no
answer): like ``info``, it asks each master for a short PING first and samples only the queues of the masters that
answer; the dead master's queue is named unreadable with its node, the other queues are judged, and the answer
comes within a bounded time instead of the client's socket timeout on each retry of each read."""

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

from ringfence.redis.connection import ConnectionSettings
from support import ROOT
from topology import HAVE_REDIS, Cluster, silence_a_master

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_the_doctor_samples_the_live_masters_and_names_the_dead_one(tmp_path: Path, fault: str) -> None:
    cluster = Cluster(tmp_path, node_timeout_ms=60_000)  # no replica, no failover meanwhile
    try:
        ns = f"dsm{uuid.uuid4().hex[:6]}"
        by_master, victim = silence_a_master(cluster, ns, fault)

        env = {**os.environ, "RINGFENCE_REDIS_URL": cluster.url, "RINGFENCE_NAMESPACE": ns,
               "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "ringfence.cli", "doctor", "--json", "--sample-s", "0.2"],
                              env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
        assert done.returncode == 2, done.stdout + done.stderr
        found = json.loads(done.stdout)["findings"]
        unread = [f["subject"] for f in found if f["check"] == "topology" and "cannot be read" in f["symptom"]]
        assert unread == [by_master[victim]]
        judged = {f["subject"] for f in found if f["check"] == "queue_unserved"}
        assert judged == {q for m, q in by_master.items() if m != victim}  # a backlog no worker serves
        failed = [f["check"] for f in found if "the check failed" in f["symptom"]]
        assert failed == [], failed
        # redis-py's client sends its first COMMAND to a random master as it starts: a hung one costs that start
        # one socket timeout (5 s), once; a read per queue waiting out its retries would cost 10 s each.
        assert took < 10 + ConnectionSettings().socket_timeout_s, f"the doctor took {took:.1f}s"
    finally:
        for proc in cluster.procs.values():
            proc.send_signal(signal.SIGCONT)
        cluster.stop()
