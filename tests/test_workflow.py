"""Workflows on real worker processes and a real Redis: a chain's results flow, a chord's callback runs once with
its members' results in order, a dead step fails the workflow and `ringfence dead replay` resumes it, cancel stops
what has not started, and a finished workflow expires."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
import redis

import ringfence
from ringfence import CannotConnect, ConfigError
from ringfence.redis import workflows
from ringfence.redis.embedded import free_port
from support import ROOT, WorkerProc, wait_until


def load(namespace: str, redis_url: str, directory: Path, mp: pytest.MonkeyPatch) -> ModuleType:
    """tests/workflowapp.py imported on ``namespace``, its runs recorded under ``directory``."""
    mp.setenv("RINGFENCE_NAMESPACE", namespace)
    mp.setenv("RINGFENCE_REDIS_URL", redis_url)
    mp.setenv("WF_DIR", str(directory))
    sys.modules.pop("workflowapp", None)
    return importlib.import_module("workflowapp")


@pytest.fixture
def wf(namespace: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The app on this test's namespace, no worker."""
    module = load(namespace, redis_url, tmp_path, monkeypatch)
    yield module
    module.app.close()
    sys.modules.pop("workflowapp", None)


@dataclass
class Served:
    wf: ModuleType
    dir: Path
    namespace: str
    redis_url: str


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The app and one real worker process, shared by this module's tests (each has workflows of its own)."""
    yield from serve(redis_url, tmp_path_factory)


