"""Workflows on a private 3-master Redis Cluster: the workflow's hash lives in its queue's slot, so its start, each
step's ack-and-advance and a dead step's dead-letter are scripts of one slot; a real worker runs a chain, a chord and
a failing chain there, and `ringfence workflow show` reads them. Steps in queues on other masters go by hand-over,
through a SIGKILL between its two halves, and through a start whose hand-in finds its queue's master killed."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import orjson
import pytest

import ringfence
from ringfence import faults
from support import ROOT, wait_until
from topology import HAVE_REDIS, Cluster, queue_per_master

pytestmark = [pytest.mark.topology, pytest.mark.slow,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("wfcluster"))
    yield c
    c.stop()


@pytest.fixture
def wf(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """tests/workflowapp.py on the cluster, a namespace of its own."""
    for name, value in {"RINGFENCE_REDIS_URL": str(cluster.url), "RINGFENCE_NAMESPACE": f"c{uuid.uuid4().hex[:8]}",
                        "WF_DIR": str(tmp_path),
                        "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("workflowapp", None)
    module = importlib.import_module("workflowapp")
    yield module
    module.app.close()
    sys.modules.pop("workflowapp", None)


def test_a_chain_a_chord_and_a_dead_step_on_a_cluster(wf: ModuleType) -> None:
    done = ringfence.chain(wf.add.s(x=1), wf.add.s(x=2),
                           ringfence.chord([wf.member.s(x=5), wf.member.s(x=6)], wf.total.s())).enqueue()
    failed = ringfence.chain(wf.add.s(x=1), wf.boom.s(n=3), wf.add.s(x=1)).enqueue()
    worker = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "workflowapp:app"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wanted = ((done, "done"), (failed, "failed"))
        wait_until(lambda: all((v := wf.app.workflow(w)) and v.state == s for w, s in wanted), timeout=40)
        assert wf.app.workflow(failed).failed == ["workflowapp.boom"]
        out = subprocess.run([sys.executable, "-m", "ringfence.cli", "workflow", "show", done, "--app",
                              "workflowapp:app"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert [s["result"] for s in orjson.loads(out.stdout)["steps"]] == [1, 3, 5, 6, {"sum": 11, "inputs": [5, 6]}]
    finally:
        worker.kill()
        worker.wait(10)


def test_steps_in_queues_on_three_masters_hand_over_once_through_a_kill(wf: ModuleType) -> None:
    """A chain and a chord whose steps are in queues on the three masters; the worker of the second queue is
    SIGKILLed once its step's ack applied the completion and before it hands the chord's members over: the other
    worker's sweep finishes the hand-overs, every step's job is enqueued once."""
    q0, q1, q2 = sorted(queue_per_master(wf.app.broker).values())
    wid = ringfence.chain(wf.add.with_options(queue=q0).s(x=1), wf.add.with_options(queue=q1).s(x=2),
                          ringfence.chord([wf.member.with_options(queue=q).s(x=x) for q, x in ((q0, 5), (q1, 6),
                                                                                               (q2, 7))],
                                          wf.total.with_options(queue=q2).s())).enqueue()

    def worker(queues: str, faults: str = "") -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "workflowapp:app",
                                 "--queues", queues], env={**os.environ, "RINGFENCE_FAULTS": faults},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    killed = worker(q1, "before_hand_in")
    workers = [killed, worker(f"{q0},{q2}")]
    try:
        assert killed.wait(40) == -9
        workers.append(worker(f"{q0},{q1},{q2}"))
        wait_until(lambda: (v := wf.app.workflow(wid)) and v.state == "done", timeout=40)
        view = wf.app.workflow(wid)
        assert [s.queue for s in view.steps] == [q0, q1, q0, q1, q2, q2]
        assert [s.result for s in view.steps] == [1, 3, 5, 6, 7, {"sum": 18, "inputs": [5, 6, 7]}]
        b = wf.app.broker
        assert {q: int(b.sync.hget(b.keys.queue(q).stats, "enqueued") or 0) for q in (q0, q1, q2)} == {
            q0: 2, q1: 2, q2: 2}
    finally:
        for w in workers:
            w.kill()
            w.wait(10)


@pytest.mark.parametrize("call", ["enqueue", "aenqueue"])
def test_a_start_whose_hand_over_fails_returns_its_id_and_the_sweep_hands_the_step_over(
        wf: ModuleType, cluster: Cluster, caplog: pytest.LogCaptureFixture, call: str) -> None:
    """The master of the first due step's queue is SIGKILLed once the start is stored, before its hand-in: the
    start returns the workflow id (a caller who retried would start a second workflow) with one warning; once the
    master is back, a worker's sweep hands the step over and it runs once."""
    b = wf.app.broker
    by_master = queue_per_master(b)
    ns_master = b.sync.get_node_from_key(b.keys.queues).name
    victim = sorted(m for m in by_master if m != ns_master)[0]
    home, target = by_master[ns_master], by_master[victim]
    port = int(victim.rsplit(":", 1)[1])

    def kill_target(name: str) -> None:
        if name == "before_hand_in":
            cluster.kill(port)

    node = ringfence.group([wf.add.with_options(queue=home).s(x=1), wf.add.with_options(queue=target).s(x=2)])
    started = time.monotonic()
    try:
        with faults.inject(kill_target), caplog.at_level(logging.WARNING, logger="ringfence.workflows"):
            wid = node.enqueue() if call == "enqueue" else asyncio.run(node.aenqueue())
        took = time.monotonic() - started
        warned = [r.getMessage() for r in caplog.records if r.name == "ringfence.workflows"]
        assert len(warned) == 1 and wid in warned[0] and f"{wid}.1" in warned[0] and target in warned[0], warned
    finally:
        if port not in cluster.procs:
            cluster.start_node(port)
        wait_until(cluster.settled, timeout=30)
    assert took < 30
    worker = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "workflowapp:app",
                               "--queues", f"{home},{target}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: (v := wf.app.workflow(wid)) and v.state == "done", timeout=40)
    finally:
        worker.kill()
        worker.wait(10)
    view = wf.app.workflow(wid)
    assert [(s.queue, s.result) for s in view.steps] == [(home, 1), (target, 2)]
    assert {q: int(b.sync.hget(b.keys.queue(q).stats, "enqueued") or 0) for q in (home, target)} == {
        home: 1, target: 1}
