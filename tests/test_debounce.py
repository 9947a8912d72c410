"""Debounce: the last enqueue with a key wins (lua/debounce.lua), on the shared Redis.

- later enqueues with a key replace the scheduled job's payload and/or push its start back, keep its id, and a
  real worker runs it once, with the last payload; max_wait_s caps the push;
- any interleaving of enqueues, clock moves and fetches (hypothesis, on a simulated clock) matches a model: a job
  is replaced only while it is scheduled and not due, and every job is fetched once with its last payload;
- four producer processes race a real worker over two keys: no job both replaced and run, none lost, none run twice;
- bad options get one clear ConfigError.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import sqlalchemy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from ringfence import App, ConfigError
from support import ROOT, SimClock, WorkerProc, wait_until


def note_task(app: App) -> Any:
    @app.task(name="note")
    def note(ctx: Any, key: str, token: str, sleep_ms: int = 0) -> None:
        pass

    return note


def spec_of(rdb: redis.Redis, app: App, job_id: str) -> dict[str, Any]:
    raw = rdb.hget(app.broker.keys.queue("default").jobs, job_id)
    assert raw is not None
    return dict(orjson.loads(raw)["a"])


def runs(rdb: redis.Redis, namespace: str) -> dict[str, tuple[str, float]]:
    """id -> (token it ran with, start time), from tests/debounceapp.py."""
    out = {}
    for job_id, value in rdb.hgetall(f"{namespace}:test:ran").items():
        token, start = value.decode().split()
        out[job_id.decode()] = (token, float(start))
    return out


def debounce_worker(spawn_worker: Callable[..., WorkerProc], *args: str) -> WorkerProc:
    return spawn_worker("--app", "debounceapp:app", "--queues", "default", *args)


def test_last_enqueue_wins_one_id_run_once(make_app: Callable[..., App], rdb: redis.Redis, namespace: str,
                                           spawn_worker: Callable[..., WorkerProc]) -> None:
    app = make_app()
    note = note_task(app)
    q = app.broker.keys.queue("default")
    bounce = note.with_options(debounce_s=1.0, debounce_key="user:{key}")
    first = bounce.enqueue(key="a", token="a1")
    at_first = rdb.zscore(q.scheduled, first)
    time.sleep(0.05)
    ids = [bounce.enqueue(key="a", token=f"a{i}") for i in (2, 3)]
    other = bounce.enqueue(key="b", token="b1")
    assert ids == [first, first] and other != first
    assert rdb.zcard(q.scheduled) == 2
    assert spec_of(rdb, app, first)["token"] == "a3"
    at_last = rdb.zscore(q.scheduled, first)
    assert at_first is not None and at_last is not None and at_last >= at_first + 50  # its start moved back
    assert int(rdb.hget(q.stats, "enqueued") or 0) == 2  # replacements are not new jobs
    debounce_worker(spawn_worker)
    wait_until(lambda: len(runs(rdb, namespace)) == 2)
    time.sleep(0.3)
    ran = runs(rdb, namespace)
    assert {job: token for job, (token, _) in ran.items()} == {first: "a3", other: "b1"}
    assert rdb.get(f"{namespace}:test:twice") is None
    assert ran[first][1] * 1000 >= at_last - 50  # not before its pushed-back start (clocks of one machine)
    # The job ran: the key is free, the next enqueue is a new job.
    assert bounce.enqueue(key="a", token="a4") != first


@pytest.mark.parametrize(("mode", "token", "moved"), [("payload", "x2", False), ("delay", "x1", True),
                                                       ("both", "x2", True)])
def test_replace_modes(make_app: Callable[..., App], rdb: redis.Redis, mode: str, token: str, moved: bool) -> None:
    app = make_app()
    note = note_task(app)
    q = app.broker.keys.queue("default")
    bounce = note.with_options(debounce_s=5.0, replace=mode)  # type: ignore[typeddict-item]
    job = bounce.enqueue(key="x", token="x1")
    at = rdb.zscore(q.scheduled, job)
    time.sleep(0.05)
    assert bounce.enqueue(key="x", token="x2") == job  # no debounce_key: one key for the task
    assert spec_of(rdb, app, job)["token"] == token
    assert (rdb.zscore(q.scheduled, job) != at) is moved


def test_max_wait_caps_the_push(make_app: Callable[..., App], rdb: redis.Redis, namespace: str,
                                spawn_worker: Callable[..., WorkerProc]) -> None:
    """Enqueues every 0.1 s would push a 0.4 s debounce back forever; max_wait_s=1 starts the job within 1 s of its
    first enqueue, and the enqueues after its start make a new job."""
    app = make_app()
    note = note_task(app)
    q = app.broker.keys.queue("default")
    bounce = note.with_options(debounce_s=0.4, max_wait_s=1.0, debounce_key="{key}")
    debounce_worker(spawn_worker)
    wait_until(app.broker.servers)  # the worker is up: its start-up time does not count against the cap
    first_at = time.time()
    first = bounce.enqueue(key="m", token="m0")
    ids = [first]
    for i in range(1, 21):
        time.sleep(0.1)
        ids.append(bounce.enqueue(key="m", token=f"m{i}"))
        if ids[-1] == first:
            assert (rdb.zscore(q.scheduled, first) or 0) <= first_at * 1000 + 1000 + 50  # never past the cap
    assert len(set(ids)) >= 2
    wait_until(lambda: set(runs(rdb, namespace)) == set(ids))
    ran = runs(rdb, namespace)
    assert ran[first][1] - first_at < 1.0 + 0.5  # the cap plus the worker's promote interval and a loaded machine
    last_of_first = max(i for i, job in enumerate(ids) if job == first)
    assert ran[first][0] == f"m{last_of_first}"
    assert rdb.get(f"{namespace}:test:twice") is None


# -- any interleaving, on a simulated clock, against a model -------------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(["a", "b"]), st.sampled_from(["payload", "delay", "both"]),
              st.sampled_from([100, 300]), st.sampled_from([0, 250])),
    st.tuples(st.just("advance"), st.integers(0, 400)),
    st.tuples(st.just("fetch")),
), max_size=40)


class Model:
    """What debounce promises: per key, the job that later enqueues replace while it is scheduled and not due."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}  # id -> token, run_at, deadline, fetched
        self.holder: dict[str, str] = {}           # key -> id

    def enqueue(self, now: int, key: str, mode: str, debounce_ms: int, wait_ms: int, token: str, got: str) -> None:
        held = self.jobs.get(self.holder.get(key, ""))
        if held is not None and not held["fetched"] and held["run_at"] > now:
            assert got == self.holder[key], "a scheduled job that is not due was not replaced"
            if mode != "payload":
                held["run_at"] = min(now + debounce_ms, held["deadline"] or now + debounce_ms)
            if mode != "delay":
                held["token"] = token
            return
        assert got not in self.jobs, "a due, fetched or finished job was replaced"
        deadline = now + wait_ms if wait_ms else 0
        run_at = min(now + debounce_ms, deadline) if deadline else now + debounce_ms
        self.jobs[got] = {"token": token, "run_at": run_at, "deadline": deadline, "fetched": False}
        self.holder[key] = got

    def due(self, now: int) -> dict[str, str]:
        return {i: j["token"] for i, j in self.jobs.items() if not j["fetched"] and j["run_at"] <= now}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_interleavings_match_the_model(make_app: Callable[..., App], ops: list[tuple[Any, ...]]) -> None:
    clock = SimClock()
    app = make_app(clock=clock)
    note = note_task(app)
    queue = f"q{next(EXAMPLES)}"  # a queue of its own per example: no state carried over
    broker, model, tokens = app.broker, Model(), itertools.count()
    for op in [*ops, ("advance", 10_000), ("fetch",)]:
        if op[0] == "enqueue":
            _, key, mode, debounce_ms, wait_ms = op
            token = f"t{next(tokens)}"
            opts: dict[str, Any] = {"debounce_s": debounce_ms / 1000, "debounce_key": key, "replace": mode,
                                    "max_wait_s": wait_ms / 1000 if wait_ms else None, "queue": queue}
            got = note.with_options(**opts).enqueue(key=key, token=token)
            model.enqueue(clock.ms, key, mode, debounce_ms, wait_ms, token, got)
        elif op[0] == "advance":
            clock.advance(op[1] / 1000)
        else:
            broker.run(broker.promote(queue))
            fetched = broker.run(broker.fetch(queue, 1000, clock.ms + 60_000, "tok"))
            assert {i: orjson.loads(spec)["a"]["token"] for i, spec, _ in fetched} == model.due(clock.ms)
            for i, _, _ in fetched:
                model.jobs[i]["fetched"] = True
    assert all(j["fetched"] for j in model.jobs.values())  # none lost