def serve(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    namespace = f"t{uuid.uuid4().hex[:10]}"
    directory = tmp_path_factory.mktemp("wf")
    with pytest.MonkeyPatch.context() as mp:
        module = load(namespace, redis_url, directory, mp)
        w = WorkerProc(namespace, redis_url, "--app", "workflowapp:app", env={"WF_DIR": str(directory)})
        try:
            yield Served(module, directory, namespace, redis_url)
        finally:
            if w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait(10)
            module.app.close()
            sys.modules.pop("workflowapp", None)
            r = redis.Redis.from_url(redis_url)
            keys = list(r.scan_iter(f"{namespace}:*", count=1000))
            if keys:
                r.delete(*keys)


def runs(tmp_path: Path, job_id: str, kind: str = "ran") -> int:
    return sum(1 for p in tmp_path.iterdir() if p.name.startswith(job_id + ".") and p.name.endswith("." + kind))


def settled(wf: ModuleType, wid: str, state: str = "done") -> Any:
    try:
        return wait_until(lambda: (v := wf.app.workflow(wid)) is not None and v.state == state and v, timeout=30)
    except AssertionError:
        view = wf.app.workflow(wid)
        raise AssertionError(f"workflow {wid} not {state}: {view.to_dict() if view else None}") from None


def cli(namespace: str, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_REDIS_URL": redis_url,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args, "--app", "workflowapp:app"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_chain_then_chord_results_flow_and_each_step_runs_once(served: Served) -> None:
    wf, tmp_path = served.wf, served.dir
    wid = ringfence.chain(wf.add.s(x=1), wf.add.s(x=2),
                          ringfence.chord([wf.add.s(x=10), wf.add.s(x=20), wf.add.s(x=30)], wf.total.s())).enqueue()
    view = settled(wf, wid)
    assert [s.result for s in view.steps] == [1, 3, 13, 23, 33, {"sum": 69, "inputs": [13, 23, 33]}]
    assert [s.after for s in view.steps] == [[], [0], [1], [1], [1], [2, 3, 4]]
    assert all(runs(tmp_path, s.job_id) == 1 for s in view.steps)
    key = f"{wf.app.namespace}:{{{wf.app.namespace}:wf}}:wf:{wid}"
    assert 0 < wf.app.broker.sync.pttl(key) <= 86_400_000  # kept result_ttl_s (a day) once finished
    assert wf.app.broker.sync.hmget(wf.app.broker.keys.queue("wf").jobs, [s.job_id for s in view.steps]) == [None] * 6


def test_finished_workflow_expires_after_its_result_ttl(served: Served) -> None:
    wf = served.wf
    wid = ringfence.chain(wf.add.s(x=1)).enqueue(result_ttl_s=1)
    settled(wf, wid)
    wait_until(lambda: wf.app.workflow(wid) is None, timeout=10)


def test_dead_step_fails_the_workflow_and_replay_resumes_it(served: Served) -> None:
    wf, tmp_path, namespace, redis_url = served.wf, served.dir, served.namespace, served.redis_url
    wid = ringfence.chain(wf.add.s(x=1), wf.boom.s(n=5), wf.add.s(x=10)).enqueue()
    view = settled(wf, wid, "failed")
    assert view.failed == ["workflowapp.boom"]
    assert [s.state for s in view.steps] == ["done", "dead", "waiting"]
    assert view.steps[1].failure["dead"] == "permanent" and "boom 5" in view.steps[1].failure["error"]
    shown = cli(namespace, redis_url, "workflow", "show", wid)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["failed"] == ["workflowapp.boom"]

    (tmp_path / "fixed-5").write_text("")
    replayed = cli(namespace, redis_url, "dead", "replay", view.steps[1].job_id)
    assert replayed.returncode == 0, replayed.stderr
    view = settled(wf, wid)
    assert [s.result for s in view.steps] == [1, 5, 15]
    assert runs(tmp_path, view.steps[2].job_id) == 1


def test_a_step_whose_job_is_gone_shows_the_workflow_stuck_with_the_remedy(served: Served) -> None:
    wf, namespace, redis_url = served.wf, served.namespace, served.redis_url
    wid = ringfence.chain(wf.boom.s(n=9), wf.add.s(x=1)).enqueue()
    view = settled(wf, wid, "failed")
    assert view.stuck == []
    deleted = cli(namespace, redis_url, "dead", "delete", view.steps[0].job_id)
    assert deleted.returncode == 0, deleted.stderr
    shown = cli(namespace, redis_url, "workflow", "show", wid)
    assert shown.returncode == 0, shown.stderr
    found = orjson.loads(shown.stdout)
    assert found["stuck"] == ["workflowapp.boom"]
    assert f"ringfence workflow cancel {wid}" in found["remedy"]
    doctor = cli(namespace, redis_url, "doctor", "--sample-s", "0", "--json")
    assert doctor.returncode == 2, doctor.stderr
    (finding,) = [f for f in orjson.loads(doctor.stdout)["findings"]
                  if f["check"] == "workflow_stuck" and f["numbers"]["workflow"] == wid]
    assert (finding["status"], finding["numbers"]["stuck"]) == ("failure", ["workflowapp.boom"])
    assert f"ringfence workflow cancel {wid}" in finding["remedy"] and wid in finding["symptom"]


def test_chord_member_dead_fails_or_continues_by_its_policy(served: Served) -> None:
    wf, tmp_path = served.wf, served.dir
    failing = ringfence.chord([wf.add.s(x=1), wf.boom.s(n=2)], wf.total.s()).enqueue()
    going = ringfence.chord([wf.add.s(x=1), wf.boom.s(n=2)], wf.total.s(), on_member_dead="continue").enqueue()
    failed = settled(wf, failing, "failed")
    assert [s.state for s in failed.steps] == ["done", "dead", "waiting"]
    done = settled(wf, going)
    result = done.steps[2].result
    assert result["sum"] == 1 and result["inputs"][0] == 1
    assert result["inputs"][1]["dead"] == "permanent" and result["inputs"][1]["job"] == done.steps[1].job_id
    assert runs(tmp_path, done.steps[2].job_id) == 1 and runs(tmp_path, failed.steps[2].job_id) == 0


def test_a_result_the_next_step_cannot_take_fails_the_workflow_naming_it(served: Served) -> None:
    wf = served.wf
    wid = ringfence.chain(wf.member.s(x=1), wf.total.s()).enqueue()  # total takes a list, gets 1
    view = settled(wf, wid, "failed")
    assert view.failed == ["workflowapp.total"]
    assert view.steps[1].failure["dead"] == "bad_payload" and "previous" in view.steps[1].failure["error"]


def test_cancel_stops_waiting_steps_and_tells_the_running_one(served: Served) -> None:
    wf, tmp_path, namespace, redis_url = served.wf, served.dir, served.namespace, served.redis_url
    wid = ringfence.chain(wf.slow.s(seconds=20), wf.add.s(x=1)).enqueue()
    first = f"{wid}.0"
    wait_until(lambda: runs(tmp_path, first) == 1)
    out = cli(namespace, redis_url, "workflow", "cancel", wid)
    assert out.returncode == 0, out.stderr
    assert first in out.stdout
    wait_until(lambda: runs(tmp_path, first, "cancelled") == 1)
    view = wf.app.workflow(wid)
    assert view is not None and view.state == "cancelled"
    assert [s.state for s in view.steps] == ["queued", "waiting"]
    assert runs(tmp_path, f"{wid}.1") == 0
    again = cli(namespace, redis_url, "workflow", "show", "nope")
    assert again.returncode == 2 and "no workflow 'nope'" in again.stderr
    finished = ringfence.chain(wf.add.s(x=1)).enqueue()
    settled(wf, finished)
    refused = cli(namespace, redis_url, "workflow", "cancel", finished)
    assert refused.returncode == 2 and "is done already" in refused.stderr


def test_bad_workflows_are_refused_with_one_clear_error(wf: ModuleType, rdb: redis.Redis, namespace: str) -> None:
    with pytest.raises(ConfigError, match="'previous' is the result"):
        ringfence.chain(wf.add.s(x=1), wf.add.s(x=1, previous=3)).enqueue()
    with pytest.raises(ConfigError, match=r"a workflow step is task\.s"):
        ringfence.chain(wf.add.s(x=1), "add").enqueue()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_member_dead"):
        ringfence.chord([wf.add.s(x=1)], wf.total.s(), on_member_dead="ignore")
    with pytest.raises(ringfence.PayloadError):
        ringfence.chain(wf.add.s(x="one")).enqueue()
    with pytest.raises(ConfigError, match="needs 'previous' but no step comes before it"):
        ringfence.chain(wf.total.s(), wf.add.s(x=1)).enqueue()
    with pytest.raises(ConfigError, match="a workflow step takes no delay_s"):
        ringfence.chain(wf.add.with_options(delay_s=5).s(x=1)).enqueue()
    with pytest.raises(ConfigError, match="business_id=''"):
        ringfence.chain(wf.add.s(x=1)).enqueue(business_id="")
    with pytest.raises(ConfigError, match="result_ttl_s"):
        ringfence.chain(wf.add.s(x=1)).enqueue(result_ttl_s=-1)
    with pytest.raises(ConfigError, match="at least one step"):
        ringfence.group([])
    assert not list(rdb.scan_iter(f"{namespace}:*wf:*"))  # nothing stored


async def test_aenqueue_stores_the_workflow_and_queues_only_its_first_steps(wf: ModuleType) -> None:
    wid = await ringfence.chord([wf.member.s(x=1), wf.member.s(x=2)], wf.total.s()).aenqueue(business_id="b:1")
    view = wf.app.workflow(wid)
    assert view is not None and view.state == "running" and view.business_id == "b:1"
    assert [s.state for s in view.steps] == ["queued", "queued", "waiting"]
    assert [wf.app.broker.job_state("wf", s.job_id) for s in view.steps] == ["pending", "pending", None]


async def test_a_start_redis_does_not_take_raises_ringfence_error() -> None:
    """Redis unreachable before the start is stored: the caller gets CannotConnect naming the workflow's start
    (it may retry), not redis-py's error."""
    app = ringfence.App(f"redis://127.0.0.1:{free_port()}/0", "wfdown")
    try:
        step = app.task(name="step")(lambda ctx: None)
        with pytest.raises(CannotConnect, match=r"workflow \S+ start"):
            ringfence.chain(step.s(), step.s()).enqueue()
        with pytest.raises(CannotConnect, match=r"workflow \S+ start"):
            await ringfence.group([step.s(), step.s()]).aenqueue()
    finally:
        app.close()


def test_an_attempt_whose_lease_moved_on_acks_no_step(make_app, rdb: redis.Redis) -> None:
    """advance.lua and wf_ack.lua share their ack (_ack_step.lua): an attempt whose lease lapsed and whose job was
    fetched again acks nothing, queues nothing and records no completion; the attempt holding the lease does."""
    app = make_app()

    @app.task(name="wfl.first", queue="wfl")
    def first(ctx: Any) -> int:
        return 1

    @app.task(name="wfl.second", queue="wfl")
    def second(ctx: Any, previous: int) -> None: ...

    b = app.broker
    wid = ringfence.chain(first.s(), second.s()).enqueue()

    def fetch_twice(queue: str) -> str:
        """The id of the job fetched by a lease that lapses ("lapsed"), recovered, then fetched again ("holder")."""
        [(job_id, _, _)] = b.run(b.fetch(queue, 1, b.clock() - 1, "lapsed"))
        assert b.run(b.recover(queue)) == [job_id]
        [(again, _, attempt)] = b.run(b.fetch(queue, 1, b.clock() + 60_000, "holder"))
        assert (again, attempt) == (job_id, 2)
        return job_id

    job_id = fetch_twice("wfl")
    stats = b.keys.queue("wfl").stats
    assert b.run(workflows.advance(b, "wfl", job_id, "lapsed", wid, 0, b"1"))[0] == -1
    assert b.queue_counts("wfl")["pending"] == 0 and not rdb.hget(stats, "processed")
    assert b.run(workflows.advance(b, "wfl", job_id, "holder", wid, 0, b"1"))[0] == 1  # the second step queued
    assert int(rdb.hget(stats, "processed")) == 1

    plain = app.task(name="wfl.other", queue="wfl_other")(lambda ctx: None)
    plain.enqueue()
    job_id = fetch_twice("wfl_other")
    back = workflows.Back("wfl", wid, 1, "d", "null")

    def recorded() -> list[bytes]:
        return [m for k in rdb.scan_iter(f"{app.namespace}:*wf-back") for m in rdb.zrange(k, 0, -1)]

    assert b.run(workflows.step_ack(b, "wfl_other", job_id, "lapsed", back)) == -1
    assert recorded() == []
    assert b.run(workflows.step_ack(b, "wfl_other", job_id, "holder", back)) == 0
    assert recorded() == [job_id.encode()]
