import pytest
from myshop.db import engine, metadata

from ringfence.fence import create_all
from ringfence.outbox import create_outbox


@pytest.fixture(scope="session", autouse=True)
def tables() -> None:
    metadata.create_all(engine)  # in a real project: your migrations
    create_all(engine)
    create_outbox(engine)
