"""The dashboard's reconcile page reads only what the App declares (``app.reconcile_source``): no table, column
or template from a request; it runs on a POST behind the token and CSRF and redacts what it shows. The same
step reconciled by ``ringfence reconcile`` (a real process) gives the same findings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from sqlalchemy import text

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import charged_twice, csrf, logged_in
from ringfence import App
from ringfence.dashboard import create_app
from ringfence.errors import ConfigError
from ringfence.fence import FenceStore, Owner
from ringfence.fence.provider import ProviderTable
from ringfence.reconcile import Effect

TOKEN = "s3cret-token"
USER_EMAIL, USER_HASH = "alice@example.org", "$argon2id$v=19$secret-hash"
FINDINGS = ["double_effects", "unfenced", "without_reference", "stale_in_doubt", "owner_gone", "missing_at_provider"]


def counts(page: str) -> dict[str, int]:
    found = dict(re.findall(r'data-finding="(\w+)"><td>\w+</td><td class="num[^"]*">(\d+)<', page))
    return {k: int(v) for k, v in found.items()}


@pytest.fixture
def app(make_app, tmp_path: Path) -> App:
    app = make_app(environment="test", fence_url=f"sqlite:///{tmp_path}/f.db")
    store: FenceStore = app.fence_store
    store.create_all()
    charged_twice(store)
    with store.engine.begin() as c:
        c.execute(text("create table users (id integer, email text, password_hash text)"))
        c.execute(text("insert into users values (1, :e, :h), (2, 'bob@example.org', 'h2')"), {"e": USER_EMAIL,
                                                                                             "h": USER_HASH})
    return app


ATTACK = {"step": "charge", "table": "users", "effects_table": "users", "subject_column": "email",
          "reference_column": "password_hash", "key_column": "id", "subject_template": "{0.__class__.__mro__}"}


def test_names_and_templates_in_a_request_are_never_used(app: App) -> None:
    app.reconcile_source("charge", ProviderTable("callbacks", "order_id", "charge_id", subject_prefix="order:"))
    for web in (create_app(app, token=TOKEN), create_app(app, token=TOKEN, read_only=True)):
        anon = TestClient(web)
        page = anon.get("/fences/reconcile", params=ATTACK)
        assert page.status_code == 200 and USER_EMAIL not in page.text and USER_HASH not in page.text
        assert "data-finding" not in page.text  # a GET runs nothing
        posted = anon.post("/fences/reconcile", data={**ATTACK, "csrf": csrf(anon)})
        assert posted.status_code == 403 and USER_EMAIL not in posted.text
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    no_csrf = client.post("/fences/reconcile", data=ATTACK)
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
    for template in ("{0.__class__.__mro__}", "{:>5000000}"):
        r = client.post("/fences/reconcile", data={**ATTACK, "subject_template": template, "csrf": csrf(client)})
        assert r.status_code == 200 and len(r.content) < 50_000
        assert USER_EMAIL not in r.text and USER_HASH not in r.text and "mro" not in r.text.lower()
        assert "2 fence row(s), 3 effect(s)" in r.text  # the declared table, whatever the request said
        assert counts(r.text)["double_effects"] == 1 and counts(r.text)["unfenced"] == 0


def test_the_page_agrees_with_ringfence_reconcile(app: App, redis_url: str, namespace: str, tmp_path: Path) -> None:
    app.reconcile_source("charge", ProviderTable("callbacks", "order_id", "charge_id", subject_prefix="order:"))
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    page = client.post("/fences/reconcile", data={"csrf": csrf(client), "step": "charge"}).text
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "RINGFENCE_FENCE_URL": f"sqlite:///{tmp_path}/f.db"}
    cli = subprocess.run([sys.executable, "-m", "ringfence.cli", "reconcile", "--step", "charge", "--json",
                          "--effects-table", "callbacks", "--subject-column", "order_id",
                          "--reference-column", "charge_id", "--subject-template", "order:{}"],
                         env=env, capture_output=True, text=True, timeout=60)
    report = json.loads(cli.stdout)
    assert cli.returncode == report["exit_code"] == 1, cli.stderr
    assert counts(page) == {name: len(report[name]) for name in FINDINGS}
    assert f"{report['fences']} fence row(s), {report['effects']} effect(s)" in page


def test_a_declared_function_and_a_step_without_a_source(app: App) -> None:
    app.reconcile_source("charge", lambda: [Effect("order:1", "ch_a"), Effect("order:3", "ch_x")])
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    r = client.post("/fences/reconcile", data={"csrf": csrf(client), "step": "charge"})
    assert "2 fence row(s), 2 effect(s)" in r.text and counts(r.text)["unfenced"] == 1
    del app.reconcile_sources["charge"]
    alone = client.post("/fences/reconcile", data={"csrf": csrf(client), "step": "charge"})
    assert "2 fence row(s), no effect(s)" in alone.text and "none declared" in alone.text
    unknown = client.post("/fences/reconcile", data={"csrf": csrf(client), "step": "users"})
    assert unknown.status_code == 404 and "no fence step &#39;users&#39;" in unknown.text
    assert "data-finding" not in unknown.text


def test_a_wrong_declaration_is_one_line_that_lists_no_other_column(app: App) -> None:
    app.reconcile_source("charge", ProviderTable("users", "order_id", "charge_id"))
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    r = client.post("/fences/reconcile", data={"csrf": csrf(client), "step": "charge"})
    error = re.search(r'<p class="flash bad">([^<]*)</p>', r.text)
    assert error is not None and error.group(1) == (
        "the provider table &#39;users&#39; has no column order_id, charge_id")
    assert "password_hash" not in r.text and "email" not in r.text
    app.reconcile_source("charge", ProviderTable("nope", "order_id"))
    r = client.post("/fences/reconcile", data={"csrf": csrf(client), "step": "charge"})
    assert "the provider table &#39;nope&#39; is not in the fence database" in r.text
    with pytest.raises(ConfigError, match="table 'users; drop table x' must be a plain SQL name"):
        app.reconcile_source("charge", ProviderTable("users; drop table x", "order_id"))
    with pytest.raises(ConfigError, match="subject_column 'a b' must be a plain SQL column name"):
        app.reconcile_source("charge", ProviderTable("callbacks", "a b"))


def test_what_the_report_shows_is_redacted(app: App) -> None:
    store: FenceStore = app.fence_store
    store.capture("order:9", "charge", Owner("job9", "tok", 30.0), "h", None)
    store.mark_calling("order:9", "charge", 1, json.dumps({"amount": 5, "card_number": "4111-1111"}), 30.0)
    store.park("order:9", "charge", 1)
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    with store.engine.begin() as c:  # in doubt for an hour: stale
        c.execute(text("update ringfence_fences set updated_at = :t where subject = 'order:9'"),
                  {"t": "2000-01-01 00:00:00"})
    r = client.post("/fences/reconcile", data={"csrf": csrf(client), "step": "charge"})
    assert counts(r.text)["stale_in_doubt"] == 1
    assert "4111-1111" not in r.text
    assert '"request": {"amount": 5, "card_number": "[redacted]"}' in r.text
