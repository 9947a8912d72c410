import pytest
from shop.jobs import app


@pytest.fixture
def ringfence_app():
    return app
