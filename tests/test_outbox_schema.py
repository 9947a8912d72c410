"""The outbox table's DDL runs on each database (``ringfence outbox ddl``), ``ringfence outbox init`` creates the
table once, and the Alembic recipe (the table in your own MetaData) creates the same columns."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from ringfence.cli import main as cli
from ringfence.outbox import COLUMNS, OUTBOX_TABLE, outbox_ddl, outbox_table
from support import database_url

DATABASE = {"mariadb": "mariadb", "mysql": "mariadb", "postgresql": "postgresql", "sqlite": "sqlite"}


@pytest.mark.parametrize("dialect", list(DATABASE))
def test_the_ddl_of_every_dialect_runs_on_its_database(dialect, tmp_path) -> None:
    name = f"ddl_o_{uuid.uuid4().hex[:8]}"  # a table of this test's own, dropped after
    res = CliRunner().invoke(cli, ["outbox", "ddl", "--dialect", dialect])
    assert res.exit_code == 0 and f"CREATE TABLE {OUTBOX_TABLE}" in res.output, res.output
    engine = sa.create_engine(database_url(DATABASE[dialect], tmp_path))
    try:
        with engine.begin() as c:
            for statement in filter(str.strip, outbox_ddl(dialect, table_name=name).split(";\n")):
                c.execute(sa.text(statement))
        assert [col["name"] for col in sa.inspect(engine).get_columns(name)] == list(COLUMNS)
    finally:
        with engine.begin() as c:
            c.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))
        engine.dispose()


def test_init_creates_the_table_once(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    for _ in range(2):
        res = CliRunner().invoke(cli, ["outbox", "init"], env={"RINGFENCE_FENCE_URL": url})
        assert res.exit_code == 0 and "outbox table ready" in res.output, res.output
    assert [c["name"] for c in sa.inspect(sa.create_engine(url)).get_columns(OUTBOX_TABLE)] == list(COLUMNS)


def test_the_alembic_recipe_puts_the_table_in_your_metadata(tmp_path) -> None:
    target_metadata = sa.MetaData()  # your models' metadata, as Alembic's env.py sees it
    outbox_table(target_metadata)
    assert OUTBOX_TABLE in target_metadata.tables
    engine = sa.create_engine(f"sqlite:///{tmp_path}/app.db")
    target_metadata.create_all(engine)
    assert [c["name"] for c in sa.inspect(engine).get_columns(OUTBOX_TABLE)] == list(COLUMNS)
