"""Workflows whose steps live in different queues (different slots): a step is handed over to its queue keyed by
its job id and its completion comes back the same way (redis/workflows.py). On real worker processes SIGKILLed
between the two halves of each hand-over: every step's job is enqueued once (the queues' `enqueued` counters),
every fenced charge happens once at the provider, the chord's callback runs once, and the sweep finishes what the
kill left. A step handed over but not yet in its queue shows as `handing`."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import orjson
import pytest
import redis

import ringfence
from ringfence import faults, workflows
from ringfence.faults import HANDOVER_POINTS, WORKFLOW_POINTS
from ringfence.redis import workflows as stored
from support import WorkerProc, database_url, wait_until
from test_workflow import cli, runs, settled

pytestmark = pytest.mark.slow

QUEUES = ("wf", "other", "third")


@pytest.fixture
def wf(namespace: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """tests/workflowapp.py with its fence database (SQLite under tmp_path, its tables made)."""
    for name, value in {"RINGFENCE_NAMESPACE": namespace, "RINGFENCE_REDIS_URL": redis_url,
                        "WF_DIR": str(tmp_path), "FENCE_URL": database_url("sqlite", tmp_path)}.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("workflowapp", None)
    module = importlib.import_module("workflowapp")
    module.app.fence_store.create_all()
    yield module
    module.app.close()
    sys.modules.pop("workflowapp", None)


def spawn(spawn_worker: Callable[..., WorkerProc], faults_: str = "", queues: str = "") -> WorkerProc:
    args = ["--app", "workflowapp:app", *(["--queues", queues] if queues else [])]
    return spawn_worker(*args, env={"RINGFENCE_FAULTS": faults_})


def enqueued(wf: ModuleType) -> dict[str, int]:
    b = wf.app.broker
    return {q: int(b.sync.hget(b.keys.queue(q).stats, "enqueued") or 0) for q in QUEUES}


def order(wf: ModuleType, n: int = 1) -> str:
    """A fenced charge in 'wf', one in 'other', then a chord whose members are in the three queues and whose
    callback is in 'other'."""
    return ringfence.chain(
        wf.charge.s(amount=100), wf.charge.with_options(queue="other").s(amount=200),
        ringfence.chord([wf.member.s(x=1), wf.member.with_options(queue="other").s(x=2), wf.far.s(x=3)],
                        wf.total.with_options(queue="other").s())).enqueue(business_id=f"order:{n}")


ORDER_QUEUES = ["wf", "other", "wf", "other", "third", "other"]
ORDER_ENQUEUED = {"wf": 2, "other": 3, "third": 1}


def handovers_left(rdb: redis.Redis, namespace: str) -> int:
    """Hand-over entries still open, out or back, in every queue's slot."""
    return sum(rdb.zcard(k) for k in rdb.scan_iter(f"{namespace}:*:wf-out")) + sum(
        rdb.zcard(k) for k in rdb.scan_iter(f"{namespace}:*:wf-back"))


def no_handover_left(rdb: redis.Redis, namespace: str) -> None:
    """The last step's completion is forgotten just after it finished the workflow: wait for that."""
    wait_until(lambda: handovers_left(rdb, namespace) == 0, timeout=10)


def killed_at(point: str, wf: ModuleType, node: ringfence.Group, rdb: redis.Redis, namespace: str) -> str:
    """Start ``node`` in this process, 'killed' (SimulatedKill) at ``point`` of its first hand-over; its id."""
    def hook(name: str) -> None:
        if name == point:
            raise faults.SimulatedKill(name)

    before = set(rdb.scan_iter(f"{namespace}:*:wf:*"))
    with faults.inject(hook), pytest.raises(faults.SimulatedKill):
        node.enqueue()
    (key,) = set(rdb.scan_iter(f"{namespace}:*:wf:*")) - before
    return key.decode().rsplit(":wf:", 1)[1]


