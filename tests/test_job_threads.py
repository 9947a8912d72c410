"""The worker's job threads (worker/calls.py) and its event loop choice (worker/worker.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from ringfence.tasks import JobContext
from ringfence.worker.calls import AsyncBounds, JobTimeout, SyncRun, SyncRunner, call_async, call_sync
from ringfence.worker.worker import run_loop


def _ctx(timeout_s: float) -> JobContext:
    return JobContext(id="j", task="t", queue="q", attempt=1, max_attempts=1, enqueued_ms=0, token="x",
                      timeout_s=timeout_s)


async def test_a_queued_call_times_out_from_its_own_start_and_results_come_back_in_batches(make_app) -> None:
    app = make_app()
    names: list[str] = []

    @app.task
    def slow(ctx: Any, seconds: float) -> str:
        names.append(threading.current_thread().name)
        time.sleep(seconds)
        return "done"

    runner = SyncRunner(1)  # one thread: the second call waits 0.4 s for it before it starts
    overruns: list[int] = []
    futures: list[SyncRun] = []
    first = call_sync(runner, slow, _ctx(5), (), {"seconds": 0.4}, 5, on_thread=futures.append,
                      on_overrun=lambda: overruns.append(1))
    second = call_sync(runner, slow, _ctx(0.3), (), {"seconds": 0.1}, 0.3, on_thread=futures.append,
                       on_overrun=lambda: overruns.append(1))
    await asyncio.gather(first, second)  # the second ran 0.1 s of its 0.3 s: no timeout
    assert [f.future.result() for f in futures] == ["done", "done"] and not overruns
    assert names == ["ringfence-job_0", "ringfence-job_0"]

    ctx = _ctx(0.2)
    with pytest.raises(JobTimeout):  # past its time: ctx.cancelled, then the timeout once it returns
        await call_sync(runner, slow, ctx, (), {"seconds": 0.5}, 0.2, on_thread=futures.append,
                        on_overrun=lambda: overruns.append(1))
    assert ctx.cancelled.is_set() and not overruns and futures[-1].done()  # returned within the grace
    runner.grace_s = 0.1
    ctx = _ctx(0.2)
    with pytest.raises(JobTimeout):  # still running after its time and the grace: the overrun reported
        await call_sync(runner, slow, ctx, (), {"seconds": 0.5}, 0.2, on_thread=futures.append,
                        on_overrun=lambda: overruns.append(1))
    assert ctx.cancelled.is_set() and overruns == [1] and futures[-1].done()  # settled after the thread
    runner.close()


async def test_a_handler_error_is_the_calls_outcome(make_app) -> None:
    app = make_app()

    @app.task
    def fails(ctx: Any) -> None:
        raise TimeoutError("socket timed out")  # its own TimeoutError: an ordinary failure, not ours

    runner = SyncRunner(2)
    overruns: list[int] = []
    with pytest.raises(TimeoutError, match="socket timed out"):
        await call_sync(runner, fails, _ctx(5), (), {}, 5, on_thread=lambda f: None,
                        on_overrun=lambda: overruns.append(1))
    assert not overruns
    runner.close()


async def test_calls_that_wait_for_a_busy_thread_get_one_each_up_to_the_limit(make_app) -> None:
    """Two threads to start with; one more whenever a call has waited 5 ms with no thread free, so four slow
    calls still run at once (two threads would take 1 s)."""
    app = make_app()
    names: set[str] = set()

    @app.task
    def slow(ctx: Any, seconds: float) -> None:
        names.add(threading.current_thread().name)
        time.sleep(seconds)

    runner = SyncRunner(4)
    t0 = time.monotonic()
    await asyncio.gather(*(call_sync(runner, slow, _ctx(5), (), {"seconds": 0.5}, 5, on_thread=lambda r: None,
                                     on_overrun=lambda: None) for _ in range(5)))
    assert len(names) == 4  # never more threads than the limit: the fifth call waited for one
    assert time.monotonic() - t0 < 1.4  # 4 at once, then the fifth; 2 threads would take 1.5 s
    runner.close()


def test_the_worker_loop_is_uvloop_unless_asked_for_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def loop_kind() -> int:
        return int(isinstance(asyncio.get_running_loop(), uvloop.Loop))

    assert run_loop(loop_kind()) == 1
    monkeypatch.setenv("RINGFENCE_EVENT_LOOP", "asyncio")
    assert run_loop(loop_kind()) == 0
    monkeypatch.setenv("RINGFENCE_EVENT_LOOP", "trio")
    coro = loop_kind()
    with pytest.raises(Exception, match="RINGFENCE_EVENT_LOOP='trio' must be 'uvloop' or 'asyncio'"):
        run_loop(coro)
    coro.close()


async def test_async_time_bounds_share_one_timer_and_keep_other_cancellations_and_errors(make_app) -> None:
    app = make_app()

    @app.task
    async def nap(ctx: Any, seconds: float, swallow: bool = False) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            if not swallow:
                raise
            return "swallowed"
        return "done"

    @app.task
    async def own_timeout(ctx: Any) -> None:
        raise TimeoutError("the handler's own")

    bounds = AsyncBounds()
    short = asyncio.create_task(call_async(nap, _ctx(0.1), (), {"seconds": 5}, 0.1, bounds))
    long = asyncio.create_task(call_async(nap, _ctx(2), (), {"seconds": 0.3}, 2, bounds))
    swallowed = asyncio.create_task(call_async(nap, _ctx(0.1), (), {"seconds": 5, "swallow": True}, 0.1, bounds))
    outside = asyncio.create_task(call_async(nap, _ctx(2), (), {"seconds": 5}, 2, bounds))
    await asyncio.sleep(0.05)
    outside.cancel()  # shutdown or a lost lease: not a timeout
    with pytest.raises(JobTimeout):
        await short
    assert await long == "done" and await swallowed == "swallowed"
    assert swallowed.cancelling() == 0
    with pytest.raises(asyncio.CancelledError):
        await outside
    with pytest.raises(TimeoutError, match="own"):
        await call_async(own_timeout, _ctx(1), (), {}, 1, bounds)
    assert not bounds.calls


async def test_a_call_finished_while_others_wait_is_settled_by_the_poller_not_held_behind_a_slow_one() -> None:
    runner = SyncRunner(4, first_threads=1, grow_after_s=60)  # one thread (a batch of four would wake the loop)
    def slow() -> str:
        time.sleep(1.0)
        return "slow"

    gate = threading.Event()
    first = runner.submit(gate.wait, (), {})
    fast = runner.submit(lambda: "fast", (), {})
    held = runner.submit(slow, (), {})
    gate.set()  # the thread finishes two calls while others wait: it wakes the loop for neither
    t0 = time.monotonic()
    assert await asyncio.wait_for(fast.future, 0.5) == "fast" and first.done()
    assert not held.done() and time.monotonic() - t0 < 0.5
    assert await held.future == "slow"
    runner.close()


async def test_short_calls_run_on_one_thread_until_one_waits_for_a_thread() -> None:
    runner = SyncRunner(10, grow_after_s=60)  # no growth: the thread count is the starting one
    runs = [runner.submit(lambda n=n: n, (), {}) for n in range(10)]  # a fetched batch, submitted at once
    assert [await r.future for r in runs] == list(range(10))
    assert len(runner._threads) == 1
    runner.close()