EXAMPLES = itertools.count()


# -- real producers racing a real worker -----------------------------------------------------------------------------

def test_concurrent_producers_and_a_worker_never_lose_or_replace_a_started_job(
        rdb: redis.Redis, namespace: str, redis_url: str, tmp_path: Path,
        spawn_worker: Callable[..., WorkerProc]) -> None:
    """Four producers enqueue 150 jobs each over two keys with a 30 ms debounce (100 ms at most) while a worker
    runs them (30 ms each). Each id runs once, with a token enqueued into it; no enqueue returns an id whose run
    started before the enqueue was sent; and no token that ran was superseded by an enqueue into its job that
    surely came later (sent after its reply)."""
    debounce_worker(spawn_worker, "--concurrency", "4")
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    outs = [tmp_path / f"p{n}.jsonl" for n in range(4)]
    producers = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "debounceproducer.py"), f"p{n}", "150",
                                   str(out)], env=env) for n, out in enumerate(outs)]
    try:
        assert [p.wait(120) for p in producers] == [0, 0, 0, 0]
    finally:
        for p in producers:
            if p.poll() is None:
                p.kill()
    calls = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    ids = {c["id"] for c in calls}
    assert len(calls) == 600 and 2 < len(ids) < 600  # both new jobs and replacements happened
    wait_until(lambda: set(runs(rdb, namespace)) == ids, timeout=60)
    time.sleep(0.5)
    ran = runs(rdb, namespace)
    assert set(ran) == ids and rdb.get(f"{namespace}:test:twice") is None
    by_token = {c["token"]: c for c in calls}
    for job, (token, start) in ran.items():
        assert by_token[token]["id"] == job  # it ran with a payload enqueued into it
        into = [c for c in calls if c["id"] == job]
        assert all(c["sent"] < start for c in into), f"job {job} was replaced after its run started"
        later = [c["token"] for c in into if c["sent"] > by_token[token]["reply"]]
        assert not later, f"job {job} ran with {token}, but {later} were enqueued into it after: lost"
    q = f"{namespace}:{{{namespace}:default}}"
    assert rdb.hlen(f"{q}:jobs") == 0 and rdb.zcard(f"{q}:scheduled") == 0


