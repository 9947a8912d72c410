"""``JobContext.cancelled`` is the ``threading.Event`` handlers are told it is: set from another thread (the worker,
on a timeout or a lost lease), it wakes a handler waiting on it."""

from __future__ import annotations

import threading
import time

from ringfence.tasks import CancelFlag, JobContext


def test_a_context_s_cancelled_flag_is_an_event_that_wakes_a_waiting_thread() -> None:
    ctx = JobContext(id="j", task="t", queue="q", attempt=1, max_attempts=3, enqueued_ms=0, token="x")
    flag = ctx.cancelled
    assert isinstance(flag, threading.Event) and not flag.is_set()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda f=flag, w=woke: w.append(f.wait(5)))
    waiter.start()
    time.sleep(0.05)
    flag.set()
    waiter.join(5)
    assert woke == [True] and flag.is_set()
    flag.clear()
    assert not flag.is_set() and flag.wait(0.01) is False


def test_every_public_method_of_event_is_overridden() -> None:
    # CancelFlag skips Event.__init__: a public method it inherited would read attributes never made
    inherited = [n for n in dir(threading.Event) if not n.startswith("_") and n not in CancelFlag.__dict__]
    assert inherited == []


def test_threads_racing_on_a_fresh_flag_share_one_event() -> None:
    for _ in range(200):
        flag = CancelFlag()
        woke: list[bool] = []
        waiters = [threading.Thread(target=lambda f=flag, w=woke: w.append(f.wait(5))) for _ in range(3)]
        setter = threading.Thread(target=flag.set)
        for t in [*waiters, setter]:
            t.start()
        for t in [*waiters, setter]:
            t.join(5)
        assert woke == [True, True, True]
