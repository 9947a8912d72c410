"""Script calls of the sync client on connections kept aside, without redis-py's per-command machinery.

``Redis.evalsha`` costs ~70-90 µs of CPU per call in redis-py 8 (a pool checkout that polls the socket,
observability hooks, a retry closure); a ``task.enqueue`` is one such call, so it was most of a producer's
cost. Here a call takes a connection of the client's own kind (``pool.make_connection()``: same address, auth,
TLS, timeouts, health checks) from a free list, writes the command packed by hiredis to the connection's socket
and reads the reply with the connection's own hiredis reader: 21 % fewer instructions per ``task.enqueue`` than
redis-py's ``send_command``/``read_response``. redis-py still connects, authenticates and runs the health-check
PING (a new or idle connection goes through those two) and reads a RESP3 push message. The rules of
``connection.py`` stay: one retry after a connection error (the connection reconnects), none after a timeout (the
script may have run); a connection that failed mid-command is closed before it is reused. The parser module and a
connection's attributes are redis-py's private parts: :func:`unknown` checks them, and a client whose pool does
not have them (or caches replies client-side) keeps redis-py's path (docs/architecture.md, "Dependencies").
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from ringfence.redis.connection import note_resend


def _load() -> tuple[Any, Any, str]:
    """hiredis, redis-py's (private) hiredis parser module, and what is missing from them ('' if nothing)."""
    try:
        import hiredis

        parsers = importlib.import_module("redis._parsers.hiredis")
    except ImportError as exc:
        return None, None, f"{exc.name or 'hiredis'} is not importable"
    wanted = ("NOT_ENOUGH_DATA", "_HiredisParser", "_AsyncHiredisParser")
    missing = [f"redis._parsers.hiredis.{name}" for name in wanted if not hasattr(parsers, name)]
    missing += [] if hasattr(hiredis, "pack_command") else ["hiredis.pack_command"]
    return hiredis, parsers, (f"{', '.join(missing)} not found" if missing else "")


# When redis-py moves or changes its parser module, every call takes redis-py's public path.
hiredis, _parsers, _MISSING = _load()
NOT_ENOUGH_DATA: Any = getattr(_parsers, "NOT_ENOUGH_DATA", None)
_HiredisParser: Any = getattr(_parsers, "_HiredisParser", None)
_AsyncHiredisParser: Any = getattr(_parsers, "_AsyncHiredisParser", None)

log = logging.getLogger("ringfence.redis")
_CLOSED = "Connection closed by server."
_HIGH_WATER = 1 << 16  # bytes left in a transport's buffer past which a write waits for it to drain
# hiredis >= 3.2 marks RESP3 push messages; redis-py < 6.2 has no handle_push_response to give them to.
_PUSH = (getattr(hiredis, "PushNotification", None)
         if hasattr(_HiredisParser, "handle_push_response") and hasattr(_AsyncHiredisParser, "handle_push_response")
         else None)
_KNOWN_SYNC = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)
_KNOWN_ASYNC = (aioredis.Connection, aioredis.SSLConnection, aioredis.UnixDomainSocketConnection)
_SYNC_ATTRS = ("_sock", "_parser", "health_check_interval", "next_health_check", "protocol")
_ASYNC_ATTRS = ("_reader", "_writer", "_parser", "health_check_interval", "next_health_check", "protocol",
                "socket_timeout")
