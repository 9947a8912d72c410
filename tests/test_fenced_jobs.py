"""Fenced jobs in real worker processes, killed with SIGKILL at each fault point, on every database."""

from __future__ import annotations

import importlib
import os

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select

from ringfence.cli import main as cli
from support import DATABASES, database_url, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(params=list(DATABASES))
def fence_url(request, tmp_path) -> str:
    return database_url(request.param, tmp_path)


@pytest.fixture
def fapp(fence_url, redis_url, namespace, tmp_path):
    os.environ.update(RINGFENCE_NAMESPACE=namespace, RINGFENCE_REDIS_URL=redis_url, FENCE_URL=fence_url,
                      FENCE_PROVIDER_DB=str(tmp_path / "provider.db"))  # the workers' FakeProvider file
    import fenceapp

    mod = importlib.reload(fenceapp)
    mod.app.fence_store.create_all()
    from ringfence.fence import create_all

    create_all(mod.engine())
    mod.md.create_all(mod.engine())
    with mod.engine().begin() as c:
        c.execute(insert(mod.orders), [{"id": i} for i in range(1, 4)])
    yield mod
    mod.md.drop_all(mod.engine())
    mod.engine().dispose()


def state(mod, order_id: int):
    n = sum(1 for c in mod.provider.records() if c.order == order_id)  # charges made at the provider
    with mod.engine().connect() as c:
        ref = c.execute(select(mod.orders.c.charge_id).where(mod.orders.c.id == order_id)).scalar()
    row = mod.app.fence_store.get(f"{mod.ns}:order:{order_id}", "charge")
    return n, ref, row


def run_with_kill(mod, spawn_worker, fence_url, task, fault: str) -> str:
    job = task.enqueue(order_id=1, amount=500)
    first = spawn_fence_worker(spawn_worker, fence_url, fault)
    assert first.wait(30) == -9, first.output()  # SIGKILLed at the fault point
    spawn_fence_worker(spawn_worker, fence_url)
    return job


def spawn_fence_worker(spawn_worker, fence_url, fault: str | None = None):
    return spawn_worker("--app", "fenceapp:app", env={"FENCE_URL": fence_url, "RINGFENCE_FAULTS": fault or ""})


@pytest.mark.parametrize("fault", ["after_capture", "after_effect", "after_record", "before_commit"])
def test_sigkill_at_each_fault_point_gives_one_charge(fapp, spawn_worker, fence_url, fault) -> None:
    run_with_kill(fapp, spawn_worker, fence_url, fapp.charge_dedup, fault)
    wait_until(lambda: fapp.app.broker.queue_counts("default")["stats"].get("processed") == 1, timeout=40)
    n, ref, row = state(fapp, 1)
    assert n == 1, f"{n} charges after a kill at {fault}"
    assert ref is not None and row.reference == ref and str(row.state) == "completed"
    assert row.epoch == 2  # the rerun took the fence over from the dead attempt


def test_async_handler_killed_after_the_providers_200(fapp, spawn_worker, fence_url) -> None:
    run_with_kill(fapp, spawn_worker, fence_url, fapp.charge_async, "after_effect")
    wait_until(lambda: fapp.app.broker.queue_counts("default")["stats"].get("processed") == 1, timeout=40)
    n, ref, row = state(fapp, 1)
    assert n == 1 and row.reference == ref and str(row.state) == "completed"


