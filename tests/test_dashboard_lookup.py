"""The job page's lookup of a pending job by id (``/jobs?id=``): the scan of the pending list that finds an
inline job (keys.py) reads it in chunks and answers as a plain walk of the slice does; the oldest entries are read
first; a page scans the list once. Timed at 100,000 pending jobs by ``python -m bench.dashboard_bench --lookup``
(docs/dashboard.md)."""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest
import redis

from ringfence import App
from ringfence.redis import reads
from ringfence.redis.call import Call
from ringfence.redis.embedded import EmbeddedRedis

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from ringfence.dashboard import create_app

CHUNK = 1000  # entries per LRANGE inside pending_entry.lua


def walk(entries: list[bytes], job_id: bytes, first: int, n: int) -> tuple[bytes, int]:
    """pending_entry.lua's answer, written as the plain walk of the slice it stands for."""
    first = max(0, len(entries) + first) if first < 0 else first
    part = entries[first:first + n]
    for entry in part:
        if entry == job_id or entry.startswith(job_id + b"{"):
            return entry, first
    return b"", -1 if len(part) < n else first + n


def test_the_chunked_scan_answers_as_a_walk_of_the_slice(make_app: Any, rdb: redis.Redis) -> None:
    app: App = make_app()
    key = app.broker.keys.queue("default").pending
    rng = random.Random(7)
    # Fillers share the wanted ids' first byte; decoys are an id's prefix or extension, its spec without the id,
    # the id followed by something other than a spec, empty entries.
    entries = [b"a%05d" % i + (b'{"t":"x"}' if i % 2 else b"") for i in range(2 * CHUNK + 600)]
    decoys = [b"ab", b"abcz{}", b"abcd", b"xabc{}", b'{"t":"abc"}', b"abc}", b"", b"ABC{}"]
    for d in decoys:
        entries.insert(rng.randrange(len(entries)), d)
    wanted = {b"abc": b'abc{"t":"w"}', b"zz": b"zz", b"q1": b'q1{"a":{"b":1}}'}
    places = {b"abc": [0, CHUNK - 1, CHUNK, CHUNK + 1], b"zz": [2 * CHUNK - 1, 2 * CHUNK], b"q1": [-1]}
    for job_id, at in places.items():
        for place in at:
            layout = list(entries)
            layout.insert(place if place >= 0 else len(layout), wanted[job_id])
            rdb.delete(key)
            rdb.rpush(key, *layout)
            size = len(layout)
            for first in (0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 1, size - 1, size, size + 5, -1, -CHUNK, -size - 3):
                for n in (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 20_000, size - first, -first):
                    if n < 1:
                        continue
                    got = app.broker.run(Call("pending_entry", [key], [job_id, first, n],
                                              lambda raw: (bytes(raw[0]), int(raw[1]))))
                    assert got == walk(layout, job_id, first, n), (job_id, place, first, n)
            assert app.broker.pending_entry("default", job_id.decode()) == wanted[job_id]
    for missing in (b"ab", b"abcd", b"nosuch"):
        rdb.delete(key)
        rdb.rpush(key, *[e for e in entries if e not in (missing,)])
        assert app.broker.pending_entry("default", missing.decode()) is None


def lranges(admin: redis.Redis) -> int:
    """LRANGE calls (scripts' included) since the last CONFIG RESETSTAT: pending_entry.lua makes one per chunk."""
    return int(admin.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))


def test_the_oldest_jobs_are_looked_up_first(private_redis: EmbeddedRedis) -> None:
    app = App(private_redis.url, "lookup", environment="test")
    app.task(name="work")(lambda ctx, n: None)
    ids = app.enqueue_many("work", [{"n": i} for i in range(5 * CHUNK)])  # ids[0] is the oldest
    admin = redis.Redis.from_url(private_redis.url)
    web = TestClient(create_app(app, token=""))
    for job_id, reads_of_chunks in ((ids[0], 1), (ids[CHUNK - 1], 1), (ids[-1], 2), (ids[CHUNK], 5)):
        admin.config_resetstat()
        page = web.get(f"/jobs?id={job_id}")
        assert page.status_code == 200 and "pending" in page.text and f"{ids.index(job_id)}" in page.text
        assert lranges(admin) == reads_of_chunks, job_id
    admin.config_resetstat()
    assert web.get("/jobs?id=nosuchjob").status_code == 404
    assert lranges(admin) == 1 + 6  # the oldest, then newest first: 5 chunks and the empty read past the end
    short = App(private_redis.url, "short", environment="test")
    short.task(name="work")(lambda ctx, n: None)
    few = short.enqueue_many("work", [{"n": i} for i in range(CHUNK - 1)])
    admin.config_resetstat()
    assert short.broker.job_state("default", few[CHUNK // 2]) == "pending"
    assert short.broker.job_state("default", "nosuchjob") is None
    assert lranges(admin) == 2  # a list no longer than the oldest entries' read is read whole, once a lookup


def test_a_job_page_scans_the_pending_list_once(private_redis: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    monkeypatch.setattr(reads, "PENDING_SLICE", 150)  # several slices, each one LRANGE in Redis
    app = App(private_redis.url, "lookup", environment="test")
    app.task(name="work")(lambda ctx, n: None)
    ids = app.enqueue_many("work", [{"n": i} for i in range(2 * CHUNK + 500)])
    newer = ids[CHUNK]  # past the oldest entries read first: found by the newest-first scan
    admin = redis.Redis.from_url(private_redis.url)
    admin.config_resetstat()
    assert app.broker.job_lookup("default", newer)[0] == "pending"
    lookup = lranges(admin)
    assert lookup >= 4
    admin.config_resetstat()
    page = TestClient(create_app(app, token="")).get(f"/jobs?id={newer}")
    assert page.status_code == 200 and "pending" in page.text and "work" in page.text
    assert lranges(admin) == lookup