_told: set[str] = set()  # reasons already logged: one line per process, not one per client
_ERRORS = (redis.ResponseError, redis.ConnectionError)  # replies that hiredis hands back as exceptions
_forks = [0]  # forks of this process so far, counted in the child (cheaper than a getpid system call per call)
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class DirectCalls:
    def __init__(self, client: redis.Redis) -> None:
        self.pool = client.connection_pool
        self._free: list[Any] = []
        self._forks = _forks[0]

    @staticmethod
    def usable(client: Any) -> bool:
        """Only a plain client on a plain pool: not a cluster, a subclass or a single-connection client, and not
        Sentinel (its pool finds the master when it hands out a connection, not when one is made); and only when
        redis-py's internals are those this module reads (see :func:`unknown`)."""
        return (type(client) is redis.Redis and getattr(client, "connection", None) is None
                and type(client.connection_pool) in (redis.ConnectionPool, redis.BlockingConnectionPool)
                and not _refused(unknown(client.connection_pool, _KNOWN_SYNC, _SYNC_ATTRS)))

    def call(self, *args: Any) -> Any:
        try:
            packed = pack(args)  # the bytes redis-py's own packer sends
        except TypeError as exc:
            raise redis.DataError(exc) from None
        return self.send(packed)

    def send(self, packed: bytes) -> Any:
        """The reply to one command already packed (RESP), with the retry rules above."""
        if self._forks != _forks[0]:  # a forked child: the parent's sockets are not ours to use
            self._free, self._forks = [], _forks[0]
        free = self._free
        try:
            conn = free.pop()  # atomic under the GIL: each thread gets its own connection
        except IndexError:
            conn = self.pool.make_connection()
        try:
            for attempt in (0, 1):
                try:
                    return self._round_trip(conn, packed)
                except redis.ConnectionError:
                    conn.disconnect()  # the next send reconnects
                    if attempt:
                        raise
        except redis.ResponseError:
            raise  # an error reply: the connection is clean
        except BaseException:
            conn.disconnect()  # a timeout or an interrupt mid-command: the reply may still be on its way
            raise
        finally:
            free.append(conn)
        raise AssertionError("unreachable")

    def _round_trip(self, conn: Any, packed: bytes) -> Any:
        sock = conn._sock
        interval = conn.health_check_interval
        parser = conn._parser
        now = time.monotonic() if interval else 0.0
        if (sock is None or (interval and now > conn.next_health_check)
                or type(parser) is not _HiredisParser or (_PUSH is None and conn.protocol not in (2, "2"))):
            # Not connected, idle past the health-check interval, no hiredis, or RESP3 with a hiredis that cannot
            # tell a push message from a reply: redis-py's own send and read (they connect, PING, handle pushes).
            conn.send_packed_command([packed])
            return conn.read_response()
        reader, buffer = parser._reader, parser._buffer
        try:
            sock.sendall(packed)
            reply = reader.gets()
            while reply is NOT_ENOUGH_DATA:
                n = sock.recv_into(buffer)
                if not n:
                    raise redis.ConnectionError(_CLOSED)
                reader.feed(buffer, 0, n)
                reply = reader.gets()
        except TimeoutError:  # socket.timeout: the connection's socket_timeout_s passed
            raise redis.TimeoutError("Timeout talking to Redis") from None
        except OSError as exc:
            raise redis.ConnectionError(f"Error while talking to Redis: {exc}") from None
        if _PUSH is not None and type(reply) is _PUSH:  # RESP3: a push message came first (server maintenance)
            parser.handle_push_response(reply)
            return conn.read_response()  # the reply itself, read by redis-py
        if interval:
            conn.next_health_check = now + interval  # the time the call started: a round trip earlier at most
        if isinstance(reply, _ERRORS):
            raise reply
        return reply

    def close(self) -> None:
        free, self._free = self._free, []
        for conn in free:
            conn.disconnect()


