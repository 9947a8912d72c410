"""The sync path's statements at libpq (``pgwire.Wire.call``): how often a statement lets go of the interpreter."""

from __future__ import annotations

from typing import Any

import pytest
from fence_helpers import Backend, OwnerFactory, Provider
from test_fence_wire import one_job

from ringfence.fence import FenceStore

# libpq calls psycopg makes without the interpreter lock: each one hands the lock to a waiting thread
NOGIL_STEPS = {"send_query_prepared", "send_prepare", "is_busy", "consume_input", "flush", "get_result"}


class _Spy:
    """A libpq connection that records the names of the calls made on it."""

    def __init__(self, pg: Any, calls: list[str]) -> None:
        self._pg, self._calls = pg, calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pg, name)
        if not callable(attr):
            return attr

        def called(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(name)
            return attr(*args, **kwargs)

        return called


@pytest.fixture
def pg_store(backend: Backend, url_store: FenceStore) -> FenceStore:
    if backend.name != "postgresql":
        pytest.skip("pgwire is psycopg's")
    return url_store


def test_a_prepared_sync_statement_is_one_blocking_libpq_call(pg_store: FenceStore, subject: str,
                                                              provider: Provider, make_owner: OwnerFactory) -> None:
    """Once the kept connection has prepared the fence's statements, each of a strict step's four statements is one
    ``exec_prepared`` (the interpreter let go once per round trip), not the non-blocking send / wait / read
    sequence that lets go of it in each libpq call: in a worker with ten job threads every such hand-over was a
    context switch. The step still completes."""
    one_job(pg_store, make_owner(), f"{subject}-warm", provider)  # prepares the four statements
    direct = pg_store.direct
    assert direct is not None and direct._idle
    calls: list[str] = []
    real = {id(c): c.wire.pg for c in direct._idle if c.wire is not None}
    for c in direct._idle:
        assert c.wire is not None
        c.wire.pg = _Spy(c.wire.pg, calls)
    try:
        one_job(pg_store, make_owner(), subject, provider)
    finally:
        for c in direct._idle:
            if c.wire is not None and id(c) in real:
                c.wire.pg = real[id(c)]
    assert calls.count("exec_prepared") == 4, calls
    assert not NOGIL_STEPS & set(calls), calls
    row = pg_store.get(subject, "charge")
    assert row is not None and row.state.value == "completed"
