"""The app of tests/test_lease_lapse.py's workers: a sync handler that waits for the test's go-ahead (a file)
before opening its fenced step, so the test can stop the process there until its lease lapses; the effect
appends to a file, the charges the test counts. ``probe`` reports the lease deadline Redis holds for its attempt
and the one the worker's lease book knows, then (``lapse``) blocks its event loop, so no heartbeat renews the
lease, until Redis's clock is past that deadline, and asks for an effect; its next attempt asks at once.
``LAPSE_LEASE_S``: the workers' lease (a heartbeat every half of it), else the FAST timings."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import redis

from ringfence import RetryPolicy
from support import worker_app

_lease_s = float(os.environ.get("LAPSE_LEASE_S") or 0)
_slow = {"lease_s": _lease_s, "heartbeat_s": _lease_s / 2, "server_ttl_s": _lease_s} if _lease_s else {}
app = worker_app(fence=True, retry=RetryPolicy(base_s=0.1), **_slow)


@app.task(name="charge", max_attempts=1)
def charge(ctx, where: str, dedup: bool) -> None:
    here = Path(where)
    (here / f"started-{ctx.attempt}").write_text(ctx.token)
    while not (here / "go").exists():
        time.sleep(0.005)
    window = {"provider_dedup": True, "key_window_s": 3600.0} if dedup else {}
    try:
        with ctx.fence("order:1", "charge", params={"amount": 5}, **window) as step:
            step.effect(lambda: _charge(here))
    finally:
        (here / f"finished-{ctx.attempt}").write_text("")


def _charge(here: Path) -> str:
    with (here / "charges").open("a") as f:
        f.write("ch_1\n")
    return "ch_1"


@app.task(name="probe", max_attempts=2)
async def probe(ctx, where: str, lapse: bool) -> None:
    here = Path(where)
    r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])
    if ctx.attempt == 1:
        deadline = int(r.zscore(app.broker.keys.queue(ctx.queue).active, ctx.id) or 0)
        book = ctx.fencing.leases.until.get((ctx.id, ctx.token))
        (here / "seen").write_text(json.dumps({"token": ctx.token, "deadline": deadline, "book": book}))
        if not lapse:
            return
        while _redis_ms(r) <= deadline + 100:  # no await: no heartbeat runs meanwhile
            time.sleep(0.01)
    try:
        with ctx.fence("order:2", "charge", params={"amount": 5}) as step:
            step.effect(lambda: _charge(here))
    except Exception as exc:
        (here / f"finished-{ctx.attempt}").write_text(type(exc).__name__)
        raise
    (here / f"finished-{ctx.attempt}").write_text("charged")


def _redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000
