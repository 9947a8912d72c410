"""The app of tests/test_concurrency_key.py's real worker processes: keyed tasks whose runs record themselves."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

from support import worker_app

app = worker_app()
_r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])
_ns = os.environ["RINGFENCE_NAMESPACE"]
LIMIT = int(os.environ.get("TEST_KEY_LIMIT", "2"))


@app.task(name="per_account", concurrency_key="account:{account}", concurrency_limit=LIMIT)
async def per_account(ctx: Any, account: str, n: int, sleep_s: float = 0.2, first_s: float | None = None) -> None:
    """``test:running:<key>`` counts the key's jobs running now; ``test:peak:<key>`` keeps the most seen at once;
    ``test:start`` lists 'key n start-time' per run; ``test:done`` counts finished runs."""
    now = _r.incr(f"{_ns}:test:running:{account}")
    _r.eval("if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
            "redis.call('SET', KEYS[1], ARGV[1]) end", 1, f"{_ns}:test:peak:{account}", now)
    _r.rpush(f"{_ns}:test:start", f"{account} {n} {time.time()} {os.getpid()}")
    try:
        await asyncio.sleep(first_s if first_s is not None and ctx.attempt == 1 else sleep_s)
    finally:
        _r.decr(f"{_ns}:test:running:{account}")
    _r.incr(f"{_ns}:test:done")


@app.task(name="optional_key", concurrency_key="region:{region}", concurrency_limit=1)
def optional_key(ctx: Any, region: str = "") -> None:
    """Its key needs ``region``, which a payload may leave out (then the job cannot run)."""
    _r.incr(f"{_ns}:test:done")