# -- bad options ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "message"), [
    ({"debounce_s": 0}, "option debounce_s=0 must be a finite number of seconds > 0"),
    ({"debounce_s": 1, "max_wait_s": -1}, "option max_wait_s=-1 must be a finite number of seconds > 0"),
    ({"debounce_s": 1, "replace": "all"}, "replace='all' must be 'payload', 'delay' or 'both'"),
    ({"max_wait_s": 5}, "debounce_key, max_wait_s and replace need debounce_s"),
    ({"debounce_s": 1, "delay_s": 2}, "debounce_s takes no delay_s, run_at, job_id or unique_for"),
    ({"debounce_s": 1, "job_id": "j1"}, "debounce_s takes no delay_s, run_at, job_id or unique_for"),
    ({"debounce_s": 1, "debounce_key": "{user}"}, "debounce_key '{user}' names field 'user'"),
])
def test_bad_options_are_refused(make_app: Callable[..., App], rdb: redis.Redis, namespace: str,
                                 options: dict[str, Any], message: str) -> None:
    note = note_task(make_app())
    with pytest.raises(ConfigError, match=re.escape(message)):
        note.with_options(**options).enqueue(key="k", token="t")
    assert not list(rdb.scan_iter(f"{namespace}:*"))


async def test_aenqueue_debounces(make_app: Callable[..., App]) -> None:
    note = note_task(make_app())
    bounce = note.with_options(debounce_s=2, debounce_key="{key}")
    first = await bounce.aenqueue(key="k", token="t1")
    assert await bounce.aenqueue(key="k", token="t2") == first


def test_batches_the_outbox_and_on_commit_refuse_debounce(make_app: Callable[..., App]) -> None:
    app = make_app()
    note = note_task(app)
    with pytest.raises(ConfigError, match=re.escape("debounce_s is taken by enqueue() and aenqueue() only")):
        app.enqueue_many(note, [{"key": "k", "token": "t"}], debounce_s=1)
    engine = sqlalchemy.create_engine("sqlite://")
    with Session(engine) as session, session.begin():
        with pytest.raises(ConfigError, match=re.escape("debounce_s is taken by enqueue() and aenqueue() only")):
            note.with_options(debounce_s=1).enqueue_on_commit(session, key="k", token="t")
        with pytest.raises(ConfigError, match=re.escape("debounce_s is taken by enqueue() and aenqueue() only")):
            note.with_options(debounce_s=1).enqueue_in(session, key="k", token="t")
    engine.dispose()
