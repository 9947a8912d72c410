"""The fence's happy-path statements on psycopg's async connection, so ``async with ctx.fence(...)`` runs them on
the loop.

A store built from a ``postgresql+psycopg://`` URL opens psycopg ``AsyncConnection``s to the same URL (its connect
arguments as SQLAlchemy reads them from the URL) the first time an ``async with`` fence runs, bound to that event
loop, and keeps them between statements (``kept_connections.AsyncDirect``): a worker has one loop, so every
async fence of the process uses them. On any other loop, or with another driver, the fence keeps running its store
calls in a thread (``offloop.HOP``). Only the happy path is here (capture or read, calling,
record, complete, release); the rerun rules that need more (a takeover, the in-doubt rules) run the blocking
code in a thread, once.

Every statement is the prebuilt one of ``statements.py`` and keeps its guarantees: autocommit single statements,
epoch-conditional writes, the "already done" read only on a retry after a lost answer, retries on a dead
connection (``aretrying``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Update, select
from sqlalchemy.engine import make_url

from ..faults import fault_point
from .dbretry import aretrying
from .kept_connections import AConn, AsyncDirect
from .model import COMPLETABLE, FenceRow, FenceState, Owner, StateText, provider_key
from .rows import fenced_out as _fenced_out
from .rows import row_of as _row
from .statements import where

T = TypeVar("T")


def async_url(url: str) -> str | None:
    """The URL of the async twin of a store's driver, or None where there is none here."""
    return url if make_url(url).drivername == "postgresql+psycopg" else None


class AsyncFence:
    """One store's statements on psycopg async connections it keeps, bound to one event loop."""

    def __init__(self, store: Any, url: str, loop: asyncio.AbstractEventLoop) -> None:
        """``store``: the FenceStore whose statements, table and retry policy these are."""
        self.store, self.loop = store, loop
        dialect = store.engine.dialect  # psycopg's: the same SQL as its async twin's
        cargs, cparams = dialect.create_connect_args(make_url(url))

        async def connect() -> Any:
            import psycopg

            return await psycopg.AsyncConnection.connect(*cargs, autocommit=True, **cparams)

        # Kept between statements, opened in autocommit: no pool checkout, no greenlet, no reset per statement.
        self.direct = AsyncDirect(dialect, connect)
        self.direct.keep(vars(store.stmts).values())

    async def aclose(self) -> None:
        """Close the connections kept (on this loop)."""
        await self.direct.aclose()

    async def _run(self, what: str, fn: Callable[[AConn, bool], Awaitable[T]]) -> T:
        direct = self.direct
        return await aretrying(self.store.retry, lambda retried: direct.run(lambda conn: fn(conn, retried)), what)

    # Each statement is one ``conn.execute`` (AConn.execute): a driver error is raised as SQLAlchemy raises it
    # (``DBAPIError``, ``connection_invalidated`` for a dead connection), so the retry sees the usual error.

    async def capture_or_get(self, subject: str, step: str, owner: Owner, phash: str, retention_s: float | None,
                             request: str | None = None) -> tuple[FenceRow | None, bool]:
        """:meth:`FenceStore.capture_or_get` on the loop (PostgreSQL's one-statement capture)."""
        values = {"v_subject": subject, "v_step": step, "v_owner_job_id": owner.job_id,
                  "v_owner_token": owner.token, "v_lease_s": float(owner.lease_s), "v_params_hash": phash,
                  "v_provider_key": (key := provider_key(subject, step)), "v_retention_s": retention_s}
        stmts = self.store.stmts
        stmt = stmts.pg_capture if request is None else stmts.pg_capture_calling
        if request is not None:
            values["v_request"] = request

        async def run(conn: AConn, _retried: bool) -> Any:
            return (await conn.execute(stmt, values)).mappings().first()

        try:
            m = await self._run("fence capture", run)
        except Exception as exc:
            self.store.name_missing_table(exc)
            raise
        if m["fresh"]:
            state = FenceState.CLAIMED if request is None else FenceState.CALLING
            return FenceRow(subject=subject, step=step, state=state, epoch=1, owner_job_id=owner.job_id,
                            owner_token=owner.token, params_hash=phash, provider_key=key,
                            request=request, retention_s=retention_s, lease_live=True), True
        return (None if m["id"] is None else _row(m)), False

    async def _holds(self, conn: AConn, subject: str, step: str, epoch: int, expect: dict[str, Any]) -> bool:
        t = self.store.table
        q = select(*(t.c[k] for k in expect)).where(t.c.subject == subject, t.c.step == step, t.c.epoch == epoch)
        found = (await conn.execute(q)).first()
        return found is not None and tuple(found) == tuple(expect.values())

    async def _cas(self, stmt: Update, subject: str, step: str, epoch: int, values: dict[str, Any],
                   states: Sequence[FenceState], expect: dict[str, Any] | None, before: str | None = None) -> None:
        params = {**where(subject, step, epoch, *states), **values}

        async def run(conn: AConn, retried: bool) -> None:
            if before is not None:
                fault_point(before)
            if (await conn.execute(stmt, params)).rowcount == 1:
                return
            if not (retried and expect is not None and await self._holds(conn, subject, step, epoch, expect)):
                raise _fenced_out(subject, step, epoch, states or None)

        await self._run(f"fence {(expect or {}).get('state', 'update')}", run)

    async def mark_calling(self, subject: str, step: str, epoch: int, request: str | None, lease_s: float) -> None:
        await self._cas(self.store.stmts.calling, subject, step, epoch,
                        {"v_request": request, "v_lease_s": float(lease_s)}, [FenceState.CLAIMED],
                        {"state": StateText.CALLING, "request": request})

    async def set_request(self, subject: str, step: str, epoch: int, request: str) -> None:
        await self._cas(self.store.stmts.set_request, subject, step, epoch, {"v_request": request},
                        [FenceState.CALLING], {"state": StateText.CALLING, "request": request})

    async def renew(self, subject: str, step: str, epoch: int, lease_s: float) -> None:
        await self._cas(self.store.stmts.renew, subject, step, epoch, {"v_lease_s": float(lease_s)}, [], None)

    async def record(self, subject: str, step: str, epoch: int, reference: str) -> None:
        await self._cas(self.store.stmts.record, subject, step, epoch, {"v_reference": reference},
                        [FenceState.CALLING], {"state": StateText.EFFECTED, "reference": reference})

    async def unmark(self, subject: str, step: str, epoch: int) -> None:
        await self._cas(self.store.stmts.unmark, subject, step, epoch, {}, [FenceState.CALLING],
                        {"state": StateText.CLAIMED, "calling_at": None})

    async def release(self, subject: str, step: str, epoch: int) -> None:
        params = where(subject, step, epoch)

        async def run(conn: AConn, _retried: bool) -> None:
            await conn.execute(self.store.stmts.release, params)

        await self._run("fence release", run)

    async def complete(self, subject: str, step: str, epoch: int, result: str | None,
                       states: Sequence[FenceState] = COMPLETABLE) -> None:
        await self._cas(self.store.stmts.complete, subject, step, epoch, {"v_result": result}, states,
                        {"state": StateText.COMPLETED, "result": result}, before="before_commit")
