"""The producer path at its edges, on the shared Redis (private redis-servers where ACLs or a stopped server are
needed) and with real worker processes (tests/producerapp.py):

- names are checked whole: a final newline in a queue, a job id or a namespace is refused, on the API and the CLI;
- an explicit job id enqueued again after its run finished: waiters get the new run's result, never the old one;
- an enqueue the Redis user may not finish (ACL) is refused before any write: nothing is left behind;
- enqueue_many sends bounded calls: 100,000 jobs in a bounded client memory, and a call refused after others
  went says which jobs were queued (PartlyEnqueued);
- redis-py's errors on the producer path (enqueue, enqueue_many, results) come as ringfence's: CannotConnect with
  Redis stopped, NotPermitted for a command the ACL denies, BrokerError for an error answer; the original is the
  cause;
- results are capped like payloads (max_result_bytes), and payloads and results nested too deep are refused with
  a PayloadError naming the limit (never a RecursionError);
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import redis

from ringfence import (
    App,
    BrokerError,
    CannotConnect,
    ConfigError,
    JobFailed,
    NotPermitted,
    PartlyEnqueued,
    PayloadError,
    RedisFull,
    ResultTimeout,
)
from ringfence.client import CHUNK_JOBS
from ringfence.payloads import MAX_DEPTH
from ringfence.queries import find_dead
from ringfence.redis.connection import ConnectionSettings
from ringfence.redis.embedded import EmbeddedRedis
from ringfence.redis.scripts import script
from support import ROOT, WorkerProc

NAME_RULE = "must be 1 to 64 characters"


def producer_worker(spawn_worker: Callable[..., WorkerProc], *args: str, env: dict[str, str] | None = None
                    ) -> WorkerProc:
    return spawn_worker("--app", "producerapp:app", "--queues", "default", *args, env=env)


def declare(app: App) -> dict[str, Any]:
    """The tasks of producerapp.py, as a producer declares them (same names, so the worker runs them)."""

    @app.task(name="quote", store_result=True)
    def quote(ctx: Any, n: int) -> dict[str, int]:
        raise AssertionError("runs in the worker")

    @app.task(name="big", store_result=True)
    def big(ctx: Any, kib: int) -> str:
        raise AssertionError("runs in the worker")

    @app.task(name="deep", store_result=True)
    def deep(ctx: Any, levels: int) -> list[Any]:
        raise AssertionError("runs in the worker")

    @app.task(name="anything")
    def anything(ctx: Any, value: Any = None) -> None:
        raise AssertionError("never run")

    return {"quote": quote, "big": big, "deep": deep, "anything": anything}


def ns_keys(rdb: redis.Redis, namespace: str) -> list[bytes]:
    return sorted(rdb.scan_iter(f"{namespace}:*", count=1000))


def job_keys(rdb: redis.Redis, namespace: str) -> list[bytes]:
    """Every key of the namespace but the set of queue names (registered before a payload is checked)."""
    return [k for k in ns_keys(rdb, namespace) if not k.endswith(b":queues")]


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
            "PYTHONPATH": str(ROOT / "tests"), **env}
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], env=full, capture_output=True, text=True,
                          timeout=60)


# -- names --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("option", [{"queue": "default\n"}, {"job_id": "abc\n"}, {"queue": "a b"},
                                    {"job_id": "x" * 65}])
def test_a_name_with_a_final_newline_is_refused_and_nothing_is_stored(
        make_app: Callable[..., App], rdb: redis.Redis, namespace: str, option: dict[str, str]) -> None:
    app = make_app()
    t = declare(app)["anything"]
    (value,) = option.values()
    with pytest.raises(ConfigError) as caught:
        t.with_options(**option).enqueue(value=1)
    assert repr(value) in str(caught.value) and NAME_RULE in str(caught.value)
    with pytest.raises(ConfigError, match="default"):
        app.task(name="declared", queue="default\n")(lambda ctx: None)
    assert ns_keys(rdb, namespace) == []  # no job, no queue registered


def test_a_namespace_or_environment_with_a_final_newline_is_refused(redis_url: str) -> None:
    for kw in ({"namespace": "nl\n"}, {"environment": "prod\n"}):
        with pytest.raises(ConfigError) as caught:
            App(redis_url, **kw)
        assert repr(next(iter(kw.values()))) in str(caught.value)
    with pytest.raises(ConfigError, match=r"'abc\\n'"):
        App(redis_url, "ok").result("abc\n", timeout=0)


def test_the_cli_refuses_a_queue_or_namespace_with_a_final_newline(redis_url: str, namespace: str) -> None:
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace}
    bad_queue = cli("queue", "pause", "default\n", env=env)
    assert bad_queue.returncode == 2, bad_queue.stderr
    assert r"queue 'default\n' must be" in bad_queue.stderr and "Traceback" not in bad_queue.stderr
    bad_ns = cli("info", env={**env, "RINGFENCE_NAMESPACE": "nl\n"})
    assert bad_ns.returncode == 2, bad_ns.stderr
    assert r"namespace 'nl\n' must be" in bad_ns.stderr


# -- a job id enqueued again --------------------------------------------------------------------------------
def test_a_reused_job_id_never_answers_with_the_earlier_runs_result(
        make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc]) -> None:
    app = make_app()
    quote = declare(app)["quote"]
    w = producer_worker(spawn_worker)
    assert quote.with_options(job_id="quote-1").enqueue(n=1) == "quote-1"
    assert app.result("quote-1", timeout=30) == {"n": 1}
    w.signal(15)
    assert w.wait() == 0
    assert quote.with_options(job_id="quote-1").enqueue(n=2) == "quote-1"  # the first run finished: a new job
    with pytest.raises(ResultTimeout):
        app.result("quote-1", timeout=0)  # pending: the first run's {"n": 1} is not its result
    with pytest.raises(ResultTimeout):
        app.result("quote-1", timeout=0.3)
    with pytest.raises(ResultTimeout):
        asyncio.run(aresult(app, "quote-1", timeout=0.3))
    producer_worker(spawn_worker)
    assert app.result("quote-1", timeout=30) == {"n": 2}


# -- an enqueue refused by an ACL ---------------------------------------------------------------------------
#: The least-privilege user of docs/deployment.md (tests/test_acl.py), minus one command.
ACL = "on >s3cret resetkeys ~{ns}:* resetchannels &{ns}:* -@all +@read +@write +@scripting +@pubsub " \
      "+@connection +@transaction +time +info -@dangerous -{denied}"

MANY = [{"value": i} for i in range(50)]


async def aenqueue_many(app: App, task: Any, payloads: list[Any], **options: Any) -> list[str]:
    try:
        return await app.aenqueue_many(task, payloads, **options)
    finally:
        await app.broker.aclose()  # its connections belong to this event loop

REFUSED: dict[str, tuple[str, Callable[[App, Any], Any]]] = {
    "an id of the caller's": ("lpush", lambda app, t: t.with_options(job_id="order-1").enqueue(value=1)),
    "scheduled": ("zadd", lambda app, t: t.with_options(job_id="order-1", delay_s=60).enqueue(value=1)),
    "unique": ("hset", lambda app, t: t.with_options(unique_for=60).enqueue(value=1)),
    "durable": ("lpush", lambda app, t: t.with_options(job_id="order-1", durable=True).enqueue(value=1)),
    "plain, inline": ("hincrby", lambda app, t: t.enqueue(value=1)),
    "many, inline": ("hincrby", lambda app, t: app.enqueue_many(t, MANY)),
    "many, unique": ("lpush", lambda app, t: app.enqueue_many(t, MANY, unique_for=60)),
    "async many": ("lpush", lambda app, t: asyncio.run(aenqueue_many(app, t, MANY, unique_for=60))),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_enqueue_refused_by_an_acl_leaves_nothing_behind(private_redis: EmbeddedRedis, namespace: str,
                                                            case: str) -> None:
    denied, enqueue = REFUSED[case]
    admin = redis.Redis.from_url(private_redis.url)
    admin.execute_command("ACL", "SETUSER", "producer", *ACL.format(ns=namespace, denied=denied).split())
    url = private_redis.url.replace("redis://", "redis://producer:s3cret@")
    app = App(url, namespace, environment="test")
    t = declare(app)["anything"]
    for _ in range(2):  # a retried enqueue is refused again: it never reports a job that is not queued
        with pytest.raises(BrokerError) as caught:
            enqueue(app, t)
        assert denied.upper() in str(caught.value) and "ACL" in str(caught.value)
        assert "\n" not in str(caught.value)
        assert isinstance(caught.value.__cause__, redis.ResponseError)
    assert job_keys(admin, namespace) == []  # no job record, no unique hold, no counter


# -- sizes and depths ---------------------------------------------------------------------------------------
def nested(levels: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(levels):
        out = [out]
    return out


def test_a_result_above_max_result_bytes_is_refused_and_recorded_on_the_job(
        make_app: Callable[..., App], rdb: redis.Redis, spawn_worker: Callable[..., WorkerProc]) -> None:
    app = make_app()
    t = declare(app)
    small, large = t["big"].enqueue(kib=10), t["big"].enqueue(kib=100)
    producer_worker(spawn_worker, env={"TEST_MAX_RESULT_BYTES": str(64 * 1024)})
    assert app.result(small, timeout=30) == "x" * 10 * 1024
    with pytest.raises(JobFailed) as caught:
        app.result(large, timeout=30)
    assert caught.value.reason == "bad_result"
    assert "above max_result_bytes=65,536" in caught.value.error and "\n" not in caught.value.error
    dead = find_dead(app.broker, large)
    assert dead is not None and dead.reason == "bad_result" and dead.args == {"kib": 100}  # kept for a replay
    assert len(rdb.lindex(app.broker.keys.result(large), 0) or b"") < 1024  # the failure, not the value


def test_a_result_nested_too_deep_is_refused_with_the_limit(
        make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc]) -> None:
    app = make_app()
    t = declare(app)
    fine, deep = t["deep"].enqueue(levels=MAX_DEPTH - 1), t["deep"].enqueue(levels=5000)
    producer_worker(spawn_worker)
    assert app.result(fine, timeout=30) == nested(MAX_DEPTH - 1)
    with pytest.raises(JobFailed) as caught:
        app.result(deep, timeout=30)
    assert caught.value.reason == "bad_result"
    assert f"nested more than {MAX_DEPTH} levels deep" in caught.value.error
    assert "RecursionError" not in caught.value.error


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 5000])
def test_a_payload_nested_too_deep_is_a_payload_error_naming_the_limit(
        make_app: Callable[..., App], rdb: redis.Redis, namespace: str, levels: int) -> None:
    app = make_app()
    t = declare(app)["anything"]
    with pytest.raises(PayloadError, match=f"payload.value.* is nested more than {MAX_DEPTH} levels deep"):
        t.enqueue(value=nested(levels))
    with pytest.raises(PayloadError, match=f"nested more than {MAX_DEPTH} levels deep"):
        app.enqueue_many(t, [{"value": 1}, {"value": nested(levels)}])
    assert job_keys(rdb, namespace) == []
    assert t.enqueue(value=nested(MAX_DEPTH - 2))  # at the limit: queued


def test_on_a_cluster_the_acl_checks_ask_for_the_sharded_publish_the_scripts_run() -> None:
    for name in ("enqueue", "enqueue_ready"):
        sharded = script(name).sharded
        assert "{'SPUBLISH', " in sharded and re.search(r"[^S]PUBLISH'", sharded) is None, name


# -- enqueue_many in bounded calls --------------------------------------------------------------------------
MANY_PRODUCER = """
import json, resource, sys
from ringfence import App
app = App(sys.argv[1], "many")

