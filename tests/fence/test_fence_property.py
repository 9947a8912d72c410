"""Property: any interleaving of kills at the fault points, over many keys, never charges twice.

A kill is simulated in-process (``faults.SimulatedKill`` raised at the point, skipping every
cleanup, as SIGKILL would). Each key is retried by fresh attempts (the broker says the
killed one is dead) until a run finishes or parks the key in doubt.
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from typing import Any

import sqlalchemy as sa
from fence_helpers import Backend, Provider
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringfence import faults
from ringfence.errors import InDoubt
from ringfence.fence import NOT_HAPPENED, Fences, FenceState, Owner
from support import kill_at

MODES = ("dedup", "reconcile", "none")
KILLS = st.lists(st.sampled_from(faults.POINTS), max_size=4)
PLANS = st.lists(st.tuples(st.sampled_from(MODES), KILLS), min_size=1, max_size=6)


def options(mode: str, provider: Provider) -> dict[str, Any]:
    if mode == "dedup":
        return {"provider_dedup": True, "key_window_s": 3600}
    if mode == "reconcile":
        return {"reconcile": lambda key, req: provider.lookup(key) or NOT_HAPPENED}
    return {}


def attempt(b: Backend, subject: str, provider: Provider, mode: str, kill: str | None) -> None:
    owner = Owner("job-" + subject, uuid.uuid4().hex, lease_s=60, alive=lambda j, t: False)
    with kill_at(kill) if kill else nullcontext(), \
            Fences(b.store, owner).open(subject, "charge", params={"s": subject},
                                        **options(mode, provider)) as step:
        if step.done:
            return
        # Only a step that declares provider_dedup may rely on the provider honouring the key.
        ref = step.effect(lambda: provider.charge(1, idempotency_key=step.key, dedup=mode == "dedup"))
        with step.complete(b.engine, result={"ref": ref}) as conn:
            conn.execute(b.orders.insert().values(id=subject, charge_id=ref))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans=PLANS, data=st.data())
def test_kills_never_double_an_effect(backend: Backend, plans: list[tuple[str, list[str]]],
                                      data: st.DataObject) -> None:
    provider = Provider()
    run = uuid.uuid4().hex[:8]
    subjects = [f"prop:{run}:{i}" for i in range(len(plans))]
    pending = {i: [*kills, None] for i, (_, kills) in enumerate(plans)}  # the last attempt is clean
    while pending:
        i = data.draw(st.sampled_from(sorted(pending)), label="next key")  # interleave keys
        kill = pending[i].pop(0)
        try:
            attempt(backend, subjects[i], provider, plans[i][0], kill)
        except faults.SimulatedKill:
            if pending[i]:
                continue
        except InDoubt:
            pass
        del pending[i]

    per_key = {s: 0 for s in subjects}
    for key in provider.charges.values():
        per_key[next(s for s in subjects if backend.store.get(s, "charge").provider_key == key)] += 1
    with backend.engine.connect() as conn:
        orders = dict(conn.execute(sa.select(backend.orders.c.id, backend.orders.c.charge_id)
                                   .where(backend.orders.c.id.in_(subjects))).all())
    for s, (mode, _) in zip(subjects, plans, strict=True):
        row = backend.store.get(s, "charge")
        assert row is not None and row.state in (FenceState.COMPLETED, FenceState.IN_DOUBT)
        assert per_key[s] <= 1  # never a second effect
        if mode != "none":  # replay or reconcile always settles the doubt
            assert row.state is FenceState.COMPLETED and per_key[s] == 1
        if row.state is FenceState.COMPLETED:
            assert per_key[s] == 1 and orders.get(s) == row.reference  # local write exactly once
        else:
            assert s not in orders
