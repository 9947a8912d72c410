"""Shared by the outbox tests: one engine per database with the shared ringfence_outbox table created if
missing (never dropped: other sessions may use it), and this test's namespace's rows removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from ringfence.outbox import OUTBOX_TABLE, create_outbox
from support import DATABASES, database_url


def outbox_engine(name: str, tmp_path: Path) -> sa.Engine:
    url = database_url(name, tmp_path)  # skips (or fails in CI) when the server does not answer
    engine = sa.create_engine(url, pool_pre_ping=True)
    create_outbox(engine)
    return engine


def rows(engine: sa.Engine, namespace: str) -> list[dict[str, object]]:
    with engine.connect() as c:
        found = c.execute(sa.text(f"SELECT * FROM {OUTBOX_TABLE} WHERE namespace = :ns ORDER BY id"),
                          {"ns": namespace})
        return [dict(r._mapping) for r in found]


def forget(engine: sa.Engine, namespace: str) -> None:
    with engine.begin() as c:
        c.execute(sa.text(f"DELETE FROM {OUTBOX_TABLE} WHERE namespace = :ns"), {"ns": namespace})


@pytest.fixture(params=list(DATABASES))
def db(request: pytest.FixtureRequest, tmp_path: Path, namespace: str) -> Iterator[sa.Engine]:
    engine = outbox_engine(request.param, tmp_path)
    yield engine
    forget(engine, namespace)
    engine.dispose()