def test_in_doubt_without_dedup_parks_then_a_person_resolves(fapp, spawn_worker, fence_url) -> None:
    job = run_with_kill(fapp, spawn_worker, fence_url, fapp.charge_strict, "after_effect")
    wait_until(lambda: fapp.app.broker.queue_counts("default")["dead"] == 1, timeout=40)
    n, ref, row = state(fapp, 1)
    assert n == 1 and ref is None and str(row.state) == "in_doubt"  # never re-executed blindly
    # The row follows the Redis dead-letter (worker/durable.py).
    [durable] = wait_until(lambda: fapp.app.failed_jobs.unreplayed([job]), timeout=20)
    assert durable["reason"] == "in_doubt" and durable["queue"] == "default"
    env = {"RINGFENCE_APP": "fenceapp:app", "FENCE_URL": fence_url}
    subject = f"{fapp.ns}:order:1"
    res = CliRunner().invoke(cli, ["fence", "resolve", subject, "charge", "--done"], env=env)
    assert res.exit_code == 2 and "--reference" in res.output
    [provider_ref] = fapp.provider.charges  # the one charge made
    res = CliRunner().invoke(cli, ["fence", "resolve", subject, "charge", "--done", "--reference", provider_ref],
                             env=env)
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["dead", "replay", job], env=env)
    assert "replayed 1" in res.output
    wait_until(lambda: fapp.app.broker.queue_counts("default")["stats"].get("processed") == 1, timeout=30)
    n, ref, row = state(fapp, 1)
    assert n == 1 and ref == provider_ref and str(row.state) == "completed"


def test_replay_from_failed_jobs_after_redis_lost_everything(fapp, spawn_worker, fence_url, rdb) -> None:
    @fapp.app.task(name="fails_once_permanently")
    def nope(ctx, order_id: int) -> None: ...

    job = run_with_kill(fapp, spawn_worker, fence_url, fapp.charge_strict, "after_effect")
    wait_until(lambda: fapp.app.broker.queue_counts("default")["dead"] == 1, timeout=40)
    wait_until(lambda: fapp.app.failed_jobs.unreplayed([job]), timeout=20)  # written right after the Redis copy
    # Redis loses its data (no persistence, a flush, a failover).
    keys = list(rdb.scan_iter(f"{fapp.ns}:*"))
    rdb.delete(*keys)
    env = {"RINGFENCE_APP": "fenceapp:app", "FENCE_URL": fence_url}
    CliRunner().invoke(cli, ["fence", "resolve", f"{fapp.ns}:order:1", "charge", "--not-done"], env=env)
    res = CliRunner().invoke(cli, ["dead", "replay", "--reason", "in_doubt"], env=env)
    assert "restored from the failed_jobs table" in res.output, res.output
    assert fapp.app.broker.job_spec("default", job) is not None
    wait_until(lambda: state(fapp, 1)[1] is not None, timeout=30)
    n, _ref, row = state(fapp, 1)
    # Resolved as "not done": the rerun called the provider again with the SAME key, which it deduplicated.
    assert n == 1 and str(row.state) == "completed"
    assert fapp.app.failed_jobs.unreplayed([job]) == []


def test_two_jobs_for_one_order_charge_once(fapp, spawn_worker, fence_url) -> None:
    ids = [fapp.charge_dedup.enqueue(order_id=2, amount=700) for _ in range(3)]
    spawn_fence_worker(spawn_worker, fence_url)
    spawn_fence_worker(spawn_worker, fence_url)
    wait_until(lambda: fapp.app.broker.queue_counts("default")["stats"].get("processed", 0) == len(ids), timeout=40)
    n, ref, row = state(fapp, 2)
    assert n == 1 and row.reference == ref


def test_same_key_different_params_is_a_conflict(fapp, spawn_worker, fence_url) -> None:
    fapp.charge_dedup.enqueue(order_id=3, amount=100)
    spawn_fence_worker(spawn_worker, fence_url)
    wait_until(lambda: fapp.app.broker.queue_counts("default")["stats"].get("processed") == 1, timeout=30)
    conflicting = fapp.charge_dedup.enqueue(order_id=3, amount=999)
    wait_until(lambda: fapp.app.broker.queue_counts("default")["dead"] == 1, timeout=30)
    [d] = wait_until(lambda: fapp.app.failed_jobs.unreplayed([conflicting]), timeout=20)
    assert d["reason"] == "permanent" and "FenceConflict" in d["error"]
    n, _, row = state(fapp, 3)
    assert n == 1 and row.params_hash and str(row.state) == "completed"

