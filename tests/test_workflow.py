"""Workflows on real worker processes and a real Redis: a chain's results flow, a chord's callback runs once with
its members' results in order, a dead step fails the workflow and `ringfence dead replay` resumes it, cancel stops
what has not started, and a finished workflow expires."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
import redis

import ringfence
from ringfence import ConfigError
from support import ROOT, WorkerProc, wait_until


@pytest.fixture
def wf(namespace: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """tests/workflowapp.py imported on this test's namespace, its runs recorded under tmp_path."""
    monkeypatch.setenv("RINGFENCE_NAMESPACE", namespace)
    monkeypatch.setenv("RINGFENCE_REDIS_URL", redis_url)
    monkeypatch.setenv("WF_DIR", str(tmp_path))
    sys.modules.pop("workflowapp", None)
    module = importlib.import_module("workflowapp")
    yield module
    module.app.close()
    sys.modules.pop("workflowapp", None)


def runs(tmp_path: Path, job_id: str, kind: str = "ran") -> int:
    return sum(1 for p in tmp_path.iterdir() if p.name.startswith(job_id + ".") and p.name.endswith("." + kind))


def worker(spawn_worker: Callable[..., WorkerProc], tmp_path: Path, faults: str = "") -> WorkerProc:
    return spawn_worker("--app", "workflowapp:app", env={"WF_DIR": str(tmp_path), "RINGFENCE_FAULTS": faults})


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


def test_chain_then_chord_results_flow_and_each_step_runs_once(wf: ModuleType, tmp_path: Path, rdb: redis.Redis,
                                                                spawn_worker: Callable[..., WorkerProc]) -> None:
    wid = ringfence.chain(wf.add.s(x=1), wf.add.s(x=2),
                          ringfence.chord([wf.add.s(x=10), wf.add.s(x=20), wf.add.s(x=30)], wf.total.s())).enqueue()
    worker(spawn_worker, tmp_path)
    view = settled(wf, wid)
    assert [s.result for s in view.steps] == [1, 3, 13, 23, 33, {"sum": 69, "inputs": [13, 23, 33]}]
    assert [s.after for s in view.steps] == [[], [0], [1], [1], [1], [2, 3, 4]]
    assert all(runs(tmp_path, s.job_id) == 1 for s in view.steps)
    key = f"{wf.app.namespace}:{{{wf.app.namespace}:wf}}:wf:{wid}"
    assert 0 < rdb.pttl(key) <= 86_400_000  # kept result_ttl_s (a day) once finished
    assert rdb.hlen(f"{wf.app.namespace}:{{{wf.app.namespace}:wf}}:jobs") == 0


def test_finished_workflow_expires_after_its_result_ttl(wf: ModuleType, tmp_path: Path,
                                                       spawn_worker: Callable[..., WorkerProc]) -> None:
    wid = ringfence.chain(wf.add.s(x=1)).enqueue(result_ttl_s=1)
    worker(spawn_worker, tmp_path)
    settled(wf, wid)
    wait_until(lambda: wf.app.workflow(wid) is None, timeout=10)


def test_dead_step_fails_the_workflow_and_replay_resumes_it(wf: ModuleType, tmp_path: Path, namespace: str,
                                                            redis_url: str,
                                                            spawn_worker: Callable[..., WorkerProc]) -> None:
    wid = ringfence.chain(wf.add.s(x=1), wf.boom.s(n=5), wf.add.s(x=10)).enqueue()
    worker(spawn_worker, tmp_path)
    view = settled(wf, wid, "failed")
    assert view.failed == ["workflowapp.boom"]
    assert [s.state for s in view.steps] == ["done", "dead", "waiting"]
    assert view.steps[1].failure["dead"] == "permanent" and "boom 5" in view.steps[1].failure["error"]
    shown = cli(namespace, redis_url, "workflow", "show", wid)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["failed"] == ["workflowapp.boom"]

    (tmp_path / "fixed").write_text("")
    replayed = cli(namespace, redis_url, "dead", "replay", view.steps[1].job_id)
    assert replayed.returncode == 0, replayed.stderr
    view = settled(wf, wid)
    assert [s.result for s in view.steps] == [1, 5, 15]
    assert runs(tmp_path, view.steps[2].job_id) == 1


def test_chord_member_dead_fails_or_continues_by_its_policy(wf: ModuleType, tmp_path: Path,
                                                            spawn_worker: Callable[..., WorkerProc]) -> None:
    failing = ringfence.chord([wf.add.s(x=1), wf.boom.s(n=2)], wf.total.s()).enqueue()
    going = ringfence.chord([wf.add.s(x=1), wf.boom.s(n=2)], wf.total.s(), on_member_dead="continue").enqueue()
    worker(spawn_worker, tmp_path)
    failed = settled(wf, failing, "failed")
    assert [s.state for s in failed.steps] == ["done", "dead", "waiting"]
    done = settled(wf, going)
    result = done.steps[2].result
    assert result["sum"] == 1 and result["inputs"][0] == 1
    assert result["inputs"][1]["dead"] == "permanent" and result["inputs"][1]["job"] == done.steps[1].job_id
    assert runs(tmp_path, done.steps[2].job_id) == 1 and runs(tmp_path, failed.steps[2].job_id) == 0


def test_cancel_stops_waiting_steps_and_tells_the_running_one(wf: ModuleType, tmp_path: Path, namespace: str,
                                                              redis_url: str,
                                                              spawn_worker: Callable[..., WorkerProc]) -> None:
    wid = ringfence.chain(wf.slow.s(seconds=20), wf.add.s(x=1)).enqueue()
    worker(spawn_worker, tmp_path)
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


def test_bad_workflows_are_refused_with_one_clear_error(wf: ModuleType, rdb: redis.Redis, namespace: str) -> None:
    with pytest.raises(ConfigError, match="one queue"):
        ringfence.chain(wf.add.s(x=1), wf.elsewhere.s()).enqueue()
    with pytest.raises(ConfigError, match="'previous' is the result"):
        ringfence.chain(wf.add.s(x=1), wf.add.s(x=1, previous=3)).enqueue()
    with pytest.raises(ConfigError, match=r"a workflow step is task\.s"):
        ringfence.chain(wf.add.s(x=1), "add").enqueue()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_member_dead"):
        ringfence.chord([wf.add.s(x=1)], wf.total.s(), on_member_dead="ignore")
    with pytest.raises(ringfence.PayloadError):
        ringfence.chain(wf.add.s(x="one")).enqueue()
    assert not list(rdb.scan_iter(f"{namespace}:*wf:*"))  # nothing stored


async def test_aenqueue_stores_the_workflow_and_queues_only_its_first_steps(wf: ModuleType) -> None:
    wid = await ringfence.chord([wf.member.s(x=1), wf.member.s(x=2)], wf.total.s()).aenqueue(business_id="b:1")
    view = wf.app.workflow(wid)
    assert view is not None and view.state == "running" and view.business_id == "b:1"
    assert [s.state for s in view.steps] == ["queued", "queued", "waiting"]
    assert [wf.app.broker.job_state("wf", s.job_id) for s in view.steps] == ["pending", "pending", None]