def test_steps_across_queues_run_once_each_and_their_results_flow(
        wf: ModuleType, tmp_path: Path, rdb: redis.Redis, namespace: str,
        spawn_worker: Callable[..., WorkerProc]) -> None:
    spawn(spawn_worker)
    wid = order(wf)
    first_elsewhere = ringfence.chain(ringfence.group([wf.add.with_options(queue="other").s(x=1), wf.far.s(x=2)]),
                                      wf.total.s()).enqueue()  # home 'other': 'third' handed over at the start
    view = settled(wf, wid)
    assert [s.queue for s in view.steps] == ORDER_QUEUES
    assert view.steps[5].result == {"sum": 6, "inputs": [1, 2, 3]}
    assert wf.provider().effects == 2 and sorted(s.result for s in view.steps[:2]) == sorted(
        c.id for c in wf.provider().records())
    assert all(runs(tmp_path, s.job_id) == 1 for s in view.steps)
    other = settled(wf, first_elsewhere)
    assert [s.result for s in other.steps] == [1, 2, {"sum": 3, "inputs": [1, 2]}]
    assert enqueued(wf) == {"wf": 2 + 1, "other": 3 + 1, "third": 1 + 1}
    no_handover_left(rdb, namespace)


def test_a_step_handed_over_but_not_yet_in_its_queue_is_shown_and_the_sweep_finishes_it(
        wf: ModuleType, rdb: redis.Redis, namespace: str, redis_url: str,
        spawn_worker: Callable[..., WorkerProc]) -> None:
    wid = killed_at("before_hand_in", wf,
                    ringfence.group([wf.add.s(x=1), wf.add.with_options(queue="other").s(x=2)]), rdb, namespace)
    view = wf.app.workflow(wid)
    assert view is not None and [(s.queue, s.state) for s in view.steps] == [("wf", "queued"), ("other", "handing")]
    assert view.stuck == [] and wf.app.broker.job_state("other", view.steps[1].job_id) is None
    shown = cli(namespace, redis_url, "workflow", "show", wid)
    assert shown.returncode == 0, shown.stderr
    assert [(s["queue"], s["state"]) for s in orjson.loads(shown.stdout)["steps"]] == [
        ("wf", "queued"), ("other", "handing")]
    spawn(spawn_worker)
    view = settled(wf, wid)  # the sweep put it in its queue
    assert [s.result for s in view.steps] == [1, 2]
    assert enqueued(wf) == {"wf": 1, "other": 1, "third": 0}
    no_handover_left(rdb, namespace)


@pytest.mark.parametrize("point", ["after_step_ack", *HANDOVER_POINTS])
def test_sigkill_between_the_halves_of_a_hand_over_loses_and_repeats_nothing(
        wf: ModuleType, tmp_path: Path, rdb: redis.Redis, namespace: str, point: str,
        spawn_worker: Callable[..., WorkerProc]) -> None:
    """The worker of 'other' is killed at the point, in the step there whose ack hands the chord's members over
    (its completion applied to the workflow, the members of other queues handed over); the worker of the other
    queues, then a fresh one for all, finish the workflow."""
    wid = order(wf)
    killed = spawn(spawn_worker, point, "other")
    spawn(spawn_worker, "", "wf,third")
    assert killed.wait(30) == -9, killed.output()
    spawn(spawn_worker)
    view = settled(wf, wid)
    assert enqueued(wf) == ORDER_ENQUEUED  # every step's job queued once
    assert wf.provider().effects == 2  # each fenced charge once
    # each step ran once, the chord's callback too; but the member in 'other', which the killed worker may have
    # fetched as soon as it handed it in: a run the kill ended runs again
    assert [runs(tmp_path, s.job_id) for i, s in enumerate(view.steps) if i != 3] == [1] * 5
    assert runs(tmp_path, view.steps[3].job_id) in (1, 2)
    assert view.steps[5].result == {"sum": 6, "inputs": [1, 2, 3]}
    no_handover_left(rdb, namespace)


