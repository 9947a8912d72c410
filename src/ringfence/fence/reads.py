"""Bulk reads for reconciliation and the dashboard: every fence row of a step, rows by owner, counts by state,
and a provider's records kept in a SQL table. A database that fails raises FenceStoreError (the driver's error its
cause)."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import MetaData, Table, func, select
from sqlalchemy.exc import NoSuchTableError

from ..errors import ConfigError
from .dbretry import database_errors
from .model import FenceRow
from .rows import row_of as _row
from .store import FenceStore


def step_rows(store: FenceStore, step: str, batch: int = 1000) -> Iterator[FenceRow]:
    """Every fence row of ``step``, in id order, read in batches."""
    t = store.table
    last = 0
    while True:
        q = store.row_select().where(t.c.step == step, t.c.id > last).order_by(t.c.id).limit(batch)
        with database_errors(f"the fences of step {step!r}", store.engine), store.engine.connect() as conn:
            rows = list(conn.execute(q).mappings())
        if not rows:
            return
        last = int(rows[-1]["id"])
        yield from (_row(m) for m in rows)


def table_records(store: FenceStore, table: str, columns: list[str | None]) -> Iterator[tuple[object, ...]]:
    """Rows of an application table in the fence database, as tuples of ``columns`` (None → None)."""
    with database_errors(f"table {table!r}", store.engine):
        try:
            t = Table(table, MetaData(), autoload_with=store.engine)
        except NoSuchTableError:
            raise ConfigError(f"no table {table!r} in {store.engine.url.render_as_string(hide_password=True)}: "
                              "give a CSV export of the provider's records or a table of the fence database"
                              ) from None
    wanted = [c for c in columns if c is not None]
    missing = [c for c in wanted if c not in t.c]
    if missing:
        raise KeyError(f"table {table!r} has no column(s) {', '.join(missing)}; it has {', '.join(t.c.keys())}")
    with database_errors(f"table {table!r}", store.engine), store.engine.connect() as conn:
        for m in conn.execute(select(*(t.c[c] for c in wanted))).mappings():
            yield tuple(None if c is None else m[c] for c in columns)


def owner_rows(store: FenceStore, job_id: str, limit: int = 50) -> list[FenceRow]:
    """Fence rows whose owner is (or last was) job ``job_id``, latest first."""
    t = store.table
    q = store.row_select().where(t.c.owner_job_id == job_id).order_by(t.c.updated_at.desc()).limit(limit)
    with database_errors(f"the fences of job {job_id}", store.engine), store.engine.connect() as conn:
        return [_row(m) for m in conn.execute(q).mappings()]


def state_counts(store: FenceStore) -> dict[str, dict[str, int]]:
    """step -> state -> rows (one GROUP BY over the state and step columns)."""
    t = store.table
    q = select(t.c.step, t.c.state, func.count()).group_by(t.c.step, t.c.state)
    out: dict[str, dict[str, int]] = {}
    with database_errors("counting fences", store.engine), store.engine.connect() as conn:
        for step, state, n in conn.execute(q):
            out.setdefault(str(step), {})[str(state)] = int(n)
    return out
