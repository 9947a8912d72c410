"""The broker's clock (redis/clock.py): Redis TIME read locally through an offset to time.monotonic()."""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio as aioredis

from ringfence.redis.clock import ServerClock
from ringfence.redis.embedded import EmbeddedRedis


def reading(server_ms: float) -> tuple[int, int]:
    return int(server_ms // 1000), int(server_ms % 1000 * 1000)


def test_the_clock_is_redis_time(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    clock = ServerClock(lambda: client)
    seconds, micros = client.time()
    assert abs(clock() - (seconds * 1000 + micros / 1000)) < 50


OFFSET_MS = 4_900_100.0  # Redis's clock minus time.monotonic(), in ms, in the readings below


def offset(clock: ServerClock) -> float:
    return clock.precise() - time.monotonic() * 1000


def test_a_slow_round_trip_does_not_move_a_good_offset() -> None:
    clock = ServerClock(lambda: None)
    clock._update(100.000, reading(100_000.5 + OFFSET_MS), 100.001, time.time())  # a 1 ms round trip
    assert abs(offset(clock) - OFFSET_MS) <= 0.5
    # A loaded host: a 2 s round trip in which Redis answered at its very start. Its middle is 1 s off.
    clock._update(200.000, reading(200_000.0 + OFFSET_MS), 202.000, time.time())
    assert abs(offset(clock) - OFFSET_MS) <= 0.5
    assert clock.rtt_ms == 2000


def test_a_step_of_redis_clock_is_followed_to_within_the_round_trip() -> None:
    clock = ServerClock(lambda: None)
    clock._update(100.000, reading(100_000.5 + OFFSET_MS), 100.001, time.time())
    clock._update(300.000, reading(300_000.5 + OFFSET_MS + 60_000), 300.001, time.time())  # 60 s ahead
    assert abs(offset(clock) - (OFFSET_MS + 60_000)) <= 1
    clock._update(400.000, reading(400_000.5 + OFFSET_MS), 400.001, time.time())  # and back
    assert abs(offset(clock) - OFFSET_MS) <= 1


def _stalled(port: int) -> threading.Thread:
    """Redis stops answering for 0.6 s: a reading sent meanwhile returns at its end, as after a stalled host."""
    sleeper = threading.Thread(target=redis.Redis(port=port).execute_command, args=("DEBUG", "SLEEP", "0.6"))
    sleeper.start()
    time.sleep(0.1)
    return sleeper


def _error_ms(clock: ServerClock, client: redis.Redis) -> float:
    seconds, micros = client.time()
    return abs(clock.precise() - (seconds * 1000 + micros / 1000))


def test_a_slow_first_reading_is_taken_again(private_redis: EmbeddedRedis) -> None:
    """Its middle would be ~0.25 s off, and later readings only narrow: the clock reads again at once."""
    client = redis.Redis(port=private_redis.port)
    clock = ServerClock(lambda: client)
    sleeper = _stalled(private_redis.port)
    clock.measure(client)
    sleeper.join()
    assert _error_ms(clock, client) < 50
    assert clock.rtt_ms < 100


def test_a_slow_first_reading_is_taken_again_async(private_redis: EmbeddedRedis) -> None:
    client = redis.Redis(port=private_redis.port)
    clock = ServerClock(lambda: client)

    async def measure() -> None:
        aio = aioredis.Redis(port=private_redis.port)
        await aio.ping()
        sleeper = _stalled(private_redis.port)
        await clock.ameasure(aio)
        await aio.aclose()
        sleeper.join()

    asyncio.run(measure())
    assert _error_ms(clock, client) < 50
    assert clock.rtt_ms < 100
