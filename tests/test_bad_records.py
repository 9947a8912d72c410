"""Bad records written straight into Redis (by hand, a bug, another program): the worker dead-letters each once
as ``bad_record`` naming the field and the value's type, and every reading command still answers."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringfence import App
from ringfence.cli import main as cli
from ringfence.doctor import Thresholds, diagnose
from ringfence.errors import BadRecord, ConfigError, DuplicateJob, PayloadError
from ringfence.metrics import QueueCollector
from ringfence.models import JobSpec
from ringfence.queries import DeadFilter, dead_jobs, find_dead, info
from support import wait_until

GOOD: dict[str, Any] = {"t": "noop", "v": 1, "e": 0, "a": {"n": 1}}

# (name, record bytes, text the dead-letter error must contain)
CORPUS: list[tuple[str, bytes, str]] = [
    ("max_attempts_str", orjson.dumps({**GOOD, "m": "5"}), "'m' (max_attempts) holds a string"),
    ("task_list", orjson.dumps({**GOOD, "t": ["noop"]}), "'t' (task) holds a list"),
    ("timeout_str", orjson.dumps({**GOOD, "to": "10"}), "'to' (timeout_ms) holds a string"),
    ("expires_obj", orjson.dumps({**GOOD, "x": {"a": 1}}), "'x' (expires_ms) holds an object"),
    ("version_bool", orjson.dumps({**GOOD, "v": True}), "'v' (version) holds a boolean"),
    ("enqueued_str", orjson.dumps({**GOOD, "e": "now"}), "'e' (enqueued_ms) holds a string"),
    ("args_list", orjson.dumps({**GOOD, "a": [1, 2]}), "'a' (args) holds a list"),
    ("no_task", orjson.dumps({k: v for k, v in GOOD.items() if k != "t"}), "'t' (task) is missing"),
    ("no_args", orjson.dumps({k: v for k, v in GOOD.items() if k != "a"}), "'a' (args) is missing"),
    ("array", b"[1,2,3]", "spec is a list"),
    ("not_json", b"{nope", "not valid JSON"),
    ("bad_utf8", b'{"t":"\xff\xfe","v":1,"e":0,"a":{}}', "not valid JSON"),
    ("empty", b"", "not valid JSON"),
]


def now_doc(doc: bytes) -> bytes:
    """Stamp a fresh enqueue time into a record that has a numeric one (so expiry does not decide first)."""
    try:
        parsed = orjson.loads(doc)
    except orjson.JSONDecodeError:
        return doc
    if isinstance(parsed, dict) and parsed.get("e") == 0:
        parsed["e"] = time.time() * 1000
        return orjson.dumps(parsed)
    return doc


def write_job(rdb: redis.Redis, app: App, queue: str, job_id: str, record: bytes) -> None:
    k = app.broker.keys.queue(queue)
    rdb.hset(k.jobs, job_id, record)
    rdb.lpush(k.pending, job_id)
    rdb.sadd(app.broker.keys.queues, queue)


def reading_commands_answer(app: App, namespace: str, redis_url: str) -> dict[str, Any]:
    """Run every reading command the way an operator does; each must exit as designed and print JSON."""
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace}
    runner = CliRunner()
    out: dict[str, Any] = {}
    res = runner.invoke(cli, ["dead", "list", "--json", "--limit", "1000"], env=env)
    assert res.exit_code == 0, res.output
    out["dead"] = orjson.loads(res.output)
    for job in out["dead"][:3]:
        res = runner.invoke(cli, ["dead", "show", job["id"]], env=env)
        assert res.exit_code == 0 and orjson.loads(res.output)["id"] == job["id"], res.output
    res = runner.invoke(cli, ["info", "--json"], env=env)
    assert res.exit_code == 0, res.output
    out["info"] = orjson.loads(res.output)
    res = runner.invoke(cli, ["info"], env=env)
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["doctor", "--json", "--sample-s", "0"], env=env)
    assert res.exit_code in (0, 1, 2), res.output
    report = orjson.loads(res.output)
    failed_checks = [f for f in report["findings"] if "the check failed" in f["symptom"]]
    assert failed_checks == [], failed_checks
    metrics = list(QueueCollector(app.broker).collect())
    up = next(m for m in metrics if m.name == "ringfence_redis_up")
    assert up.samples[0].value == 1
    out["metrics"] = metrics
    return out


def test_each_bad_record_is_dead_lettered_once_naming_the_field(make_app, rdb, spawn_worker, namespace,
                                                                redis_url) -> None:
    app = make_app()
    for name, record, _ in CORPUS:
        write_job(rdb, app, "default", name, now_doc(record))
    rdb.lpush(app.broker.keys.queue("default").pending, "dangling1")  # an id without a record
    spawn_worker("--queues", "default")
    wait_until(lambda: app.broker.queue_counts("default")["dead"] == len(CORPUS), timeout=30)
    time.sleep(1.0)  # a record that looped would show a second attempt by now
    counts = app.broker.queue_counts("default")
    assert counts["stats"]["dead"] == len(CORPUS) and counts["pending"] == counts["active"] == 0
    assert counts["retry"] == counts["scheduled"] == 0
    assert counts["stats"].get("dangling") == 1
    for name, _, expected in CORPUS:
        job = find_dead(app.broker, name)
        assert job is not None and job.reason == "bad_record", (name, job)
        assert expected in job.error, (name, job.error)
        assert job.attempts == 1, (name, job.attempts)
    out = reading_commands_answer(app, namespace, redis_url)
    assert {d["id"] for d in out["dead"]} == {n for n, _, _ in CORPUS}
    assert [d for d in out["dead"] if d["reason"] != "bad_record" or not d.get("malformed")] == []
    [q] = out["info"]["queues"]
    assert q["dead"] == len(CORPUS) and q["dangling"] == 1


def test_malformed_dead_records_are_listed_marked_and_deletable(make_app, rdb, namespace, redis_url) -> None:
    app = make_app()
    k = app.broker.keys.queue("default")
    rdb.sadd(app.broker.keys.queues, "default")
    good_spec = JobSpec(task="noop", args={"n": 1}, enqueued_ms=1.0).encode().decode()
    records = {
        "notjson": b"{oops",
        "badutf8": b'{"spec":"\xff","reason":"permanent"}',
        "nospec": orjson.dumps({"reason": "permanent", "error": "boom", "died_ms": 5}),
        "badhistory": orjson.dumps({"spec": good_spec, "history": "[not json", "reason": "permanent"}),
        "good": orjson.dumps({"spec": good_spec, "attempts": 1, "history": "[]", "died_ms": 7,
                              "reason": "permanent", "error": "E", "traceback": "", "task": "noop"}),
    }
    for i, (job_id, record) in enumerate(records.items()):
        rdb.hset(k.dead_jobs, job_id, record)
        rdb.zadd(k.dead, {job_id: i})
    # Pending and history entries that are not ours either: info and the doctor read around them.
    write_job(rdb, app, "default", "pend1", b"\xff\xfe")
    rdb.hset(k.history, "pend1", b"{not a list")
    rdb.hset(k.stats, "processed", b"abc")
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace}
    out = reading_commands_answer(app, namespace, redis_url)
    by_id = {d["id"]: d for d in out["dead"]}
    assert set(by_id) == set(records)
    assert {i for i, d in by_id.items() if d.get("malformed")} == {"notjson", "badutf8", "nospec", "badhistory"}
    assert by_id["good"]["args"] == {"n": 1} and "malformed" not in by_id["good"]
    [q] = out["info"]["queues"]
    assert q["dead"] == 5 and q["pending"] == 1 and q["versions"] == {"malformed": 1}
    res = CliRunner().invoke(cli, ["dead", "replay", "--all"], env=env)
    assert res.exit_code == 0, res.output
    assert "replayed 1 job(s)" in res.output and "malformed record(s)" in res.output
    res = CliRunner().invoke(cli, ["dead", "delete", "notjson", "badutf8", "nospec", "badhistory"], env=env)
    assert res.exit_code == 0 and "deleted 4 job(s)" in res.output, res.output
    assert rdb.hlen(k.dead_jobs) == 0 and rdb.zcard(k.dead) == 0


# -- the decoder on any corrupted record ------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    """A good record with one field replaced by any JSON value or removed, or arbitrary bytes."""
    kind = draw(st.sampled_from(["replace", "remove", "bytes", "truncate"]))
    doc: dict[str, Any] = {**GOOD, "m": 3, "to": 1000, "x": 10}
    key = draw(st.sampled_from(sorted(doc)))
    if kind == "replace":
        doc[key] = draw(json_values)
    elif kind == "remove":
        del doc[key]
    elif kind == "bytes":
        return draw(st.binary(max_size=40))
    raw = orjson.dumps(doc)
    return raw[: draw(st.integers(0, len(raw)))] if kind == "truncate" else raw


@settings(max_examples=300, deadline=None, derandomize=True)
@given(corrupted())
def test_decoder_accepts_only_the_wire_format(raw: bytes) -> None:
    try:
        spec = JobSpec.decode(raw)
    except BadRecord as exc:
        assert str(exc)  # names what is wrong
        return
    assert isinstance(spec.task, str) and isinstance(spec.args, dict)
    assert type(spec.version) is int and type(spec.enqueued_ms) in (int, float)
    for value in (spec.max_attempts, spec.timeout_ms):
        assert value is None or type(value) is int
    assert spec.expires_ms is None or type(spec.expires_ms) in (int, float)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(corrupted(), st.integers(1, 64))
def test_head_decoding_agrees_with_the_full_decoder(raw: bytes, keep: int) -> None:
    """Readers that only load a spec's head never see a field the full decoder would refuse."""
    try:
        full: JobSpec | None = JobSpec.decode(raw)
    except BadRecord:
        full = None
    try:
        head = JobSpec.decode_head(raw[:keep], len(raw))
    except BadRecord:
        return  # a head may refuse what the full record accepts only when it was cut before "a"
    if full is not None:
        assert (head.task, head.version, head.enqueued_ms) == (full.task, full.version, full.enqueued_ms)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(corrupted(), min_size=1, max_size=6))
