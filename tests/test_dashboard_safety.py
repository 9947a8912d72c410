"""What a browser may send the dashboard and what it is shown: any bytes in the token, header, CSRF field or
cookie get a refusal, never a 500; bad numbers get a one-line 400; payload fields are redacted by the words in
their names; links carry ids URL-encoded; a flash message is only what the dashboard said; a read-only
dashboard has nothing to log in for. Starlette's TestClient against the real Redis."""

from __future__ import annotations

import re
import warnings
from typing import Any

import orjson
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import csrf, logged_in
from ringfence import App
from ringfence.dashboard import create_app
from ringfence.models import JobSpec

TOKEN = "s3cret-token"
ODD = "jeton-\u00e9\u00e8\u4e2d\U0001f600"  # not ASCII


@pytest.fixture
def app(make_app) -> App:
    app = make_app()

    @app.task(name="charge")
    def charge(ctx: Any, order: int, **fields: Any) -> None: ...

    return app


def put_dead(app: App, job_id: str, args: dict[str, Any], error: str = "boom", queue: str = "default") -> None:
    """A dead-letter record as the worker writes it."""
    b = app.broker
    k = b.keys.queue(queue)
    b.register_queues([queue])
    spec = JobSpec("charge", args, b.clock()).encode()
    b.sync.zadd(k.dead, {job_id: b.clock()})
    b.sync.hset(k.dead_jobs, job_id, orjson.dumps({"spec": spec.decode(), "attempts": 3, "history": "[]",
                                                   "died_ms": b.clock(), "reason": "max_attempts", "error": error}))


def test_text_that_is_not_ascii_in_token_header_csrf_or_cookie_is_refused_not_a_500(app: App) -> None:
    job = app.enqueue("charge", order=1)
    web = create_app(app, token=TOKEN)
    client = TestClient(web, raise_server_exceptions=False)
    token = csrf(client, "/login")
    login = client.post("/login", data={"csrf": token, "token": ODD})
    assert login.status_code == 403 and "wrong token" in login.text
    forged = client.post("/login", data={"csrf": ODD, "token": TOKEN})
    assert forged.status_code == 403 and "CSRF" in forged.text
    bearer = client.post("/actions/cancel", data={"csrf": token, "id": job},
                         headers=[(b"authorization", "Bearer \u00e9t\u00e9".encode("latin-1"))])
    assert bearer.status_code == 403 and "log in" in bearer.text
    cookie = TestClient(web, raise_server_exceptions=False)
    for path in ["/", f"/jobs?id={job}", "/queues/default/pending", "/login"]:
        page = cookie.get(path, headers=[(b"cookie", "rf_auth=\u00e9t\u00e9; rf_csrf=x".encode())])
        assert page.status_code == 200, (path, page.text[:200])
        assert "log in for actions" in page.text
    assert app.broker.job_state("default", job) == "pending"
    real = logged_in(web, TOKEN)  # the right token still works
    assert real.post("/actions/cancel", data={"csrf": csrf(real), "id": job}).status_code == 200
    assert app.broker.job_state("default", job) is None


@pytest.mark.parametrize("query", ["offset=nan", "offset=inf", "offset=1e20", "offset=-1", "offset=abc",
                                   "offset=%C2%B2", "min_age_s=nan", "min_age_s=-inf", "min_age_s=abc"])
def test_a_bad_number_in_the_query_is_a_400_naming_it(app: App, query: str) -> None:
    app.enqueue("charge", order=1)
    client = TestClient(create_app(app), raise_server_exceptions=False)
    r = client.get(f"/queues/default/pending?{query}")
    assert r.status_code == 400, r.text[:300]
    name = query.split("=")[0]
    error = re.search(r'<p class="flash bad">([^<]*)</p>', r.text)
    assert error is not None and error.group(1).startswith(f"refused: {name} must be"), r.text


def test_a_bad_done_count_is_refused_before_anything_is_replayed(app: App) -> None:
    put_dead(app, "d1", {"order": 1})
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    r = client.post("/actions/dead", data={"csrf": csrf(client), "op": "replay", "queue": "default", "all": "1",
                                           "done": "abc"})
    assert r.status_code == 400 and r.text == "refused: done must be a whole number from 0 to 999999999, got 'abc'"
    assert app.broker.job_state("default", "d1") == "dead"


