"""The tests' own shop database and provider ledger, set before myshop reads them at import."""

import os
import tempfile

import pytest

folder = tempfile.mkdtemp()
os.environ["SHOP_DATABASE_URL"] = f"sqlite:///{folder}/shop.db"
os.environ["SHOP_PSP_DB"] = f"{folder}/psp.db"


@pytest.fixture(scope="session", autouse=True)
def tables() -> None:
    from myshop.db import engine, metadata

    from ringfence.fence import create_all
    from ringfence.outbox import create_outbox

    metadata.create_all(engine)  # in a real project: your migrations
    create_all(engine)
    create_outbox(engine)


@pytest.fixture
def ringfence_app():
    from myshop.jobs import app

    return app  # the App ringfence's test worker runs (the ringfence_worker fixture)
