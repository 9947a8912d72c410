"""What one fence statement costs the worker, by the way it is sent (``python -m bench.fence_statement [URL]``).

A prepared ``SELECT $1::int`` on a kept psycopg connection, ``--calls`` times in a row per way, wall µs and process
CPU µs (``time.process_time``, threads included) per call: blocking (``Wire.call``, what a ``def`` job's statements
cost), on the event loop (``Wire.arun`` on uvloop, an ``async def`` job's), and the thread hop a sync effect of an
``async def`` job takes (``offloop.py``), empty and around one blocking statement. The async fence's CPU per job
is the sum of these::

    python -m bench.fence_statement postgresql+psycopg://root@127.0.0.1:5432/test --rounds 3
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import uvloop
from sqlalchemy.engine import make_url

from bench.fence_bench import DEFAULT_FENCE_URL
from ringfence.fence.pgwire import Wire, pg_form
from ringfence.offloop import Hop

_FORM = pg_form("SELECT %(x)s::int")
assert _FORM is not None
FORM = _FORM
ARGS: list[bytes | None] = [b"1"]
WARM = 200


def _connect_args(url: str) -> tuple[Any, Any]:
    """psycopg's connect arguments as SQLAlchemy reads them from ``url`` (as the fence's async store does)."""
    u = make_url(url)
    return u.get_dialect()().create_connect_args(u)


def _per_call(calls: int, t0: float, c0: float) -> tuple[float, float]:
    return (time.perf_counter() - t0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def blocking(dsn: Any, calls: int) -> tuple[float, float]:
    with psycopg.connect(*dsn[0], autocommit=True, **dsn[1]) as conn:
        wire = Wire(conn)
        for _ in range(WARM):
            wire.call(FORM, ARGS)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            wire.call(FORM, ARGS)
        return _per_call(calls, t0, c0)


async def _timed(calls: int, one: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    for _ in range(WARM):
        await one()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await one()
    return _per_call(calls, t0, c0)


async def on_loop(dsn: Any, calls: int) -> tuple[float, float]:
    conn = await psycopg.AsyncConnection.connect(*dsn[0], autocommit=True, **dsn[1])
    wire = Wire(conn)
    try:
        return await _timed(calls, lambda: wire.arun(wire.exchange(FORM, ARGS)))
    finally:
        wire.unwatch()
        await conn.close()


async def hop_empty(calls: int) -> tuple[float, float]:
    hop = Hop()
    return await _timed(calls, lambda: hop.run(lambda: None))


async def hop_blocking(dsn: Any, calls: int) -> tuple[float, float]:
    hop = Hop()
    with psycopg.connect(*dsn[0], autocommit=True, **dsn[1]) as conn:
        wire = Wire(conn)
        return await _timed(calls, lambda: hop.run(wire.call, FORM, ARGS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=DEFAULT_FENCE_URL, help="a PostgreSQL URL (psycopg)")
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    dsn, n = _connect_args(args.url), args.calls
    ways: list[tuple[str, Callable[[], tuple[float, float]]]] = [
        ("blocking (Wire.call)", lambda: blocking(dsn, n)),
        ("on the loop (Wire.arun, uvloop)", lambda: uvloop.run(on_loop(dsn, n))),
        ("thread hop, empty", lambda: uvloop.run(hop_empty(n))),
        ("thread hop + blocking statement", lambda: uvloop.run(hop_blocking(dsn, n))),
    ]
    for r in range(1, args.rounds + 1):
        print(f"round {r}, load average {os.getloadavg()[0]:.1f}")
        for name, way in ways:
            wall, cpu = way()
            print(f"  {name:34} {wall:7.1f} µs wall {cpu:7.1f} µs CPU per call")


if __name__ == "__main__":
    main()
