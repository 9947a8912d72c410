"""docs/request.md's promises: no objects in payloads (refused naming the field), a secret in a payload is stored
as it is (only the dashboard hides it), and the dashboard's POSTs check CSRF first."""

from __future__ import annotations

import datetime
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from ringfence import App, PayloadError
from ringfence.dashboard import create_app


class User:
    id = 42


@pytest.fixture
def app(make_app: Any) -> App:
    app = make_app()

    @app.task(name="welcome")
    def welcome(ctx: Any, user: Any = None, at: Any = None, password: str = "", user_id: int = 0) -> None: ...

    return app


def test_an_object_or_a_datetime_in_a_payload_is_refused_naming_the_field(app: App) -> None:
    with pytest.raises(PayloadError, match="user"):
        app.enqueue("welcome", user=User())
    with pytest.raises(PayloadError, match="at"):
        app.enqueue("welcome", at=datetime.datetime.now(datetime.UTC))
    assert app.enqueue("welcome", user_id=User.id)  # the id is what travels


def test_a_password_is_stored_as_it_is_and_only_the_dashboard_hides_it(app: App) -> None:
    job_id = app.enqueue("welcome", user_id=1, password="hunter2")
    assert orjson.loads(app.broker.job_spec("default", job_id))["a"]["password"] == "hunter2"
    page = TestClient(create_app(app)).get(f"/jobs?id={job_id}").text
    assert "hunter2" not in page and "[redacted]" in page


def test_a_dashboard_post_without_its_csrf_value_is_refused(app: App) -> None:
    client = TestClient(create_app(app, token="t"))
    refused = client.post("/actions/pause", data={"queue": "default", "paused": "1"})
    assert refused.status_code == 403 and "CSRF" in refused.text