def test_reading_commands_survive_any_corrupted_records(make_app, rdb, records: list[bytes]) -> None:
    app = make_app()
    k = app.broker.keys.queue("default")
    rdb.delete(k.jobs, k.pending, k.dead, k.dead_jobs)
    rdb.sadd(app.broker.keys.queues, "default")
    for i, raw in enumerate(records):
        rdb.hset(k.jobs, f"j{i}", raw)
        rdb.lpush(k.pending, f"j{i}")
        rdb.hset(k.dead_jobs, f"d{i}", raw)  # as a whole dead record
        rdb.hset(k.dead_jobs, f"s{i}", orjson.dumps({"spec": raw.decode(errors="replace"), "reason": "x"}))
        rdb.zadd(k.dead, {f"d{i}": i, f"s{i}": i})
    listed = dead_jobs(app.broker, DeadFilter())
    assert len(listed) == 2 * len(records)
    [q] = info(app.broker)
    assert q["pending"] == len(records) and sum(q["versions"].values()) == len(records)
    report = diagnose(app, Thresholds(sample_s=0))
    assert not [f for f in report.findings if "the check failed" in f.symptom]
    assert list(QueueCollector(app.broker).collect())


@pytest.mark.parametrize("size", [10, 2000])
def test_spec_heads_never_carry_the_payload(make_app, rdb, size: int) -> None:
    app = make_app()

    @app.task
    async def big(ctx, blob: str) -> None: ...

    job = big.with_options(job_id="j1").enqueue(blob="x" * size)  # an explicit id: the spec is in the jobs hash
    [(head, total)], exact = app.broker.run(app.broker.spec_heads("default", [job]))
    assert exact and total == rdb.hstrlen(app.broker.keys.queue("default").jobs, job)
    assert len(head) == min(total, 512)
    spec = JobSpec.decode_head(head, total)
    assert spec.task == big.name and (spec.args == {"blob": "x" * size} if size < 400 else spec.args == {})
    big.enqueue(blob="y" * size)  # a generated id: inline in pending when small (keys.py); the sample reads both
    heads, exact = app.broker.spec_sample("default")
    assert exact and len(heads) == 2 and all(len(h) == min(n, 512) for h, n in heads)
    assert sorted(JobSpec.decode_head(h, n).args.get("blob", "")[:1] for h, n in heads) == (
        ["x", "y"] if size < 400 else ["", ""])


