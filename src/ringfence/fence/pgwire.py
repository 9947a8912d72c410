"""The fence's prebuilt statements on psycopg's libpq connection, below its cursor.

psycopg's ``cursor.execute`` spends more client CPU per statement than a fenced no-op job spends anywhere else:
it converts the query and dumps every parameter through its adapters on each call, and its async twin adds a
lock, a generator and a reader per wait. A kept statement here is converted once (``$n`` placeholders) and sent
as a named prepared statement; on the first use on a connection, ``Parse`` goes out in the same round trip as
the execution (libpq's pipeline mode), so one statement is still one round trip. Parameters are plain ``str``,
``int``, ``float``, ``bool`` and ``None`` sent as text, their types declared by the statement itself (every
parameter of a prebuilt statement sits in a typed context: a cast, a column); anything else, or a string libpq
would cut at a NUL, returns ``None`` from :func:`values` and the caller uses psycopg's cursor. Rows are read with
the connection's own loaders (psycopg's ``Transformer``), so they are what the cursor returned.

Errors are psycopg's: a failed statement raises the error psycopg builds from the server's answer, a dead
socket the ``OperationalError`` libpq reports, so ``kept_connections.py`` wraps them as it wraps the cursor's.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import select
from collections.abc import Generator
from contextlib import suppress
from typing import Any

# psycopg is the postgres extra: without it no connection is psycopg's and no Wire is made. Where psycopg is
# there but its libpq wrapper or its loaders are not as read here, MISSING says what and no Wire is made either.
try:
    from psycopg import errors, pq
    from psycopg.adapt import Transformer

    _OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
except ImportError as exc:
    MISSING = f"{exc.name or 'psycopg'} is not importable ({exc})"
else:
    _PGCONN = ("enter_pipeline_mode", "exit_pipeline_mode", "send_prepare", "send_query_prepared", "pipeline_sync",
               "exec_prepared", "flush", "consume_input", "is_busy", "get_result", "parameter_status", "socket",
               "pipeline_status", "error_message", "status")
    _absent = [f"PGconn.{a}" for a in _PGCONN if not hasattr(pq.PGconn, a)]
    _absent += [f"Transformer.{a}" for a in ("set_pgresult", "load_rows") if not hasattr(Transformer, a)]
    _absent += [f"pq.{a}" for a in ("version", "ExecStatus", "PipelineStatus", "ConnStatus") if not hasattr(pq, a)]
    _absent += [] if hasattr(errors, "error_from_result") else ["errors.error_from_result"]
    MISSING = f"psycopg has no {', '.join(_absent)}" if _absent else ""

_READ, _WRITE = 1, 2
_PYFORMAT = re.compile(r"%\((\w+)\)s|%%")
_names = itertools.count(1)  # statement names, unique in the process (each connection prepares its own)


class PgForm:
    """A kept statement in PostgreSQL's own form: its name, its ``$n`` text and the parameter names in order."""

    __slots__ = ("name", "order", "text")

    def __init__(self, name: bytes, text: bytes, order: list[str]) -> None:
        self.name, self.text, self.order = name, text, order


