"""Script calls of the sync client (``Broker.run``) go over connections kept aside (redis/raw_calls.py): the
connection rules of redis/connection.py still hold on them."""

from __future__ import annotations

import os
import threading
import time

import pytest
import redis
import redis.sentinel
from redis._parsers import _RESP2Parser

from ringfence import App, CannotConnect
from ringfence.redis.connection import ConnectionSettings
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.redis.keys import split_entry
from ringfence.redis.raw_calls import DirectCalls


def _app(url: str, **settings: float) -> App:
    app = App(url, namespace="direct-" + os.urandom(4).hex(), redis=ConnectionSettings(**settings))

    @app.task(name="noop", queue="q")
    def noop(ctx: object, n: int = 0) -> None: ...

    return app


def _pending(app: App) -> list[bytes]:
    entries = app.broker.sync.lrange(app.broker.keys.queue("q").pending, 0, -1)
    return [split_entry(e)[0].encode() for e in entries]  # ids (a job may be inline: '<id><spec>')


def test_an_enqueue_uses_a_kept_connection_and_survives_the_server_closing_it(private_redis: EmbeddedRedis) -> None:
    app = _app(f"redis://127.0.0.1:{private_redis.port}/0")
    first = app.enqueue("noop", n=1)
    assert isinstance(app.broker._direct, DirectCalls)
    admin = redis.Redis(port=private_redis.port)
    killed = admin.client_kill_filter(_type="normal", skipme=True)  # every client of the app, the kept one too
    assert killed >= 1
    second = app.enqueue("noop", n=2)  # one retry on a fresh connection, as redis-py's own client does
    assert sorted(_pending(app)) == sorted([first.encode(), second.encode()])
    app.close()
    admin.close()


def test_a_timed_out_call_runs_once_and_its_late_reply_is_not_read_as_the_next_answer(
        private_redis: EmbeddedRedis) -> None:
    app = _app(f"redis://127.0.0.1:{private_redis.port}/0", socket_timeout_s=0.3)
    app.enqueue("noop", n=0)
    admin = redis.Redis(port=private_redis.port)
    sleeper = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", "1"))
    sleeper.start()  # the server stops answering for 1 s; a script sent meanwhile runs after it
    time.sleep(0.1)
    with pytest.raises(CannotConnect) as timed_out:
        app.enqueue("noop", n=1)
    assert isinstance(timed_out.value.__cause__, redis.TimeoutError)
    sleeper.join()
    third = app.enqueue("noop", n=2)
    pending = _pending(app)
    assert len(pending) == 3  # the timed-out enqueue ran once, late
    assert pending[0] == third.encode()  # the answer read is this call's own, not the late one
    assert app.broker.job_spec("q", third) is not None
    app.close()
    admin.close()


def test_a_sentinel_cluster_or_custom_client_keeps_redis_py_s_path() -> None:
    assert not DirectCalls.usable(redis.Redis(single_connection_client=True))
    # A Sentinel pool looks the master up when it hands a connection out: a connection made aside would not.
    assert not DirectCalls.usable(redis.sentinel.Sentinel([("127.0.0.1", free_port())]).master_for("mymaster"))

    class Custom(redis.Redis):
        pass

    assert not DirectCalls.usable(Custom())
    assert DirectCalls.usable(redis.Redis())


def test_an_enqueue_after_a_redis_restart_reconnects_and_loads_the_script_again(private_redis: EmbeddedRedis) -> None:
    app = _app(f"redis://127.0.0.1:{private_redis.port}/0")
    first = app.enqueue("noop", n=1)
    private_redis.stop()
    with pytest.raises(CannotConnect) as refused:
        app.enqueue("noop", n=2)  # refused: the error reaches the caller, nothing is queued
    assert isinstance(refused.value.__cause__, redis.ConnectionError)
    private_redis.start()  # empty: no jobs, no scripts
    second = app.enqueue("noop", n=3)
    assert _pending(app) == [second.encode()]
    assert second != first
    app.close()


def test_an_error_reply_keeps_the_connection_and_bad_arguments_are_refused_before_sending(
        private_redis: EmbeddedRedis) -> None:
    direct = DirectCalls(redis.Redis(port=private_redis.port))
    assert direct.call("SET", "direct-k", "v") == b"OK"
    with pytest.raises(redis.ResponseError):
        direct.call("LPUSH", "direct-k", "x")  # WRONGTYPE
    with pytest.raises(redis.DataError):
        direct.call("SET", "direct-k", object())
    assert direct.call("GET", "direct-k") == b"v"
    assert len(direct._free) == 1  # one connection did all of it
    direct.close()


@pytest.mark.parametrize("options", [{"protocol": 2}, {"protocol": 3}, {"parser_class": _RESP2Parser}],
                         ids=["resp2", "resp3", "no-hiredis"])
def test_each_protocol_and_parser_gives_the_same_replies(private_redis: EmbeddedRedis,
                                                          options: dict[str, object]) -> None:
    direct = DirectCalls(redis.Redis(connection_pool=redis.ConnectionPool(port=private_redis.port, **options)))
    assert direct.call("DEL", "direct-l") in (0, 1)
    assert direct.call("RPUSH", "direct-l", "a", b"b", 3, 1.5) == 4
    assert direct.call("LRANGE", "direct-l", 0, -1) == [b"a", b"b", b"3", b"1.5"]
    assert direct.call("EVAL", "return {1, 'x', {2}}", 0) == [1, b"x", [2]]
    big = b"x" * 200_000  # a reply larger than the read buffer
    direct.call("SET", "direct-big", big)
    assert direct.call("GET", "direct-big") == big
    direct.close()


def test_a_connection_idle_past_the_health_check_interval_is_pinged_first(private_redis: EmbeddedRedis) -> None:
    app = _app(f"redis://127.0.0.1:{private_redis.port}/0", health_check_interval_s=0.2)
    admin = redis.Redis(port=private_redis.port)
    app.enqueue("noop", n=1)
    pings = admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)
    app.enqueue("noop", n=2)  # used again at once: no PING
    assert admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0) == pings
    time.sleep(0.3)
    app.enqueue("noop", n=3)  # idle past the interval: redis-py PINGs it first
    assert admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0) == pings + 1
    assert len(_pending(app)) == 3
    app.close()
    admin.close()


def test_a_forked_child_never_uses_its_parent_s_connections(private_redis: EmbeddedRedis) -> None:
    app = _app(f"redis://127.0.0.1:{private_redis.port}/0")
    app.enqueue("noop", n=1)
    direct = app.broker._direct
    assert direct is not None
    parent = direct.call("CLIENT", "ID")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, f"{direct.call('CLIENT', 'ID')},{app.enqueue('noop', n=2)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child, child_job = f.read().split(",")
    os.waitpid(pid, 0)
    assert int(child) != parent
    assert direct.call("CLIENT", "ID") == parent  # the parent's connection was left alone
    assert len(_pending(app)) == 2 and child_job.encode() in _pending(app)
    app.close()
