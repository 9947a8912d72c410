"""Script calls of the sync client on connections kept aside, without redis-py's per-command machinery.

``Redis.evalsha`` costs ~70-90 µs of CPU per call in redis-py 8 (a pool checkout that polls the socket,
observability hooks, a retry closure); a ``task.enqueue`` is one such call, so it was most of a producer's
cost. Here a call takes a connection of the client's own kind (``pool.make_connection()``: same address, auth,
TLS, timeouts, health checks, Sentinel master lookup) from a free list, sends, reads, and gives it back: ~15 µs.
The rules of ``connection.py`` stay: one retry after a connection error (the connection reconnects), none after
a timeout (the script may have run); a connection that failed mid-command is closed before it is reused.
"""

from __future__ import annotations

import os
from typing import Any

import redis


class DirectCalls:
    def __init__(self, client: redis.Redis) -> None:
        self.pool = client.connection_pool
        self._free: list[Any] = []
        self._pid = os.getpid()

    @staticmethod
    def usable(client: Any) -> bool:
        """Only a plain client on a plain pool: not a cluster, a subclass or a single-connection client, and not
        Sentinel (its pool finds the master when it hands out a connection, not when one is made)."""
        return (type(client) is redis.Redis and getattr(client, "connection", None) is None
                and type(client.connection_pool) in (redis.ConnectionPool, redis.BlockingConnectionPool))

    def call(self, *args: Any) -> Any:
        if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours to use
            self._free, self._pid = [], os.getpid()
        free = self._free
        try:
            conn = free.pop()  # atomic under the GIL: each thread gets its own connection
        except IndexError:
            conn = self.pool.make_connection()
        try:
            for attempt in (0, 1):
                try:
                    conn.send_command(*args)
                    return conn.read_response()
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

    def close(self) -> None:
        free, self._free = self._free, []
        for conn in free:
            conn.disconnect()
