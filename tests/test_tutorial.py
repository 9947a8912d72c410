"""docs/tutorial.md runs: its code lives in examples/tutorial/ (a test checks every code block the tutorial shows
is in those files), and each step is run here against the real Redis, with SQLite for the shop's database."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select

from support import ROOT, wait_until

TUTORIAL = Path(ROOT) / "examples" / "tutorial"
DOC = Path(ROOT) / "docs" / "tutorial.md"


@pytest.fixture
def shop(redis_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The tutorial's environment (a namespace, a shop database and a provider ledger of this test's own),
    with myshop importable and imported fresh."""
    env = {"REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": f"ttu{uuid.uuid4().hex[:10]}",
           "SHOP_DATABASE_URL": f"sqlite:///{tmp_path}/shop.db", "SHOP_PSP_DB": f"{tmp_path}/psp.db"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.syspath_prepend(str(TUTORIAL))
        _forget()
        yield env
    _forget()
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{env['RINGFENCE_NAMESPACE']}:*", count=1000))
    if keys:
        r.delete(*keys)


def _forget() -> None:
    for name in [m for m in sys.modules if m == "myshop" or m.startswith("myshop.")]:
        del sys.modules[name]


def test_every_code_block_of_the_tutorial_is_in_its_file() -> None:
    """A block preceded by ``<!-- file: PATH -->`` must appear, line for line, in examples/tutorial/PATH."""
    text = DOC.read_text()
    blocks = re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 5
    for path, block in blocks:
        assert block in (TUTORIAL / path).read_text(), f"docs/tutorial.md's block for {path} differs from the file"


def test_step_tables_made_by_the_cli(shop: dict[str, str]) -> None:
    from ringfence.cli import main

    for args in (["fence", "init"], ["outbox", "init"]):
        result = CliRunner().invoke(main, [*args, "--app", "myshop.jobs:app"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    from myshop.db import engine, metadata

    metadata.create_all(engine)
    assert {"orders", "ringfence_fences", "ringfence_failed_jobs", "ringfence_outbox"} <= set(
        sa_inspect(engine).get_table_names())


def tables() -> None:
    from myshop.db import engine, metadata

    from ringfence.fence import create_all
    from ringfence.outbox import create_outbox

    metadata.create_all(engine)
    create_all(engine)
    create_outbox(engine)


def test_step_the_naive_charge_fails_the_check(shop: dict[str, str]) -> None:
    tables()
    from myshop.db import engine, orders
    from myshop.naive import charge_order_naive
    from myshop.payments import psp
    from sqlalchemy import insert

    from ringfence.testing import assert_second_run_empty

    def new_order(n: int) -> dict[str, Any]:
        with engine.begin() as conn:
            return {"order_id": conn.execute(insert(orders).values(amount=5)).inserted_primary_key[0], "amount": 5}

    with pytest.raises(AssertionError, match="the rerun made 1 more effect"):
        assert_second_run_empty(charge_order_naive, payload=new_order, effects=lambda: psp.effects)


def test_step_the_users_tests_pass(shop: dict[str, str]) -> None:
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests"],
                         cwd=TUTORIAL, env={**os.environ, **shop, "PYTHONPATH": str(TUTORIAL)},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    shown = re.search(r"```\n(second-run check of .*?)```", DOC.read_text(), re.DOTALL)
    assert shown is not None
    for line in shown.group(1).splitlines():  # the table the tutorial prints is the one pytest -s printed
        assert line in run.stdout.splitlines(), (line, run.stdout)


def test_step_an_order_travels_from_the_request_to_a_charge(shop: dict[str, str]) -> None:
    tables()
    from myshop.db import engine, orders
    from myshop.payments import psp
    from myshop.views import place_order

    from ringfence.cli import main

    env = {**os.environ, **shop, "PYTHONPATH": str(TUTORIAL)}
    worker = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "myshop.jobs:app",
                               "--queues", "critical=6,default=3"], cwd=TUTORIAL, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with engine.begin() as conn:
            order_id, _ = place_order(conn, amount=1999)
        relayed = CliRunner().invoke(main, ["relay", "--once", "--app", "myshop.jobs:app"], catch_exceptions=False)
        assert "relayed 1 row(s)" in relayed.output

        def charged() -> Any:
            with engine.connect() as conn:
                return conn.execute(select(orders.c.charge_id).where(orders.c.id == order_id)).scalar()

        charge_id = wait_until(charged, timeout=30)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
    assert psp.effects == 1 and charge_id.startswith("ch_")
