"""A job dead-lettered while an earlier attempt of it, whose lease lapsed, still runs its handler (a sync thread
that cannot be stopped) holding a step ``claimed``: the dead-letter sweep must fence that step out, so the old run
can no longer move it to ``calling`` and charge behind a dead job that does not name it. The chaos run's doomed
orders left ``calling`` this way. Deterministic at fault points: the next attempt's sweep runs right where the old
run has captured the step (``after_capture``). A real private redis-server, SQLite and PostgreSQL fence stores."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringfence import App, WorkerSettings
from ringfence.errors import FencedOut
from ringfence.fence import Fences, FenceState, Owner
from ringfence.models import Fetched
from ringfence.redis.embedded import EmbeddedRedis
from ringfence.worker.fencing import Fencing
from support import at_point, database_url

SETTINGS = WorkerSettings(lease_s=2.0, heartbeat_s=0.5)


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[App]:
    a = App(private_redis.url, f"t{uuid.uuid4().hex[:8]}", environment="test",
            fence_url=database_url(request.param, tmp_path), worker=SETTINGS)
    a.fence_store.create_all()
    try:
        yield a
    finally:
        a.close()


def subject() -> str:
    return f"order:{uuid.uuid4().hex[:12]}"  # the PostgreSQL table is shared with other tests


def sweep(app: App, job_id: str, token: str) -> tuple[list[str], bool] | None:
    """The attempt now holding the job is refused at fetch and dead-lettered: its sweep over the job's steps."""
    fencing = Fencing(app, app.broker, SETTINGS)
    return asyncio.run(fencing.leaving(Fetched(job_id, "default", b"", 4, token, 0)))


def old_run(app: App, job_id: str, where: str, charges: list[str],
            on_capture: Callable[[str], None]) -> Exception | None:
    """An earlier attempt (token ``old``, no lease in Redis any more) that captures the step, then charges."""
    fences = Fences(app.fence_store, Owner(job_id, "old", lease_s=30.0, alive=Fencing(app, app.broker, SETTINGS).alive))
    try:
        with at_point("after_capture", on_capture), fences.open(where, "charge", params={"amount": 5}) as step:
            step.effect(lambda: charge(charges))
    except FencedOut as exc:
        return exc
    return None


def charge(charges: list[str]) -> str:
    charges.append("ch_1")
    return "ch_1"


def test_sweep_fences_out_a_claimed_step_of_a_lapsed_attempt(app: App) -> None:
    app.broker.register_queues(["default"])
    job, where = f"job-{uuid.uuid4().hex[:8]}", subject()
    charges: list[str] = []
    swept: list[tuple[list[str], bool] | None] = []
    error = old_run(app, job, where, charges, lambda _point: swept.append(sweep(app, job, "attempt-4")))
    assert swept == [([], False)]  # nothing past capture: the job dies naming no step (nothing left the network)
    assert charges == []  # the old run did not charge behind the dead job
    assert isinstance(error, FencedOut)
    row = app.fence_store.get(where, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and row.epoch == 2
    assert (row.owner_job_id, row.owner_token, row.lease_live) == (job, "attempt-4", False)
    assert app.fence_store.owned(job, in_doubt=True) == []  # nothing for the doctor to count as owner_gone


def test_sweep_leaves_a_claimed_step_of_a_live_attempt_alone(app: App) -> None:
    """Another attempt of the job holding a live lease keeps its step: it is running, not lapsed."""
    job, where = f"job-{uuid.uuid4().hex[:8]}", subject()
    app.broker.register_queues(["default"])
    fencing = Fencing(app, app.broker, SETTINGS)
    fencing.alive = lambda job_id, token: token == "live"  # type: ignore[method-assign]
    live = Owner(job, "live", lease_s=30.0, alive=fencing.alive)
    with Fences(app.fence_store, live).open(where, "charge", params={"amount": 5}) as step:
        assert asyncio.run(fencing.leaving(Fetched(job, "default", b"", 4, "attempt-4", 0))) == ([], False)
        assert step.effect(lambda: "ch_2") == "ch_2"
    row = app.fence_store.get(where, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 1
