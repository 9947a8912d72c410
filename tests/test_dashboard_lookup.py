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
# Entries no lookup of 'abc' may take: a prefix or extension of the id, the id inside another entry or spec, the
# id followed by something other than a spec, empty, another case.
DECOYS = [b"ab", b"abcz{}", b"abcd", b"xabc{}", b'{"t":"abc"}', b"abc}", b"", b"ABC{}"]


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
    for at, decoy in enumerate(DECOYS):
        fillers.insert(at * 97, decoy)
    wanted = b'abc{"t":"w"}'
    for place in (0, 199, 200, 201, 299, 300, 301, 599, 600, 908, 909, 910, len(fillers)):  # 909 on: the last 100
        layout = [*fillers[:place], wanted, *fillers[place:]]
        rdb.delete(key)
        rdb.rpush(key, *layout)
        assert app.broker.pending_entry("default", "abc") == wanted, place
        assert app.broker.job_lookup("default", "abc") == ("pending", b'{"t":"w"}'), place
    rdb.delete(key)
    rdb.rpush(key, *fillers)
    assert app.broker.pending_entry("default", "abc") is None
    assert app.broker.job_lookup("default", "abc") == (None, None)


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
    assert web.get("/jobs?id=nosuchjob").status_code == 404
    assert lranges(admin) == 4
    short = App(private_redis.url, "short", environment="test")
    short.task(name="work")(lambda ctx, n: None)
    few = short.enqueue_many("work", [{"n": i} for i in range(OLDEST - 1)])
    admin.config_resetstat()
    assert short.broker.job_state("default", few[OLDEST // 2]) == "pending"
    assert short.broker.job_state("default", "nosuchjob") is None
    assert lranges(admin) == 2  # a list no longer than the oldest entries' read is read whole, once a lookup


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