def test_default_redaction_matches_words_in_names_at_any_depth_and_any_case(app: App) -> None:
    secrets = {"access_token": "AT-1", "api_key": "AK-2", "card_number": "CN-3", "client_secret": "CS-4",
               "authorization": "AU-5", "Password": "PW-6", "userEmail": "EM-7"}
    nested = {"billing": {"CVV": "CV-8", "Iban": "IB-9", "owner": "visible-owner"},
              "items": [{"sku": "visible-sku", "X-Api-Key": "XK-10"}]}
    job = app.enqueue("charge", order=1, **secrets, **nested)
    put_dead(app, "dead-1", {"order": 2, **secrets, **nested})
    client = TestClient(create_app(app, token=TOKEN))  # an anonymous visitor
    for path in [f"/jobs?id={job}", "/jobs?id=dead-1", "/queues/default/pending", "/queues/default/dead"]:
        page = client.get(path).text
        hidden = [v for v in [*secrets.values(), "CV-8", "IB-9", "XK-10"] if v in page]
        assert hidden == [], (path, hidden)
        assert "[redacted]" in page, path
    whole = client.get(f"/jobs?id={job}").text
    assert "visible-owner" in whole and "visible-sku" in whole and '"order": 1' in whole


def test_job_links_carry_the_id_url_encoded(app: App) -> None:
    odd = "a&b #1+%2F?x=y"
    put_dead(app, odd, {"order": 1})
    client = TestClient(create_app(app))
    page = client.get("/queues/default/dead").text
    link = re.search(r'<a href="(/jobs\?id=[^"]*)">', page)
    assert link is not None and link.group(1) == "/jobs?id=a%26b%20%231%2B%252F%3Fx%3Dy"
    found = client.get(link.group(1))
    assert found.status_code == 200 and 'data-job="a&amp;b #1+%2F?x=y"' in found.text
    filtered = client.get("/queues/default/dead", params={"error": "bo&om=#", "offset": "50"}).text
    assert "error=bo%26om%3D%23" in filtered


def test_only_messages_the_dashboard_set_are_flashed(app: App) -> None:
    job = app.enqueue("charge", order=1)
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    forged = client.get("/", params={"msg": "Your session expired: log in again at https://evil.example"})
    assert "evil.example" not in forged.text and 'class="flash"' not in forged.text
    signed = client.get("/", params={"msg": "paused default", "sig": "0" * 64})
    assert 'class="flash"' not in signed.text
    done = client.post("/actions/cancel", data={"csrf": csrf(client), "id": job})
    assert f'<p class="flash" role="status">cancelled job {job} (was pending in default)</p>' in done.text
    location = str(done.history[0].headers["location"])
    tampered = location.replace("pending+in", "running+in")
    assert "cancelled job" not in client.get(tampered).text


@pytest.mark.parametrize("mode", ["read_only", "no_token"])
def test_a_dashboard_without_actions_has_nothing_to_log_in_for(app: App, mode: str) -> None:
    web = create_app(app, token=TOKEN, read_only=True) if mode == "read_only" else create_app(app, token="")
    client = TestClient(web)
    page = client.get("/login")
    assert page.status_code == 200 and 'name="token"' not in page.text
    assert ("read-only" if mode == "read_only" else "No dashboard token is set") in page.text
    r = client.post("/login", data={"csrf": csrf(client, "/login"), "token": TOKEN}, follow_redirects=False)
    assert r.status_code == 403 and "actions enabled" not in r.text and "rf_auth" not in r.headers.get("set-cookie", "")
    assert "actions enabled" not in client.get("/").text


ODD_VALUES = ["nan", "inf", "1e20", "-1", "abc", ODD, "\x00", "", "9" * 50, "%", "../.."]


def test_no_page_or_action_answers_odd_input_with_a_500(make_app, tmp_path) -> None:
    app = make_app(fence_url=f"sqlite:///{tmp_path}/f.db")
    app.fence_store.create_all()
    app.task(name="charge")(lambda ctx, **kw: None)
    app.enqueue("charge", order=1)
    client = TestClient(create_app(app, token=TOKEN), raise_server_exceptions=False)
    token = csrf(client, "/login")
    assert client.post("/login", data={"csrf": token, "token": TOKEN}).status_code == 200
    pages = {"/": ["msg", "sig"], "/jobs": ["id"], "/queues/default/pending": ["offset", "task", "error", "min_age_s"],
             "/queues/default/dead": ["offset"], "/fences": ["replay"], "/fences/reconcile": ["step"]}
    actions = {"/actions/pause": ["queue", "paused"], "/actions/purge": ["queue", "confirm"],
               "/actions/dead": ["op", "queue", "done", "id", "task", "error", "all"],
               "/actions/resolve": ["subject", "step", "outcome", "reference"], "/fences/reconcile": ["step"],
               "/actions/cancel": ["id"]}
    fixed = {"/actions/dead": {"op": "replay", "queue": "default"}, "/actions/resolve": {"outcome": "done"}}
    failed = [(path, name, value) for path, names in pages.items() for name in names for value in ODD_VALUES
              if client.get(path, params={name: value}).status_code >= 500]
    failed += [(path, name, value) for path, names in actions.items() for name in names for value in ODD_VALUES
               if client.post(path, data={**fixed.get(path, {}), "csrf": token, name: value}).status_code >= 500]
    assert failed == []