@app.task(name="job")
def job(ctx, order: int, note: str = "") -> None: ...

app.enqueue_many(job, [{"order": -1}])  # connect, load the script
payloads = [{"order": i, "note": "n" * 40} for i in range(int(sys.argv[2]))]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = app.enqueue_many(job, payloads)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ids": len(set(ids)), "first": ids[0], "last": ids[-1], "peak_mb": (peak - before) / 1024}))
"""


def test_enqueue_many_of_100_000_jobs_goes_in_bounded_calls(private_redis: EmbeddedRedis) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    n = 100_000
    admin.config_resetstat()
    done = subprocess.run([sys.executable, "-c", MANY_PRODUCER, private_redis.url, str(n)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["ids"] == n
    pending = "many:{many:default}:pending"
    assert admin.llen(pending) == n + 1
    assert admin.lindex(pending, -2).startswith(made["first"].encode())  # in payload order
    assert admin.lindex(pending, 0).startswith(made["last"].encode())
    calls = admin.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert calls >= n // CHUNK_JOBS  # no call carries more than CHUNK_JOBS jobs
    assert made["peak_mb"] < 150, made  # one call of all of them took ~480 MB


def test_a_call_refused_after_others_went_says_which_jobs_were_queued(private_redis: EmbeddedRedis,
                                                                      namespace: str) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    app = App(private_redis.url, namespace, environment="test")
    t = declare(app)["anything"]
    t.enqueue(value=0)  # the script loaded, the queue registered
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", used + 2 * 1024 * 1024)
    payloads = [{"value": "v" * 300} for _ in range(20 * CHUNK_JOBS)]  # ~7 MB: some calls fit, then Redis is full
    with pytest.raises(PartlyEnqueued) as caught:
        app.enqueue_many(t, payloads)
    err = caught.value
    assert 0 < len(err.ids) < len(payloads) and err.positions == list(range(len(err.ids)))
    assert isinstance(err.__cause__, RedisFull) and "were not" in str(err)
    pending = app.broker.keys.queue("default").pending
    assert admin.llen(pending) == 1 + len(err.ids)  # exactly the jobs it names were queued
    admin.config_set("maxmemory", 0)
    rest = app.enqueue_many(t, payloads[len(err.ids):])
    assert admin.llen(pending) == 1 + len(payloads) and len(set(err.ids + rest)) == len(payloads)


# -- redis-py's errors as ringfence's -----------------------------------------------------------------------
PRODUCER_CALLS: dict[str, Callable[[App, dict[str, Any]], Any]] = {
    "enqueue, plain": lambda app, t: t["anything"].enqueue(value=1),
    "enqueue, an id": lambda app, t: t["anything"].with_options(job_id="order-1").enqueue(value=1),
    "enqueue_many": lambda app, t: app.enqueue_many(t["anything"], MANY),
    "aenqueue": lambda app, t: asyncio.run(aenqueue_many(app, t["anything"], MANY[:1])),
    "result": lambda app, t: app.result("quote-1", timeout=1),
    "aresult": lambda app, t: asyncio.run(aresult(app, "quote-1")),
}


async def aresult(app: App, job_id: str, timeout: float = 1.0) -> Any:
    try:
        return await app.aresult(job_id, timeout=timeout)
    finally:
        await app.broker.aclose()


@pytest.mark.parametrize("call", list(PRODUCER_CALLS))
def test_with_redis_stopped_the_producer_raises_cannot_connect(private_redis: EmbeddedRedis, namespace: str,
                                                               call: str) -> None:
    app = App(private_redis.url, namespace, environment="test", redis=ConnectionSettings(connect_timeout_s=1.0))
    t = declare(app)
    if call.startswith("a"):
        asyncio.run(aenqueue_many(app, t["anything"], MANY[:1]))  # connected before the stop
    else:
        app.enqueue_many(t["anything"], MANY[:1])
    private_redis.stop()
    with pytest.raises(CannotConnect) as caught:
        PRODUCER_CALLS[call](app, t)
    assert f"cannot connect to Redis at {private_redis.url}" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value.__cause__, redis.ConnectionError | redis.TimeoutError)


def test_a_command_the_acl_denies_and_an_error_answer_are_ringfence_errors(private_redis: EmbeddedRedis,
                                                                           namespace: str) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    admin.execute_command("ACL", "SETUSER", "producer", *ACL.format(ns=namespace, denied="lindex").split())
    app = App(private_redis.url.replace("redis://", "redis://producer:s3cret@"), namespace, environment="test")
    declare(app)
    with pytest.raises(NotPermitted, match=r"(?i)lindex") as denied:
        app.result("quote-1", timeout=0)
    assert isinstance(denied.value.__cause__, redis.exceptions.NoPermissionError)
    admin.set(app.broker.keys.result("quote-1"), "not a list")
    owner = App(private_redis.url, namespace, environment="test")
    with pytest.raises(BrokerError, match="WRONGTYPE") as wrong:
        owner.result("quote-1", timeout=0)
    assert type(wrong.value) is BrokerError and isinstance(wrong.value.__cause__, redis.ResponseError)
