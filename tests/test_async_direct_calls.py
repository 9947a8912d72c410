"""Script calls of the asyncio client (``Broker.arun``: the worker's fetch and ack) go over connections kept
aside (redis/raw_calls.py ``AsyncDirectCalls``): the connection rules of redis/connection.py still hold on them."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel
from redis._parsers import _AsyncRESP2Parser

from ringfence import App
from ringfence.redis.connection import ConnectionSettings
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.redis.raw_calls import AsyncDirectCalls


def _app(url: str, **settings: float) -> App:
    return App(url, namespace="adirect-" + os.urandom(4).hex(), redis=ConnectionSettings(**settings))


def _calls(admin: redis.Redis, command: str) -> int:
    return int(admin.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_an_ack_uses_a_kept_connection_and_survives_the_server_closing_it(private_redis: EmbeddedRedis) -> None:
    app = _app(f"redis://127.0.0.1:{private_redis.port}/0")
    b = app.broker
    admin = redis.Redis(port=private_redis.port)

    async def go() -> None:
        assert await b.arun(b.ack("q", [("a", "t")])) == ["a"]  # not leased: refused, as ever
        assert isinstance(b._adirect, AsyncDirectCalls) and len(b._adirect._free) == 1
        evalsha = _calls(admin, "evalsha")
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1  # the kept connection too
        assert await b.arun(b.ack("q", [("b", "t")])) == ["b"]  # one retry on a fresh connection
        assert _calls(admin, "evalsha") == evalsha + 1
        await b.aclose()
        assert b._adirect is None

    asyncio.run(go())
    app.close()
    admin.close()


def test_a_timed_out_call_closes_its_connection_and_the_next_reads_its_own_answer(private_redis: EmbeddedRedis) -> None:
    admin = redis.Redis(port=private_redis.port)
    direct = AsyncDirectCalls(aioredis.Redis(port=private_redis.port, socket_timeout=0.3))

    async def go() -> None:
        await direct.call("SET", "adirect-k", "before")
        sleeper = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", "1"))
        sleeper.start()  # the server stops answering for 1 s; a command sent meanwhile runs after it
        await asyncio.sleep(0.1)
        with pytest.raises(redis.TimeoutError):
            await direct.call("SET", "adirect-k", "late")
        await asyncio.to_thread(sleeper.join)
        assert await direct.call("GET", "adirect-k") == b"late"  # ran once, late; not read as this answer
        await direct.close()

    asyncio.run(go())
    admin.close()


def test_a_call_cancelled_mid_command_closes_its_connection(private_redis: EmbeddedRedis) -> None:
    admin = redis.Redis(port=private_redis.port)
    direct = AsyncDirectCalls(aioredis.Redis(port=private_redis.port))

    async def go() -> None:
        first = await direct.call("CLIENT", "ID")
        sleeper = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", "0.5"))
        sleeper.start()
        await asyncio.sleep(0.1)
        call = asyncio.ensure_future(direct.call("INCR", "adirect-n"))
        await asyncio.sleep(0.1)
        call.cancel()  # shutdown: its reply is still to come
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.to_thread(sleeper.join)
        assert await direct.call("GET", "adirect-n") == b"1"  # the answer read is its own, not the INCR's
        assert await direct.call("CLIENT", "ID") != first  # a new connection
        await direct.close()

    asyncio.run(go())
    admin.close()


def test_a_sentinel_cluster_or_custom_client_keeps_redis_py_s_path() -> None:
    assert not AsyncDirectCalls.usable(aioredis.Redis(single_connection_client=True))
    # A Sentinel pool looks the master up when it hands a connection out: a connection made aside would not.
    assert not AsyncDirectCalls.usable(
        redis.asyncio.sentinel.Sentinel([("127.0.0.1", free_port())]).master_for("mymaster"))

    class Custom(aioredis.Redis):
        pass

    assert not AsyncDirectCalls.usable(Custom())
    assert not AsyncDirectCalls.usable(redis.Redis())  # the sync client is DirectCalls' business
    assert AsyncDirectCalls.usable(aioredis.Redis())


def test_after_a_redis_restart_a_call_reconnects_and_loads_the_script_again(private_redis: EmbeddedRedis) -> None:
    app = _app(f"redis://127.0.0.1:{private_redis.port}/0")
    b = app.broker

    async def go() -> None:
        assert await b.arun(b.ack("q", [("a", "t")])) == ["a"]
        private_redis.stop()
        with pytest.raises(redis.ConnectionError):
            await b.arun(b.ack("q", [("b", "t")]))
        private_redis.start()  # empty: no scripts
        assert await b.arun(b.ack("q", [("c", "t")])) == ["c"]
        await b.aclose()

    asyncio.run(go())
    app.close()


@pytest.mark.parametrize("options", [{"protocol": 2}, {"protocol": 3}, {"parser_class": _AsyncRESP2Parser}],
                         ids=["resp2", "resp3", "no-hiredis"])
def test_each_protocol_and_parser_gives_the_same_replies(private_redis: EmbeddedRedis,
                                                          options: dict[str, object]) -> None:
    pool = aioredis.ConnectionPool(port=private_redis.port, **options)
    direct = AsyncDirectCalls(aioredis.Redis(connection_pool=pool))

    async def go() -> None:
        assert await direct.call("DEL", "adirect-l") in (0, 1)
        assert await direct.call("RPUSH", "adirect-l", "a", b"b", 3, 1.5) == 4
        assert await direct.call("LRANGE", "adirect-l", 0, -1) == [b"a", b"b", b"3", b"1.5"]
        assert await direct.call("EVAL", "return {1, 'x', {2}}", 0) == [1, b"x", [2]]
        big = b"x" * 200_000  # a reply larger than one read
        await direct.call("SET", "adirect-big", big)
        assert await direct.call("GET", "adirect-big") == big
        huge = b"y" * 8_000_000  # more than the socket takes at once: the transport writes the rest, in order
        sets = direct.call("SET", "adirect-huge", huge)
        assert await asyncio.gather(sets, direct.call("GET", "adirect-big")) == [b"OK", big]  # two connections
        assert await direct.call("STRLEN", "adirect-huge") == 8_000_000
        with pytest.raises(redis.ResponseError):
            await direct.call("LPUSH", "adirect-big", "x")  # WRONGTYPE: the connection stays
        with pytest.raises(redis.DataError):
            await direct.call("SET", "adirect-k", object())
        assert len(direct._free) == 2  # one connection did all of it but the GET sent beside the SET
        await direct.close()

    asyncio.run(go())


def test_a_connection_idle_past_the_health_check_interval_is_pinged_first(private_redis: EmbeddedRedis) -> None:
    admin = redis.Redis(port=private_redis.port)
    direct = AsyncDirectCalls(aioredis.Redis(port=private_redis.port, health_check_interval=0.2))

    async def go() -> None:
        await direct.call("SET", "adirect-h", 1)
        pings = _calls(admin, "ping")
        await direct.call("GET", "adirect-h")  # used again at once: no PING
        assert _calls(admin, "ping") == pings
        time.sleep(0.3)
        await direct.call("GET", "adirect-h")  # idle past the interval: redis-py PINGs it first
        assert _calls(admin, "ping") == pings + 1
        await direct.close()

    asyncio.run(go())
    admin.close()
