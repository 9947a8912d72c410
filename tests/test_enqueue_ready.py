"""The plain enqueue's short path (client.py ``_enqueue_ready``, redis/ready.py, lua/enqueue_ready.lua): a job with
no options, ready now, with a generated id and no unique key is stored, counted and announced exactly as
enqueue.lua stores, counts and announces it; anything else still goes through enqueue.lua. Also the payload
checks' shortcut for plain annotations (payloads.py) and ids drawn in bulk (models.py)."""

from __future__ import annotations

import math
import os
import time
from typing import Annotated, Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from ringfence import App
from ringfence.errors import PayloadError
from ringfence.models import JobSpec, new_job_id
from ringfence.payloads import PayloadCodec, json_problem
from ringfence.redis.keys import INLINE_MAX_BYTES, split_entry
from ringfence.redis.ready import ReadyEnqueue
from support import SimClock


@pytest.fixture
def app(make_app: Any) -> App:
    a = make_app()

    @a.task(name="work")
    def work(ctx: Any, n: int, s: str = "") -> None: ...

    return a


def _pending(app: App) -> list[tuple[str, bytes | None]]:
    return [split_entry(e) for e in app.broker.sync.lrange(app.broker.keys.queue("default").pending, 0, -1)]


def test_a_plain_enqueue_is_stored_counted_and_announced_as_enqueue_lua_does(app: App, rdb: redis.Redis) -> None:
    k = app.broker.keys.queue("default")
    before = app.broker.clock()
    job = app.enqueue("work", n=1)
    assert isinstance(app.client._ready[app.registry.get("work")], ReadyEnqueue)  # type: ignore[index]
    [(job_id, spec)] = _pending(app)
    assert job_id == job and spec is not None and not rdb.hexists(k.jobs, job)
    decoded = JobSpec.decode(spec)
    assert (decoded.task, decoded.version, decoded.args) == ("work", 1, {"n": 1})
    assert before <= decoded.enqueued_ms <= app.broker.clock() + 1
    assert decoded.encode() == spec  # JobSpec.encode's very bytes
    assert rdb.hget(k.stats, "enqueued") == b"1"
    assert rdb.sismember(app.broker.keys.queues, "default")

    sub = rdb.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(k.wake)
    second = app.enqueue("work", n=2)  # nobody idle: no message
    rdb.zadd(k.idle, {"w.1": app.broker.clock() + 60_000})
    third = app.enqueue("work", n=3)  # a worker sleeps: woken
    deadline = time.monotonic() + 5
    got = []
    while time.monotonic() < deadline and not got:
        m = sub.get_message(timeout=0.1)
        if m is not None:
            got.append(m["data"])
    assert got == [b"1"]
    assert sub.get_message(timeout=0.2) is None
    sub.close()
    assert rdb.hget(k.stats, "enqueued") == b"3"
    assert [i for i, _ in _pending(app)][::-1] == [job, second, third]  # LPUSH, fetched from the right: FIFO


def test_the_other_enqueues_keep_enqueue_lua(app: App, rdb: redis.Redis) -> None:
    k = app.broker.keys.queue("default")
    big = app.enqueue("work", n=1, s="x" * INLINE_MAX_BYTES)  # a spec too large to go inline
    assert rdb.hexists(k.jobs, big) and _pending(app) == [(big, None)]
    assert rdb.hget(k.stats, "enqueued") == b"1"


def test_a_simulated_clock_stamps_the_job(make_app: Any, clock: SimClock) -> None:
    app = make_app(clock=clock)

    @app.task(name="work")
    def work(ctx: Any, n: int) -> None: ...

    work.enqueue(n=1)
    [(_, spec)] = _pending(app)
    assert spec is not None and JobSpec.decode(spec).enqueued_ms == clock.ms


def test_errors_of_a_plain_enqueue_are_those_of_the_checks(make_app: Any) -> None:
    app = make_app(max_payload_bytes=200)

    @app.task(name="work")
    def work(ctx: Any, n: int, s: str = "") -> None: ...

    @app.task(name="short")
    def short(ctx: Any, s: Annotated[str, Field(max_length=3)]) -> None: ...

    with pytest.raises(PayloadError, match="above max_payload_bytes=200"):
        work.enqueue(n=1, s="x" * 300)
    with pytest.raises(PayloadError, match="field n"):
        work.enqueue(n="1")
    with pytest.raises(PayloadError, match="unknown field"):
        work.enqueue(n=1, m=2)
    with pytest.raises(PayloadError, match="missing required"):
        work.enqueue(s="x")
    with pytest.raises(PayloadError, match="NaN and Infinity"):
        work.enqueue(n=1, s=math.nan)  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match="surrogates"):
        work.enqueue(n=1, s="\ud800")
    with pytest.raises(PayloadError, match="at most 3"):
        short.enqueue(s="abcd")  # Annotated: pydantic checks it
    assert _pending(app) == []


def test_enqueue_many_of_inline_jobs_takes_enqueue_ready_in_order(app: App, rdb: redis.Redis) -> None:
    ids = app.enqueue_many("work", [{"n": i} for i in range(2500)])  # three LPUSH calls of at most 1,000
    assert [i for i, _ in _pending(app)][::-1] == ids  # LPUSH, fetched from the right: FIFO
    assert rdb.hget(app.broker.keys.queue("default").stats, "enqueued") == b"2500"


def _slow_checks(codec: PayloadCodec, payload: dict[str, Any]) -> str | None:
    """What the full checks say about ``payload``: None when they accept it, else the error."""
    try:
        problem = json_problem(payload, "payload")
        if problem:
            return problem
        codec.check_fields(payload)
        codec.validate(payload)
    except PayloadError as exc:
        return str(exc)
    return None


def _handler(ctx: Any, f: float, i: int, s: str, b: bool, a: Any, u=None) -> None: ...  # type: ignore[no-untyped-def]


VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
                   st.text(max_size=4), st.lists(st.integers(), max_size=2), st.just(object()))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["f", "i", "s", "b", "a", "u", "z"]), VALUES))
def test_the_plain_shortcut_accepts_only_what_the_full_checks_accept(payload: dict[str, Any]) -> None:
    codec = PayloadCodec("t", _handler, 1, None)
    assert codec._plain is not None
    if codec._plainly_valid(payload):
        assert _slow_checks(codec, payload) is None
    slow = _slow_checks(codec, payload)
    if slow is None:
        assert codec.encode(payload) is payload
    else:
        with pytest.raises(PayloadError):
            codec.encode(payload)


def test_ids_are_distinct_and_a_forked_child_draws_its_own() -> None:
    ids = {new_job_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(len(i) == 16 and i.isalnum() and i.islower() for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids must not be the ones its parent hands out next
        os.write(write, ",".join(new_job_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = set(f.read().split(","))
    os.waitpid(pid, 0)
    parent = {new_job_id() for _ in range(300)}
    assert len(child) == 300 and not child & parent
