"""The job every library runs, on equal terms: one pipelined round trip to the metrics database.

``job(sent, sleep)``: INCR of the done counter, plus RPUSH of "<sent> <started>" when the producer stamped the
job (latency and SIGKILL figures), else a SET of the start time; then, for the SIGKILL figure, a sleep. The
metrics live in their own Redis database (``PEERS_METRICS_URL``, db 15 of the harness's private server), apart
from the broker's (``PEERS_BROKER_URL``, db 0). Imported by every adapter, in every library's own venv.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis
import redis.asyncio

BROKER_URL = os.environ.get("PEERS_BROKER_URL", "redis://127.0.0.1:6399/0")
METRICS_URL = os.environ.get("PEERS_METRICS_URL", "redis://127.0.0.1:6399/15")
DONE = "peers:done"      # jobs whose body ran
STARTS = "peers:starts"  # "<sent> <started>" (unix seconds) of each stamped job
LAST = "peers:last"      # the start time of the last unstamped job

_sync: tuple[int, redis.Redis] | None = None
_async: dict[tuple[int, int], redis.asyncio.Redis] = {}


def _client() -> redis.Redis:
    global _sync
    if _sync is None or _sync[0] != os.getpid():  # a forked worker child gets its own connections
        _sync = (os.getpid(), redis.Redis.from_url(METRICS_URL))
    return _sync[1]


def _aclient() -> redis.asyncio.Redis:
    key = (os.getpid(), id(asyncio.get_running_loop()))
    if key not in _async:
        _async[key] = redis.asyncio.Redis.from_url(METRICS_URL)
    return _async[key]


def _fill(pipe: Any, sent: float, now: float) -> None:
    pipe.incr(DONE)
    if sent:
        pipe.rpush(STARTS, f"{sent:.6f} {now:.6f}")
    else:
        pipe.set(LAST, f"{now:.6f}")


def body(sent: float = 0.0, sleep: float = 0.0) -> None:
    """The job body for libraries with sync (``def``) handlers."""
    now = time.time()
    pipe = _client().pipeline(transaction=False)
    _fill(pipe, sent, now)
    pipe.execute()
    if sleep:
        time.sleep(sleep)


async def abody(sent: float = 0.0, sleep: float = 0.0) -> None:
    """The same for ``async def`` handlers, on redis-py's asyncio client."""
    now = time.time()
    pipe = _aclient().pipeline(transaction=False)
    _fill(pipe, sent, now)
    await pipe.execute()
    if sleep:
        await asyncio.sleep(sleep)
