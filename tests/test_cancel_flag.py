"""``JobContext.cancelled`` (tasks.CancelFlag) makes its lock on first use: it still behaves as the
``threading.Event`` handlers are told it is."""

from __future__ import annotations

import threading
import time

from ringfence.tasks import CancelFlag, JobContext


def test_a_context_s_cancelled_flag_is_an_event_that_wakes_a_waiting_thread() -> None:
    ctx = JobContext(id="j", task="t", queue="q", attempt=1, max_attempts=3, enqueued_ms=0, token="x")
    flag = ctx.cancelled
    assert isinstance(flag, threading.Event) and isinstance(flag, CancelFlag)
    assert not flag.is_set() and "_cond" not in flag.__dict__  # no lock until it is needed
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(flag.wait(5)))
    waiter.start()
    time.sleep(0.05)
    flag.set()  # from another thread, as the worker does on a timeout or a lost lease
    waiter.join(5)
    assert woke == [True] and flag.is_set()
    flag.clear()
    assert not flag.is_set() and flag.wait(0.01) is False


def test_many_threads_touching_a_fresh_flag_share_one_lock() -> None:
    for _ in range(50):
        flag = CancelFlag()
        conds: list[object] = []
        barrier = threading.Barrier(4)

        def touch(flag: CancelFlag = flag, barrier: threading.Barrier = barrier, conds: list[object] = conds) -> None:
            barrier.wait()
            conds.append(flag._cond)

        threads = [threading.Thread(target=touch) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(c) for c in conds}) == 1
