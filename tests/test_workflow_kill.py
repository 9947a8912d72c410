"""Workflows under SIGKILL at every fault point a step's ack or dead-letter passes, on real worker processes: the
next step is never lost nor queued twice (each step's job is enqueued once: the queue's `enqueued` counter), a
chord's callback is queued once, every fenced charge happens once at the provider, a dead step fails its workflow
and `ringfence dead replay` resumes it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import ringfence
from ringfence.faults import WORKER_POINTS, WORKFLOW_POINTS
from support import WorkerProc, database_url, wait_until
from test_workflow import cli, runs, settled

pytestmark = pytest.mark.slow


@pytest.fixture
def wf(namespace: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """tests/workflowapp.py with its fence database (SQLite under tmp_path, its tables made)."""
    fence_url = database_url("sqlite", tmp_path)
    for name, value in {"RINGFENCE_NAMESPACE": namespace, "RINGFENCE_REDIS_URL": redis_url,
                        "WF_DIR": str(tmp_path), "FENCE_URL": fence_url}.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("workflowapp", None)
    module = importlib.import_module("workflowapp")
    module.app.fence_store.create_all()
    yield module
    module.app.close()
    sys.modules.pop("workflowapp", None)


def spawn(spawn_worker: Callable[..., WorkerProc], faults: str = "") -> WorkerProc:
    return spawn_worker("--app", "workflowapp:app", env={"RINGFENCE_FAULTS": faults})


def enqueued(wf: ModuleType) -> int:
    return int(wf.app.broker.sync.hget(wf.app.broker.keys.queue("wf").stats, "enqueued") or 0)


def order(wf: ModuleType, n: int = 1) -> str:
    """Two fenced charges of order n, then a chord of three members and its callback."""
    return ringfence.chain(wf.charge.s(amount=100), wf.charge.s(amount=200),
                           ringfence.chord([wf.member.s(x=1), wf.member.s(x=2), wf.member.s(x=3)], wf.total.s())
                           ).enqueue(business_id=f"order:{n}")


@pytest.mark.parametrize("point", WORKFLOW_POINTS)
def test_sigkill_at_a_step_ack_loses_and_repeats_nothing(wf: ModuleType, tmp_path: Path, point: str,
                                                         spawn_worker: Callable[..., WorkerProc]) -> None:
    wid = order(wf)
    first = spawn(spawn_worker, point)
    assert first.wait(30) == -9, first.output()  # SIGKILLed at the point, in the first step's ack
    spawn(spawn_worker)
    view = settled(wf, wid)
    assert enqueued(wf) == 6  # every step's job queued once
    assert wf.provider().effects == 2  # each fenced charge once, though the first step ran twice
    # before its ack the killed run is run again (its fence gives the charge it recorded); after it, never
    assert runs(tmp_path, view.steps[0].job_id) == (2 if point == "before_step_ack" else 1)
    assert all(runs(tmp_path, s.job_id) == 1 for s in view.steps[1:])
    assert view.steps[5].result == {"sum": 6, "inputs": [1, 2, 3]}
    refs = [s.result for s in view.steps[:2]]
    assert sorted(refs) == sorted(c.id for c in wf.provider().records())


def test_sigkill_while_a_steps_charge_is_in_flight_is_settled_by_its_reconcile_hook(
        wf: ModuleType, tmp_path: Path, spawn_worker: Callable[..., WorkerProc]) -> None:
    """A SIGKILL ends every job of the process, wherever it is: a step whose charge was in flight (made, not
    recorded) is in doubt; its rerun asks the reconcile hook, adopts the charge and the workflow goes on."""
    wid = order(wf)
    first = spawn(spawn_worker, "after_effect")
    assert first.wait(30) == -9, first.output()
    spawn(spawn_worker)
    view = settled(wf, wid)
    assert wf.provider().effects == 2 and enqueued(wf) == 6
    assert runs(tmp_path, view.steps[0].job_id) == 2
    assert sorted(s.result for s in view.steps[:2]) == sorted(c.id for c in wf.provider().records())


def test_random_sigkills_in_every_step_ack_finish_the_chord_once(wf: ModuleType, tmp_path: Path,
                                                                 spawn_worker: Callable[..., WorkerProc]) -> None:
    """Three workflows, the watched worker killed at either step-ack point with p = 0.25 and replaced; a kill also
    ends the other jobs it runs wherever they are (a charge in flight is settled by its reconcile hook)."""
    wids = [order(wf, n) for n in range(3)]
    faults = ",".join(f"{p}:0.25" for p in WORKFLOW_POINTS)
    workers = [spawn(spawn_worker, faults)]

    def all_done() -> bool:
        if workers[-1].proc.poll() is not None:  # killed: the next one takes over its leased jobs
            workers.append(spawn(spawn_worker, faults))
            if len(workers) == 2:  # a worker never killed, once one was: each run has a kill
                workers.insert(0, spawn(spawn_worker))
        return all((v := wf.app.workflow(w)) is not None and v.state == "done" for w in wids)

    try:
        wait_until(all_done, timeout=45, interval=0.1)
    except AssertionError as exc:  # name what each step is at, its failure and its runs
        views = {w: wf.app.workflow(w) for w in wids}
        raise AssertionError({w: (v.state, [(s.job_id, s.state, s.failure, runs(tmp_path, s.job_id))
                                            for s in v.steps]) if v else None
                              for w, v in views.items()}) from exc
    assert len(workers) >= 3  # a kill happened
    assert enqueued(wf) == 6 * len(wids)
    assert wf.provider().effects == 2 * len(wids)
    for w in wids:
        view = wf.app.workflow(w)
        assert view is not None and view.steps[5].result["sum"] == 6
        assert runs(tmp_path, view.steps[5].job_id) >= 1


@pytest.mark.parametrize("point", WORKER_POINTS)
def test_sigkill_around_a_steps_dead_letter_fails_the_workflow_once(wf: ModuleType, tmp_path: Path, point: str,
                                                                    namespace: str, redis_url: str,
                                                                    spawn_worker: Callable[..., WorkerProc]) -> None:
    wid = ringfence.chain(wf.add.s(x=1), wf.boom.s(n=5), wf.add.s(x=10)).enqueue()
    first = spawn(spawn_worker, point)
    assert first.wait(30) == -9, first.output()
    spawn(spawn_worker)
    view = settled(wf, wid, "failed")
    assert view.failed == ["workflowapp.boom"] and view.steps[2].state == "waiting"
    assert enqueued(wf) == 2
    (tmp_path / "fixed-5").write_text("")
    assert cli(namespace, redis_url, "dead", "replay", view.steps[1].job_id).returncode == 0
    view = settled(wf, wid)
    assert [s.result for s in view.steps] == [1, 5, 15] and enqueued(wf) == 3
    assert runs(tmp_path, view.steps[2].job_id) == 1


def test_workflows_of_one_business_id_charge_once(
        wf: ModuleType, spawn_worker: Callable[..., WorkerProc]) -> None:
    spawn(spawn_worker)
    first = settled(wf, order(wf, 7))
    again = settled(wf, order(wf, 7))  # the same business id: every fenced step is done already
    assert [s.result for s in again.steps] == [s.result for s in first.steps]
    assert wf.provider().effects == 2
    unnamed = ringfence.chain(wf.charge.s(amount=5)).enqueue()  # no business id: ctx.fence() has no subject
    view = settled(wf, unnamed, "failed")
    assert view.steps[0].failure["dead"] == "permanent"
    assert "ctx.fence() needs a subject and a step" in view.steps[0].failure["error"]
    assert wf.provider().effects == 2
    both = [order(wf, 8), order(wf, 8)]  # at once: one waits while the other holds the fence (FenceBusy)
    a, b = (settled(wf, w) for w in both)
    assert [s.result for s in a.steps] == [s.result for s in b.steps]
    assert wf.provider().effects == 4