def test_payload_cap_refuses_at_enqueue_naming_the_size(make_app, rdb) -> None:
    app = make_app(max_payload_bytes=1000)

    @app.task
    async def big(ctx, blob: str) -> None: ...

    with pytest.raises(PayloadError, match=r"the job is 1,1\d\d bytes, above max_payload_bytes=1,000"):
        big.enqueue(blob="x" * 1000)
    assert rdb.hlen(app.broker.keys.queue("default").jobs) == 0
    big.enqueue(blob="x" * 800)
    with pytest.raises(ConfigError, match="max_payload_bytes"):
        make_app(max_payload_bytes=0)
    assert make_app().max_payload_bytes == 1024 * 1024


def test_enqueue_tells_the_truth_when_retried_and_never_stores_without_queueing(make_app, rdb) -> None:
    app = make_app()

    @app.task
    async def noop(ctx, n: int) -> None: ...

    b = app.broker
    k = b.keys.queue("default")
    spec = JobSpec(task=noop.name, args={"n": 1}, enqueued_ms=1.5).encode()
    call = b.enqueue("default", [("j1", spec, 0)])
    assert b.run(call) == [True]
    assert b.run(call) == [True]  # the same call again (its reply was lost): the job it stored is its own
    assert rdb.llen(k.pending) == 1
    other = JobSpec(task=noop.name, args={"n": 2}, enqueued_ms=2.5).encode()
    assert b.run(b.enqueue("default", [("j1", other, 0)])) == [False]  # another job under that id
    with pytest.raises(DuplicateJob, match="job id 'j1' exists already"):
        noop.with_options(job_id="j1", raise_on_duplicate=True).enqueue(n=3)
    assert noop.with_options(job_id="j1").enqueue(n=3) == "j1"
    # A bad argument in the second job of a batch: the script refuses before writing anything.
    with pytest.raises(redis.ResponseError, match="must be numbers"):
        b.run(b.enqueue("default", [("j2", spec, 0), ("j3", spec, "soon")]))  # type: ignore[list-item]
    assert not rdb.hexists(k.jobs, "j2") and rdb.llen(k.pending) == 1


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(corrupted(), min_size=3, max_size=8))
def test_the_worker_dead_letters_every_undecodable_record_once(make_app, rdb, records: list[bytes]) -> None:
    import asyncio

    from ringfence.worker.worker import Worker

    app = make_app()

    @app.task(name="noop")
    async def noop(ctx, **_: Any) -> None: ...

    k = app.broker.keys.queue("default")
    rdb.delete(k.jobs, k.pending, k.dead, k.dead_jobs, k.attempts, k.stats, k.scheduled, k.retry, k.active, k.lease)
    bad = set()
    for i, raw in enumerate(records):
        raw = now_doc(raw)
        write_job(rdb, app, "default", f"j{i}", raw)
        try:
            JobSpec.decode(raw)
        except BadRecord:
            bad.add(f"j{i}")

    async def run() -> None:
        worker = Worker(app, [("default", 1)])
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 15
        while app.broker.queue_counts("default")["pending"] or not bad <= set(app.broker.dead_ids("default")):
            assert time.monotonic() < deadline and not runner.done()
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # a looping record would be fetched again meanwhile
        worker.request_stop()
        await asyncio.wait_for(runner, 10)

    asyncio.run(run())
    for job in dead_jobs(app.broker, DeadFilter()):
        if job.id in bad:
            assert job.reason == "bad_record" and job.attempts == 1 and job.malformed, job
    assert all(app.broker.attempts("default", i) == 0 for i in bad)  # nothing left to run again
    [q] = info(app.broker)
    assert q["dead"] >= len(bad)
