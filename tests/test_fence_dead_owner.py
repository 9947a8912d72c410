"""A job that leaves the queue while it owns a step past capture never hides the effect: real worker processes
SIGKILLed right after the provider's answer on every attempt, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from ringfence.cli import main as cli
from ringfence.fence import FenceState
from support import wait_until
from test_fenced_jobs import fapp, fence_url, spawn_fence_worker, state  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def killed_after_effect(spawn_worker, fence_url) -> None:  # noqa: F811
    w = spawn_fence_worker(spawn_worker, fence_url, "after_effect")
    assert w.wait(30) == -9, w.output()  # SIGKILLed between the provider's answer and its record


def dead_record(mod, job: str) -> dict:
    [(_, raw)] = mod.app.broker.dead_records("default", [job])
    return dict(orjson.loads(raw))


def cli_json(mod, fence_url: str, *args: str) -> tuple[int, dict]:  # noqa: F811
    env = {"RINGFENCE_APP": "fenceapp:app", "FENCE_URL": fence_url}
    res = CliRunner().invoke(cli, [*args, "--json"], env=env)
    return res.exit_code, orjson.loads(res.output)


def ours(mod, items: list[dict]) -> list[dict]:
    """Findings about this test's subjects (the server databases' fence table is shared with other tests)."""
    return [i for i in items if i["subject"].startswith(f"{mod.ns}:")]


def doctor_finding(mod, fence_url: str, check: str) -> dict:  # noqa: F811
    code, doctor = cli_json(mod, fence_url, "doctor", "--sample-s", "0.1")
    assert code == 2
    [found] = [f for f in doctor["findings"] if f["check"] == check]
    assert found["status"] == "failure"
    return found


def test_orphaned_to_max_attempts_ends_in_doubt_naming_the_job(fapp, spawn_worker, fence_url) -> None:  # noqa: F811
    job = fapp.charge_dedup.with_options(max_attempts=1).enqueue(order_id=1, amount=500)
    killed_after_effect(spawn_worker, fence_url)  # attempt 1
    killed_after_effect(spawn_worker, fence_url)  # attempt 2 > max_attempts: the settling run replays, killed too
    spawn_fence_worker(spawn_worker, fence_url, "after_effect")  # attempt 3: dead-lettered at fetch
    wait_until(lambda: fapp.app.broker.queue_counts("default")["dead"] == 1, timeout=30)

    n, ref, row = state(fapp, 1)
    assert (n, ref) == (1, None)  # charged once (the replay used the same key); the order is not marked
    assert row.state is FenceState.IN_DOUBT and row.owner_job_id == job
    assert row.epoch == 2  # the settling run took the step over and replayed it
    rec = dead_record(fapp, job)
    assert rec["reason"] == "in_doubt"
    assert "exceeds max_attempts=1" in rec["error"]
    assert f"fence {fapp.ns}:order:1/charge was calling: the effect may have happened" in rec["error"]
    assert f"owner job {job}" in rec["error"]
    [durable] = wait_until(lambda: fapp.app.failed_jobs.unreplayed([job]), timeout=10)  # written after Redis
    assert durable["reason"] == "in_doubt" and "was calling" in durable["error"]

    code, report = cli_json(fapp, fence_url, "reconcile", "--step", "charge", "--in-doubt-older-than-min", "0")
    assert code == 1 and [r["subject"] for r in ours(fapp, report["stale_in_doubt"])] == [f"{fapp.ns}:order:1"]
    assert doctor_finding(fapp, fence_url, "in_doubt")["numbers"]["in_doubt"] >= 1


def test_settling_run_adopts_through_the_reconcile_hook(fapp, spawn_worker, fence_url) -> None:  # noqa: F811
    job = fapp.charge_hooked.with_options(max_attempts=1).enqueue(order_id=2, amount=700)
    killed_after_effect(spawn_worker, fence_url)  # attempt 1: charged, not recorded
    # Attempt 2 is past max_attempts; its settling run asks the hook, adopts the charge and completes, so the
    # after_effect fault point (reached only by a provider call) never fires again.
    spawn_fence_worker(spawn_worker, fence_url, "after_effect")
    wait_until(lambda: fapp.app.broker.queue_counts("default")["stats"].get("processed") == 1, timeout=30)
    n, ref, row = state(fapp, 2)
    assert n == 1 and ref == row.reference and row.state is FenceState.COMPLETED and row.epoch == 2
    assert fapp.app.broker.queue_counts("default")["dead"] == 0
    assert fapp.app.failed_jobs.unreplayed([job]) == []


def test_settling_run_starts_no_new_effect(fapp, spawn_worker, fence_url) -> None:  # noqa: F811
    """Without dedup or hook the settling run parks the step (the in-doubt rules); it never charges again."""
    job = fapp.charge_strict.with_options(max_attempts=1).enqueue(order_id=3, amount=300)
    killed_after_effect(spawn_worker, fence_url)
    spawn_fence_worker(spawn_worker, fence_url)
    wait_until(lambda: fapp.app.broker.queue_counts("default")["dead"] == 1, timeout=30)
    n, ref, row = state(fapp, 3)
    assert (n, ref) == (1, None) and row.state is FenceState.IN_DOUBT and row.owner_job_id == job
    assert dead_record(fapp, job)["reason"] == "in_doubt"


def test_acked_job_leaving_a_calling_step_is_reported(fapp, spawn_worker, fence_url) -> None:  # noqa: F811
    """A handler that swallows the effect's error outside the fence gets its job acked with the step still
    calling: nothing in the worker can see that, so `reconcile` and the doctor do."""
    job = fapp.charge_then_fail.enqueue(order_id=1, amount=500, mode="swallow")
    spawn_fence_worker(spawn_worker, fence_url)
    wait_until(lambda: fapp.app.broker.queue_counts("default")["stats"].get("processed") == 1, timeout=30)
    assert state(fapp, 1)[2].state is FenceState.CALLING

    code, report = cli_json(fapp, fence_url, "reconcile", "--step", "charge")
    assert code == 1
    [gone] = ours(fapp, report["owner_gone"])
    assert gone["subject"] == f"{fapp.ns}:order:1" and gone["state"] == "calling"
    assert gone["owner_job_id"] == job
    found = doctor_finding(fapp, fence_url, "owner_gone")
    assert found["numbers"]["owner_gone"] >= 1
    if found["numbers"]["owner_gone"] <= 20:
        assert f"{fapp.ns}:order:1" in [g["subject"] for g in found["numbers"]["steps"]]


def test_dead_job_names_its_effected_step(fapp, spawn_worker, fence_url) -> None:  # noqa: F811
    job = fapp.charge_then_fail.enqueue(order_id=2, amount=700, mode="permanent")
    spawn_fence_worker(spawn_worker, fence_url)
    wait_until(lambda: fapp.app.broker.queue_counts("default")["dead"] == 1, timeout=30)
    _n, _ref, row = state(fapp, 2)
    assert row.state is FenceState.EFFECTED
    rec = dead_record(fapp, job)
    assert rec["reason"] == "permanent"
    assert f"fence {fapp.ns}:order:2/charge was effected (reference '{row.reference}')" in rec["error"]
    code, report = cli_json(fapp, fence_url, "reconcile", "--step", "charge")
    assert code == 1 and [g["state"] for g in ours(fapp, report["owner_gone"])] == ["effected"]