class AsyncDirectCalls:
    """The same for the asyncio client (the worker's fetch and ack scripts): ``Redis.evalsha`` there costs a
    pool checkout, a retry closure and an ``asyncio.wait_for`` Task per write, all on the loop while it holds
    the GIL the job threads wait for. Here a call writes the packed command to a kept connection's transport and
    reads the reply with its own hiredis reader, under one ``asyncio.timeout`` of the connection's
    ``socket_timeout``. Same fallbacks and retry rules as above; a call cancelled mid-command (shutdown) closes
    its connection."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.pool = client.connection_pool
        self._free: list[Any] = []
        self._fds: dict[int, tuple[Any, int]] = {}  # id(connection) -> (its writer, its socket's fd or -1)

    @staticmethod
    def usable(client: Any) -> bool:
        """Only a plain client on a plain pool (as ``DirectCalls.usable``)."""
        return (type(client) is aioredis.Redis and not getattr(client, "single_connection_client", True)
                and type(client.connection_pool) in (aioredis.ConnectionPool, aioredis.BlockingConnectionPool)
                and not _refused(unknown(client.connection_pool, _KNOWN_ASYNC, _ASYNC_ATTRS)))

    async def call(self, *args: Any) -> Any:
        try:
            packed = pack(args)
        except TypeError as exc:
            raise redis.DataError(exc) from None
        free = self._free
        # One call per connection at a time (a connection left the free list while its call runs).
        conn = free.pop() if free else self.pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            for attempt in (0, 1):
                try:
                    return await self._round_trip(conn, packed)
                except redis.ConnectionError:
                    await _disconnect(conn)  # the next call reconnects
                    if attempt:
                        raise
                    note_resend()  # the command may have run: its caller can tell (connection.resent)
        except redis.ResponseError:
            raise  # an error reply: the connection is clean
        except BaseException:
            await _disconnect(conn)  # a timeout or a cancellation mid-command: the reply may still be on its way
            raise
        finally:
            free.append(conn)
        raise AssertionError("unreachable")

    async def _round_trip(self, conn: Any, packed: bytes) -> Any:
        parser, writer = conn._parser, conn._writer
        interval = conn.health_check_interval
        now = asyncio.get_running_loop().time() if interval else 0.0
        if (writer is None or conn._reader is None or (interval and now > conn.next_health_check)
                or type(parser) is not _AsyncHiredisParser or (_PUSH is None and conn.protocol not in (2, "2"))):
            # Not connected, idle past the health-check interval, no hiredis, or RESP3 with an old hiredis:
            # redis-py's own send and read (they connect, PING, handle pushes).
            await conn.send_packed_command(packed)
            return await conn.read_response()
        reader: Any = parser._reader
        stream = conn._reader
        try:
            async with asyncio.timeout(conn.socket_timeout):
                self._write(conn, writer, packed)
                if writer.transport.get_write_buffer_size() > _HIGH_WATER:
                    await writer.drain()
                reply = reader.gets()
                while reply is NOT_ENOUGH_DATA:
                    data = await stream.read(65536)
                    if not data:
                        raise redis.ConnectionError(_CLOSED)
                    reader.feed(data)
                    reply = reader.gets()
        except TimeoutError:
            raise redis.TimeoutError("Timeout talking to Redis") from None
        except OSError as exc:
            raise redis.ConnectionError(f"Error while talking to Redis: {exc}") from None
        if _PUSH is not None and type(reply) is _PUSH:  # RESP3: a push message came first
            await parser.handle_push_response(reply)
            return await conn.read_response()
        if interval:
            conn.next_health_check = now + interval
        if isinstance(reply, _ERRORS):
            raise reply
        return reply

    def _write(self, conn: Any, writer: Any, packed: bytes) -> None:
        """Write ``packed`` to the socket with the GIL released (``os.write``), the job threads running meanwhile;
        the transport's ``write`` (uvloop) makes the same system call holding it. A TLS connection, a transport
        with bytes still queued, or a full socket buffer: the transport writes (the rest), in order."""
        found = self._fds.get(id(conn))
        if found is None or found[0] is not writer:  # a new connection, or this one reconnected
            transport = writer.transport
            sock = transport.get_extra_info("socket")
            fd = sock.fileno() if sock is not None and transport.get_extra_info("sslcontext") is None else -1
            found = self._fds[id(conn)] = (writer, fd)
        fd, transport = found[1], writer.transport
        n = 0
        # A closing transport may have closed its fd already (and the number been reused): never write to it.
        if fd >= 0 and not transport.is_closing() and not transport.get_write_buffer_size():
            try:
                n = os.write(fd, packed)
            except BlockingIOError:
                n = 0
        if n < len(packed):
            writer.write(packed[n:] if n else packed)

    async def close(self) -> None:
        free, self._free = self._free, []
        self._fds.clear()
        for conn in free:
            await _disconnect(conn)


def pack(args: tuple[Any, ...]) -> bytes:
    """``args`` as one RESP command (only where :func:`unknown` found nothing missing: hiredis is there)."""
    packed: bytes = hiredis.pack_command(args)
    return packed


def unknown(pool: Any, known: tuple[type, ...], attrs: tuple[str, ...]) -> str:
    """Why the kept connections cannot be used on ``pool`` ('' when they can): the parser module is missing,
    the pool caches replies client-side (its connections are proxies that must see every command), makes a
    connection class of its own, or a connection lacks an attribute read here."""
    if _MISSING:
        return _MISSING
    if getattr(pool, "cache", None) is not None or any(k.startswith("cache") for k in pool.connection_kwargs):
        return "the pool caches replies client-side"
    if not callable(getattr(pool, "make_connection", None)) or pool.connection_class not in known:
        return f"the pool makes {getattr(pool.connection_class, '__name__', 'unknown')} connections"
    try:
        probe = pool.connection_class(**pool.connection_kwargs)  # not connected: no I/O
    except Exception as exc:  # a constructor that wants more than the pool gives: not ours to read
        return f"a connection could not be built aside ({exc})"
    missing = [a for a in attrs if not hasattr(probe, a)]
    return f"a connection has no {', '.join(missing)}" if missing else ""


def _refused(reason: str) -> bool:
    if reason:
        told(f"script calls go through redis-py's client: {reason}")
    return bool(reason)


def told(reason: str) -> None:
    """Log ``reason`` (a fast path not taken) once per process."""
    if reason not in _told:
        _told.add(reason)
        log.info("%s", reason)


async def _disconnect(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.disconnect(nowait=True)
