"""The thread hop of a sync effect in an ``async with`` fence (offloop.py): to_thread's semantics at less CPU."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Iterator

import pytest
from fence_helpers import Backend, OwnerFactory, Provider

from ringfence.fence import Fences, FenceState
from ringfence.offloop import MAX_IDLE, Hop

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")


async def test_a_sync_effect_runs_on_the_fence_hop_and_the_step_completes(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    seen: list[str] = []

    def charge() -> str:
        seen.append(threading.current_thread().name)
        return provider.charge(5, idempotency_key="k")

    async with Fences(backend.store, make_owner()).open(subject, "charge", params={"amount": 5}) as step:
        ref = await step.effect(charge)
        async with step.complete(backend.store.engine, result={"ref": ref}):
            pass
    assert seen and seen[0].startswith("ringfence-effect_")  # not the loop's default executor (asyncio_N)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.reference == ref


async def test_a_blocking_effect_never_delays_another(backend: Backend, subject: str, provider: Provider,
                                                      make_owner: OwnerFactory) -> None:
    """Effect A blocks until effect B has run: B must get a thread of its own while A holds one."""
    b_ran = threading.Event()

    def a() -> str:
        assert b_ran.wait(10), "B waited behind A"
        return "ref-a"

    def b() -> str:
        b_ran.set()
        return "ref-b"

    async def job(s: str, fn: object) -> str:
        async with Fences(backend.store, make_owner()).open(s, "charge") as step:
            ref = await step.effect(fn)  # type: ignore[arg-type]
            async with step.complete(backend.store.engine):
                pass
            return ref

    assert await asyncio.gather(job(f"{subject}-a", a), job(f"{subject}-b", b)) == ["ref-a", "ref-b"]


async def test_the_hop_keeps_to_threads_semantics() -> None:
    hop = Hop("test-hop")
    where.set("caller")
    assert await hop.run(where.get) == "caller"  # the caller's context variables

    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await hop.run(boom)
    with pytest.raises(RuntimeError):
        await hop.run(lambda: next(iter(())))  # StopIteration: a future refuses it, to_thread would hang
    release, done = threading.Event(), threading.Event()

    def slow() -> int:
        release.wait(10)
        done.set()
        return 1

    task = asyncio.ensure_future(hop.run(slow))
    await asyncio.sleep(0.01)
    task.cancel()  # the caller stops waiting; the call runs on
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert done.wait(10)
    assert await hop.run(lambda: 2) == 2


async def test_idle_threads_are_bounded() -> None:
    """Threads beyond MAX_IDLE idle ones end once they waited ``idle_s`` for a call."""
    hop = Hop("test-idle", idle_s=0.05)
    gate = threading.Event()
    calls = [hop.run(gate.wait, 10) for _ in range(MAX_IDLE + 4)]
    tasks = [asyncio.ensure_future(c) for c in calls]
    await asyncio.sleep(0.05)
    assert hop._started == MAX_IDLE + 4  # every blocked call got a thread of its own
    gate.set()
    assert all(await asyncio.gather(*tasks))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sum(t.name.startswith("test-idle") for t in threading.enumerate()) > MAX_IDLE:
        await asyncio.sleep(0.01)
    assert sum(t.name.startswith("test-idle") for t in threading.enumerate()) == MAX_IDLE
    assert hop._idle == MAX_IDLE


async def test_more_calls_at_once_than_max_idle_start_no_thread_after_the_first_round() -> None:
    """A worker running more async jobs at once than MAX_IDLE: the threads of the first round serve the next ones
    (ending a thread as soon as MAX_IDLE others were idle started one for most hops)."""
    hop = Hop("test-churn")
    n = MAX_IDLE + 4
    for _ in range(3):
        gate = threading.Barrier(n)  # every call of a round runs at once, each on a thread of its own
        assert all(await asyncio.gather(*[hop.run(lambda g=gate: g.wait(10) >= 0) for _ in range(n)]))
        await asyncio.sleep(0.05)  # every thread is back waiting
    assert hop._started == n
    assert hop._idle == n


async def test_an_idle_hop_thread_keeps_nothing_of_its_last_call() -> None:
    import gc
    import weakref

    class Value:
        pass

    hop = Hop("test-ref")
    ref = weakref.ref(await hop.run(Value))
    await asyncio.sleep(0.05)  # the thread is back waiting for a call
    gc.collect()
    assert ref() is None


async def test_a_sync_hook_and_a_blocking_context_manager_take_the_same_hop() -> None:
    """call_off_loop (a sync reconcile hook) and in_thread (a sync completion) run on the effects' hop threads,
    with the caller's context variables, not on the loop's default executor."""
    from contextlib import contextmanager

    from ringfence.offloop import call_off_loop, in_thread

    where.set("hook-caller")
    seen: list[tuple[str, str]] = []

    def hook() -> str:
        seen.append((threading.current_thread().name, where.get()))
        return "ok"

    @contextmanager
    def completion() -> Iterator[str]:
        seen.append((threading.current_thread().name, where.get()))
        yield "conn"
        seen.append((threading.current_thread().name, where.get()))

    assert await call_off_loop(hook) == "ok"
    async with in_thread(completion()) as conn:
        assert conn == "conn"
    assert len(seen) == 3
    assert all(name.startswith("ringfence-effect_") and value == "hook-caller" for name, value in seen), seen
