"""The job page's lookup of a pending job by id (``/jobs?id=``): the scan of the pending list that finds an
inline job (keys.py) finds it at every edge of its reads and nothing else; the oldest entries are read first; a
page scans the list once. Timed at 100,000 pending jobs by ``python -m bench.dashboard_bench --lookup``
(docs/dashboard.md)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import redis

from ringfence import App
from ringfence.redis import admin, reads
from ringfence.redis.embedded import EmbeddedRedis
from ringfence.redis.reads import find_entry

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from ringfence.dashboard import create_app

OLDEST = admin.OLDEST_FIRST
JOB = "abcdefghijklmnop"  # the form of a generated id (models.new_job_id): only such an id can be inline


def decoys(job_id: str) -> list[bytes]:
    """Entries no lookup of ``job_id`` may take: a prefix or extension of the id, the id inside another entry or
    spec, the id followed by something other than a spec, empty, another case."""
    i = job_id.encode()
    return [i[:-1], i + b"z{}", i + b"d", b"x" + i + b"{}", b'{"t":"' + i + b'"}', i + b"}", b"", i.upper() + b"{}"]


DECOYS = decoys("abc")


def test_find_entry_takes_the_id_or_the_id_and_a_spec() -> None:
    assert find_entry(DECOYS, "abc") is None
    assert find_entry([*DECOYS, b'abc{"t":"w"}', b"abc"], "abc") == b'abc{"t":"w"}'
    assert find_entry([*DECOYS, b"abc"], "abc") == b"abc"
    assert find_entry([], "abc") is None


def test_a_scan_finds_the_entry_at_every_edge_of_its_reads(make_app: Any, rdb: redis.Redis,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reads, "PENDING_SLICE", 300)  # reads of 0-299, 200-499, 400-699, ...
    monkeypatch.setattr(admin, "OLDEST_FIRST", 100)  # job_lookup reads the last 100 first
    app: App = make_app()
    key = app.broker.keys.queue("default").pending
    fillers = [b"a%05d" % i + (b'{"t":"x"}' if i % 2 else b"") for i in range(1000)]
    for at, decoy in enumerate(decoys(JOB)):
        fillers.insert(at * 97, decoy)
    wanted = JOB.encode() + b'{"t":"w"}'
    for place in (0, 199, 200, 201, 299, 300, 301, 599, 600, 908, 909, 910, len(fillers)):  # 909 on: the last 100
        layout = [*fillers[:place], wanted, *fillers[place:]]
        rdb.delete(key)
        rdb.rpush(key, *layout)
        assert app.broker.pending_entry("default", JOB) == wanted, place
        assert app.broker.job_lookup("default", JOB) == ("pending", b'{"t":"w"}'), place
    rdb.delete(key)
    rdb.rpush(key, *fillers)
    assert app.broker.pending_entry("default", JOB) is None
    assert app.broker.job_lookup("default", JOB) == (None, None)


def lranges(admin: redis.Redis) -> int:
    """LRANGE calls since the last CONFIG RESETSTAT."""
    return int(admin.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))


def test_the_oldest_jobs_are_looked_up_first(private_redis: EmbeddedRedis) -> None:
    app = App(private_redis.url, "lookup", environment="test")
    app.task(name="work")(lambda ctx, n: None)
    ids = app.enqueue_many("work", [{"n": i} for i in range(12_000)])  # ids[0] is the oldest
    admin = redis.Redis.from_url(private_redis.url)
    web = TestClient(create_app(app, token=""))
    # LRANGEs: the oldest entries, then reads of 5,000 newest first (0-4999, 4900-9899, 9800-14799)
    for job_id, reads_made in ((ids[0], 1), (ids[OLDEST - 1], 1), (ids[OLDEST], 4), (ids[-1], 2), (ids[6000], 3)):
        admin.config_resetstat()
        page = web.get(f"/jobs?id={job_id}")
        assert page.status_code == 200 and "pending" in page.text and "work" in page.text
        assert lranges(admin) == reads_made, ids.index(job_id)
    admin.config_resetstat()
    assert web.get(f"/jobs?id={UNKNOWN}").status_code == 404  # an id as generated: it may be inline, so a scan
    assert lranges(admin) == 4
    short = App(private_redis.url, "short", environment="test")
    short.task(name="work")(lambda ctx, n: None)
    few = short.enqueue_many("work", [{"n": i} for i in range(OLDEST - 1)])
    admin.config_resetstat()
    assert short.broker.job_state("default", few[OLDEST // 2]) == "pending"
    assert short.broker.job_state("default", UNKNOWN) is None
    assert lranges(admin) == 2  # a list no longer than the oldest entries' read is read whole, once a lookup


UNKNOWN = JOB  # held by no queue


def test_a_lookup_reads_every_queue_s_records_before_scanning_any_list(private_redis: EmbeddedRedis) -> None:
    """A pending job of a later queue with its record, a dead one, a finished one with its result, an id no
    generated id looks like: none reads the 12,000 pending entries of the first queue; an unknown id of a
    generated id's form does (it could be an inline pending job's)."""
    from ringfence.redis import results

    app = App(private_redis.url, "records", environment="test")
    work = app.task(name="work")(lambda ctx, n: None)
    app.enqueue_many("work", [{"n": i} for i in range(12_000)], queue="a")
    later = work.with_options(queue="b", job_id="order-7").enqueue(n=1)  # its spec in the jobs hash
    b = app.broker
    k = b.keys.queue("b")
    b.sync.zadd(k.dead, {"dead-1": b.clock()})
    b.sync.hset(k.dead_jobs, "dead-1", b'{"spec":"{}","attempts":1,"history":"[]","died_ms":1,"reason":"x",'
                                        b'"error":"boom"}')
    done = "qrstuvwxyz234567"
    b.run(results.store(b, done, b'{"queue":"b","state":"done","task":"work","result":7,"finished_ms":1}', 60_000))
    admin = redis.Redis.from_url(private_redis.url)
    web = TestClient(create_app(app, token=""))
    for job_id, state, status in ((later, "pending", 200), ("dead-1", "dead", 200), (done, "done", 200),
                                  ("nosuchjob", "", 404), ("order-42", "", 404), (UNKNOWN.upper(), "", 404)):
        admin.config_resetstat()
        page = web.get(f"/jobs?id={job_id}")
        assert page.status_code == status and (not state or f'">{state}</span>' in page.text), job_id
        assert lranges(admin) == 0, job_id
    admin.config_resetstat()
    assert web.get(f"/jobs?id={UNKNOWN}").status_code == 404
    assert lranges(admin) >= 3  # the pending list of a (oldest entries, then slices) and of b


def test_a_job_page_scans_the_pending_list_once(private_redis: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    monkeypatch.setattr(reads, "PENDING_SLICE", 150)  # several slices, each one LRANGE in Redis
    app = App(private_redis.url, "lookup", environment="test")
    app.task(name="work")(lambda ctx, n: None)
    ids = app.enqueue_many("work", [{"n": i} for i in range(2 * OLDEST + 500)])
    newer = ids[OLDEST]  # past the oldest entries read first: found by the newest-first scan
    admin = redis.Redis.from_url(private_redis.url)
    admin.config_resetstat()
    assert app.broker.job_lookup("default", newer)[0] == "pending"
    lookup = lranges(admin)
    assert lookup >= 4
    admin.config_resetstat()
    page = TestClient(create_app(app, token="")).get(f"/jobs?id={newer}")
    assert page.status_code == 200 and "pending" in page.text and "work" in page.text
    assert lranges(admin) == lookup
