"""Per-job work the worker's loop skips on the sync path, and what must not change with it.

- ``PayloadCodec.decode`` returns a stored plain payload as the handler's kwargs without pydantic's JSON round
  trip when every field already has the exact type pydantic would return; anything else takes the full check.
- The job threads grow (one more when a call has waited ``grow_after_s`` while no thread took any) only when the
  process was not held back by the machine: while its threads waited for a CPU, another thread would not help.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringfence.errors import PayloadError
from ringfence.payloads import PayloadCodec
from ringfence.worker.calls import STARVED_MAX_PERIODS, SyncRunner


def _handler(ctx: Any, f: float, i: int, s: str, b: bool, a: Any, u=None) -> None: ...  # type: ignore[no-untyped-def]


VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64), st.floats(),
                   st.text(max_size=4), st.lists(st.integers(), max_size=2))


def _full(codec: PayloadCodec, payload: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | str:
    """What decode returned before the shortcut: the fields checked, then pydantic's strict JSON validation."""
    try:
        codec.check_fields(payload)
        return (), codec.validate(payload)
    except PayloadError as exc:
        return str(exc)


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return type(x) is type(y) and x == y


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(["f", "i", "s", "b", "a", "u", "z"]), VALUES))
def test_decode_gives_what_the_full_check_gives(payload: dict[str, Any]) -> None:
    codec = PayloadCodec("t", _handler, 1, None)
    try:
        stored = orjson.loads(orjson.dumps(payload))  # as a worker reads it back
    except orjson.JSONEncodeError:
        return  # never stored
    full = _full(codec, stored)
    if isinstance(full, str):
        with pytest.raises(PayloadError):
            codec.decode(1, stored)
        return
    args, kwargs = codec.decode(1, stored)
    assert args == () and kwargs.keys() == full[1].keys()
    assert all(_same(kwargs[k], full[1][k]) for k in kwargs)


def test_a_float_field_stored_as_an_int_is_still_a_float_and_a_bad_payload_is_still_refused() -> None:
    codec = PayloadCodec("t", _handler, 1, None)
    ok = {"f": 3, "i": 1, "s": "x", "b": True, "a": None}
    _, kwargs = codec.decode(1, ok)
    assert type(kwargs["f"]) is float and kwargs["f"] == 3.0  # pydantic's conversion, not the int as stored
    _, plain = codec.decode(1, {**ok, "f": 2.5})
    assert plain == {**ok, "f": 2.5}
    for bad in ({**ok, "i": True}, {**ok, "i": "5"}, {**ok, "zz": 1}, {"f": 1.0}):
        with pytest.raises(PayloadError):
            codec.decode(1, bad)


def test_a_plain_payload_of_exact_types_is_not_sent_through_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = PayloadCodec("t", _handler, 1, None)

    def no(*a: Any, **k: Any) -> Any:
        raise AssertionError("pydantic called for a plain payload")

    monkeypatch.setattr(codec, "validate", no)
    payload = {"f": 1.5, "i": 2, "s": "x", "b": False, "a": 3}
    assert codec.decode(1, payload) == ((), payload)


async def test_no_job_thread_is_added_while_the_process_waits_for_a_cpu() -> None:
    runner = SyncRunner(4, grow_after_s=0.005)
    queued = [0.0]

    def starving() -> float:  # each look: a second more spent runnable without a CPU
        queued[0] += 1.0
        return queued[0]

    runner.queued_s = starving  # type: ignore[method-assign]
    release = threading.Event()
    runs = [runner.submit(release.wait, (5,), {}) for _ in range(3)]  # one thread held, two calls wait
    await asyncio.sleep(0.06)
    assert len(runner._threads) == 1
    runner.queued_s = lambda: queued[0]  # type: ignore[method-assign]  # the machine has a CPU for it again
    await asyncio.sleep(0.2)
    assert len(runner._threads) == 3  # slow calls: one thread each
    release.set()
    assert [await r.future for r in runs] == [True] * 3
    runner.close()


async def test_a_machine_busy_for_good_holds_a_waiting_call_back_only_so_long() -> None:
    runner = SyncRunner(4, grow_after_s=0.005)
    queued = [0.0]

    def starving() -> float:  # every look: starved, and it never ends
        queued[0] += 1.0
        return queued[0]

    runner.queued_s = starving  # type: ignore[method-assign]
    release = threading.Event()
    runs = [runner.submit(release.wait, (5,), {}) for _ in range(2)]  # one thread held by a slow call
    t0 = time.monotonic()
    while len(runner._threads) < 2 and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.005)
    waited = time.monotonic() - t0
    assert len(runner._threads) == 2, "the waiting call never got a thread"
    assert waited >= 0.005 * STARVED_MAX_PERIODS * 0.9  # held back first, as the test above shows
    release.set()
    assert [await r.future for r in runs] == [True] * 2
    runner.close()


def test_the_run_queue_wait_is_read_and_grows() -> None:
    before = SyncRunner.queued_s()
    assert before >= 0.0
    assert SyncRunner.queued_s() >= before


async def _feed(runner: SyncRunner, call: Any, seconds: float, calls: int) -> None:
    """Keep ``calls`` calls queued or running (a worker's slots) for ``seconds``."""
    pending: set[Any] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        while len(pending) < calls:
            pending.add(runner.submit(call, (), {}).future)
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*pending)


def _io_call() -> None:
    time.sleep(0.001)  # a database statement: the thread sleeps, the GIL is free


async def test_short_calls_that_sleep_on_io_get_more_threads() -> None:
    """1 ms calls never leave every thread busy for a whole period, but the process sleeps: threads are added."""
    runner = SyncRunner(8, first_threads=2, grow_after_s=0.005)
    runner.queued_s = lambda: 0.0  # type: ignore[method-assign]  # never starved: the CPU share decides
    await _feed(runner, _io_call, 0.5, 8)
    assert len(runner._threads) >= 4
    runner.close()


async def test_short_calls_of_a_process_busy_on_one_cpu_keep_their_threads() -> None:
    """The same calls while the process uses a whole CPU (the GIL is what they wait for): no thread is added."""
    runner = SyncRunner(8, first_threads=2, grow_after_s=0.005)
    runner.queued_s = lambda: 0.0  # type: ignore[method-assign]
    runner.cpu_s = time.monotonic  # type: ignore[method-assign]  # one CPU second per second
    await _feed(runner, _io_call, 0.5, 8)
    assert len(runner._threads) == 2
    runner.close()