def pg_form(sql: str) -> PgForm | None:
    """``sql`` as compiled for psycopg (``%(name)s``) in ``$n`` form; None if it holds any other ``%`` form."""
    order: list[str] = []

    def sub(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return "%"
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    if "%" in _PYFORMAT.sub("", sql):
        return None
    return PgForm(b"rf_%d" % next(_names), _PYFORMAT.sub(sub, sql).encode(), order)


def values(form: PgForm, params: dict[str, Any]) -> list[bytes | None] | None:
    """The parameters as text, in order; None where psycopg's adaptation is needed."""
    out: list[bytes | None] = []
    for name in form.order:
        v = params[name]
        t = type(v)
        if v is None:
            out.append(None)
        elif t is str:
            if "\x00" in v:  # libpq would cut the text there; psycopg refuses it
                return None
            out.append(v.encode())
        elif t is int:
            out.append(b"%d" % v)
        elif t is float and math.isfinite(v):
            out.append(repr(v).encode())
        elif t is bool:
            out.append(b"t" if v else b"f")
        else:
            return None
    return out


class Wire:
    """One psycopg connection (sync or async) seen through its libpq connection; what it has prepared."""

    __slots__ = ("fd", "pg", "prepared", "tx", "waiter", "watching")

    def __init__(self, raw: Any) -> None:
        self.pg = raw.pgconn
        self.fd: int = self.pg.socket
        self.watching: asyncio.AbstractEventLoop | None = None  # where the socket's reader is registered
        self.waiter: asyncio.Future[None] | None = None  # an exchange waiting for its answer
        self.prepared: set[bytes] = set()
        self.tx = Transformer(raw)  # the connection's loaders (its adapters, its time zone)

    @staticmethod
    def usable(raw: Any) -> bool:
        """psycopg's libpq wrapper as read here (:data:`MISSING` empty), UTF-8 client encoding (parameters are
        encoded so) and a libpq with pipeline mode."""
        return bool(not MISSING and raw.pgconn.parameter_status(b"client_encoding") == b"UTF8"
                    and pq.version() >= 140000)

    def exchange(self, form: PgForm, args: list[bytes | None]) -> Generator[int, None, pq.abc.PGresult]:
        """Send one execution (with its ``Parse`` the first time) and read the answer: yields ``_READ`` /
        ``_WRITE`` while the socket must be waited for; returns the statement's result, or raises its error."""
        pg, first = self.pg, form.name not in self.prepared
        if first:  # Parse, Bind, Execute, Sync: one round trip
            pg.enter_pipeline_mode()
            pg.send_prepare(form.name, form.text)
            pg.send_query_prepared(form.name, args)
            pg.pipeline_sync()
        else:
            pg.send_query_prepared(form.name, args)
        while pg.flush():
            yield _WRITE
        results: list[pq.abc.PGresult] = []
        while True:
            pg.consume_input()
            while not pg.is_busy():
                r = pg.get_result()
                if r is None:
                    if not first:
                        return self._answer(results, form, first)
                    continue  # the end of one pipelined command
                if r.status == pq.ExecStatus.PIPELINE_SYNC:
                    pg.exit_pipeline_mode()
                    return self._answer(results, form, first)
                results.append(r)
            yield _READ

    def _answer(self, results: list[pq.abc.PGresult], form: PgForm, first: bool) -> pq.abc.PGresult:
        if first and results and results[0].status == pq.ExecStatus.COMMAND_OK:
            self.prepared.add(form.name)  # Parse went through, even if the execution then failed (a permission)
        for r in results:
            if r.status not in _OK:
                raise errors.error_from_result(r, encoding="utf-8")
        return results[-1]

    def rows(self, res: Any, names: list[str] | None) -> tuple[list[str] | None, list[Any] | None]:
        """(column names, rows as tuples), or (None, None) for a statement that returns no rows. ``names``: the
        statement's column names when known (read once per statement: the capture returns 21 columns)."""
        if res.status != pq.ExecStatus.TUPLES_OK:
            return None, None
        if names is None:
            names = [(res.fname(i) or b"").decode() for i in range(res.nfields)]
        self.tx.set_pgresult(res)
        return names, self.tx.load_rows(0, res.ntuples, tuple)

    def call(self, form: PgForm, args: list[bytes | None]) -> Any:
        """One execution, blocking (the sync path). A statement this connection has prepared is one libpq call,
        ``PQexecPrepared``, which lets go of the interpreter once for the whole round trip; the non-blocking
        exchange (:meth:`exchange` driven by :meth:`run`) lets go of it in each of its libpq calls and in the wait
        (4–5 times per statement), and each time another thread (a job thread, the worker's loop) wants the
        interpreter it is handed over and must be taken back: context switches a worker with several job threads
        paid on every statement. The first execution on a connection keeps the pipelined ``Parse``."""
        if form.name not in self.prepared:
            return self.run(self.exchange(form, args))
        pg = self.pg
        res = pg.exec_prepared(form.name, args)
        if res.status in _OK:
            return res
        if pg.status != pq.ConnStatus.OK:  # the socket is gone: libpq's words, as consume_input raises them
            raise errors.OperationalError(_error_text(pg) or "the connection is lost")
        raise errors.error_from_result(res, encoding="utf-8")

    def run(self, gen: Generator[int, None, Any]) -> Any:
        """Drive ``gen`` blocking on the socket."""
        poller, fd = select.poll(), self.fd
        try:
            wait = next(gen)
            while True:
                poller.register(fd, select.POLLIN if wait == _READ else select.POLLOUT)
                poller.poll()
                wait = gen.send(None)
        except StopIteration as done:
            return done.value

    async def arun(self, gen: Generator[int, None, Any]) -> Any:
        """Drive ``gen`` on the running loop.

        The socket's reader is registered once and stays registered between statements (adding and removing it
        per wait cost two ``epoll_ctl`` and ~8 µs of CPU); a wait sets :attr:`waiter`, which :meth:`_readable`
        wakes once the answer is read in full. It is removed when an exchange fails, before the connection is
        closed or used through psycopg's cursor (its own wait takes the reader over), and when it finds the
        connection gone: libpq may close the socket, and its number must not stay registered."""
        loop = asyncio.get_running_loop()
        try:
            wait = next(gen)  # sent: a connection libpq found gone has raised its own error by now
            if self.watching is not loop:
                self.unwatch()
                loop.add_reader(self.fd, self._readable)
                self.watching = loop
            while True:
                fut = loop.create_future()
                if wait == _READ:
                    self.waiter = fut
                    try:
                        await fut
                    finally:
                        self.waiter = None
                else:
                    loop.add_writer(self.fd, _wake, fut)
                    try:
                        await fut
                    finally:
                        loop.remove_writer(self.fd)
                wait = gen.send(None)
        except StopIteration as done:
            return done.value
        except BaseException:
            self.unwatch()
            raise

    def _readable(self) -> None:
        """The socket is readable: read what came into libpq and wake the waiter when its answer is complete.
        Nobody waiting (a notice, the server ending an idle connection): read, and stop watching a connection that
        is gone. Reading here, not only in the exchange, is what makes every wake-up a real one: epoll still
        reports the socket readable once after the waiter was woken, before the exchange has read its answer."""
        pg, fut = self.pg, self.waiter
        try:
            pg.consume_input()
        except Exception:  # the connection is gone: the waiter (if any) reads the error itself
            self.unwatch()
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        if fut is not None and not fut.done() and not pg.is_busy():
            fut.set_result(None)

    def unwatch(self) -> None:
        """Remove the socket's reader from the loop it is registered on (before the connection is closed)."""
        loop, self.watching = self.watching, None
        if loop is not None:
            with suppress(Exception):  # a closed loop: nothing is registered any more
                loop.remove_reader(self.fd)

    def clean(self) -> bool:
        """Out of pipeline mode (else the connection is not reused)."""
        try:
            return bool(self.pg.pipeline_status == pq.PipelineStatus.OFF)
        except Exception:  # a closed connection
            return False


def _error_text(pg: Any) -> str:
    """libpq's last error message (psycopg < 3.2 has only the bytes)."""
    text = getattr(pg, "get_error_message", None)
    return str(text(encoding="utf-8")) if text is not None else bytes(pg.error_message).decode("utf-8", "replace")


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