def test_random_sigkills_at_every_step_ack_and_hand_over_point_finish_each_workflow_once(
        wf: ModuleType, tmp_path: Path, spawn_worker: Callable[..., WorkerProc]) -> None:
    """Three workflows; the watched worker (all queues) killed at any step-ack or hand-over point with p = 0.25
    and replaced, beside one never killed; a kill also ends the other jobs it runs wherever they are."""
    wids = [order(wf, n) for n in range(3)]
    faults_ = ",".join(f"{p}:0.25" for p in (*WORKFLOW_POINTS, *HANDOVER_POINTS))
    workers = [spawn(spawn_worker, faults_)]

    def all_done() -> bool:
        if workers[-1].proc.poll() is not None:
            workers.append(spawn(spawn_worker, faults_))
            if len(workers) == 2:
                workers.insert(0, spawn(spawn_worker))
        return all((v := wf.app.workflow(w)) is not None and v.state == "done" for w in wids)

    try:
        wait_until(all_done, timeout=60, interval=0.1)
    except AssertionError as exc:
        views = {w: wf.app.workflow(w) for w in wids}
        raise AssertionError({w: v.to_dict() if v else None for w, v in views.items()}) from exc
    assert len(workers) >= 3  # a kill happened
    assert enqueued(wf) == {q: n * len(wids) for q, n in ORDER_ENQUEUED.items()}
    assert wf.provider().effects == 2 * len(wids)
    for w in wids:
        view = wf.app.workflow(w)
        assert view is not None and view.steps[5].result == {"sum": 6, "inputs": [1, 2, 3]}


def test_a_dead_step_in_another_queue_fails_its_workflow_and_replay_resumes_it(
        wf: ModuleType, tmp_path: Path, namespace: str, redis_url: str,
        spawn_worker: Callable[..., WorkerProc]) -> None:
    spawn(spawn_worker)
    boom = wf.boom.with_options(queue="other")
    wid = ringfence.chain(wf.add.s(x=1), boom.s(n=7), wf.add.s(x=10)).enqueue()
    tolerant = ringfence.chord([wf.member.s(x=1), boom.s(n=8)], wf.total.with_options(queue="third").s(),
                               on_member_dead="continue").enqueue()
    view = settled(wf, wid, "failed")
    assert view.failed == ["workflowapp.boom"] and view.steps[2].state == "waiting"
    (tmp_path / "fixed-7").write_text("")
    assert cli(namespace, redis_url, "dead", "replay", view.steps[1].job_id).returncode == 0
    view = settled(wf, wid)
    assert [s.result for s in view.steps] == [1, 7, 17]
    assert runs(tmp_path, view.steps[2].job_id) == 1
    chord = settled(wf, tolerant)
    assert chord.failed == ["workflowapp.boom"]
    inputs = chord.steps[2].result["inputs"]
    assert inputs[0] == 1 and inputs[1]["dead"] == "permanent" and inputs[1]["step"] == "workflowapp.boom"


def test_cancel_blocks_a_step_on_its_way_or_cancels_it_in_its_queue(
        wf: ModuleType, rdb: redis.Redis, namespace: str) -> None:
    wid = killed_at("before_hand_in", wf,
                    ringfence.group([wf.add.s(x=1), wf.add.with_options(queue="other").s(x=2)]), rdb, namespace)
    view, cancelled = workflows.cancel(wf.app, wid)
    assert view.state == "cancelled" and [s.state for s in view.steps] == ["queued", "waiting"]
    assert cancelled == [view.steps[0].job_id]
    late = stored.Handed("wf", wid, 1, "other", view.steps[1].job_id, '{"t":"workflowapp.add","a":{"x":2}}')
    assert wf.app.broker.run(stored.hand_in(wf.app.broker, late)) is False  # a sweep's late hand-in: blocked
    assert wf.app.broker.job_state("other", view.steps[1].job_id) is None and enqueued(wf)["other"] == 0

    second = killed_at("before_handed", wf, ringfence.group([wf.add.s(x=1), wf.far.s(x=3)]), rdb, namespace)
    assert wf.app.workflow(second).steps[1].state == "handing"  # type: ignore[union-attr]
    assert wf.app.broker.job_state("third", f"{second}.1") == "pending"  # in its queue, the entry not closed
    view, cancelled = workflows.cancel(wf.app, second)
    assert sorted(cancelled) == sorted(s.job_id for s in view.steps)
    assert wf.app.broker.job_state("third", view.steps[1].job_id) is None
