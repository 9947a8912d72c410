"""Relay lag where operators look: ``ringfence info``, the doctor's outbox_lag check (its remedy run through the
real CLI) and the exporter's /metrics, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import shlex

import orjson
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import outbox_helpers
from ringfence import App, faults
from ringfence.cli import main as cli
from ringfence.doctor import Status, Thresholds, diagnose
from ringfence.metrics import serve_exporter
from ringfence.outbox.lag import outbox_lag
from ringfence.outbox.relay import Relay
from ringfence.redis.embedded import free_port
from support import kill_at
from test_doctor import finding
from test_doctor_truth import COMMAND
from test_metrics import scrape

db = outbox_helpers.db  # the fixture: SQLite, PostgreSQL and MariaDB
NOW = Thresholds(sample_s=0.01, outbox_lag_warn_s=0.0)  # every waiting row is late


def _app(make_app, engine: sa.Engine) -> App:
    app = make_app(fence_url=engine.url.render_as_string(hide_password=False))

    @app.task(queue="orders", name="charge")
    def charge(ctx, n: int) -> None: ...

    return app


def _write(app: App, engine: sa.Engine, n: int) -> None:
    with engine.begin() as conn:
        for i in range(n):
            app.registry.get("charge").enqueue_in(conn, n=i)


def _env(app: App) -> dict[str, str]:
    return {"RINGFENCE_REDIS_URL": app.broker.url, "RINGFENCE_NAMESPACE": app.namespace,
            "RINGFENCE_FENCE_URL": str(app.fence_url)}


def test_info_shows_rows_waiting_their_age_and_the_relay(make_app, db) -> None:
    app = _app(make_app, db)
    _write(app, db, 3)
    res = CliRunner().invoke(cli, ["info", "--json"], env=_env(app))
    assert res.exit_code == 0, res.output
    outbox = orjson.loads(res.output)["outbox"]
    assert outbox["waiting"] == 3 and 0 <= outbox["oldest_s"] < 60 and outbox["relay"] is None
    relay = Relay(app, engine=db)
    assert relay.lead()
    assert outbox_lag(app)["relay"] == relay.owner
    relay.run(once=True)
    assert outbox_lag(app) | {"oldest_s": 0} == {"waiting": 0, "oldest_s": 0, "parked": 0, "relay": None}
    res = CliRunner().invoke(cli, ["info"], env=_env(app))
    assert res.exit_code == 0 and "outbox" in res.output, res.output


def test_the_doctor_alerts_on_rows_waiting_too_long_and_its_remedy_drains_them(make_app, db) -> None:
    app = _app(make_app, db)
    assert [f.status for f in diagnose(app, NOW).by_check("outbox_lag")] == [Status.OK]
    _write(app, db, 2)
    failure = finding(diagnose(app, NOW), "outbox_lag", "outbox")
    assert failure.status == Status.FAILURE and failure.numbers["waiting"] == 2  # no relay holds the lease
    late = Thresholds(sample_s=0.01, outbox_lag_warn_s=3600.0)
    assert [f.status for f in diagnose(app, late).by_check("outbox_lag")] == [Status.OK]
    holder = Relay(app, engine=db)
    assert holder.lead()
    warning = finding(diagnose(app, NOW), "outbox_lag", "outbox")
    assert warning.status == Status.WARNING and holder.owner in warning.symptom
    holder.release()
    drain = next(c for c in COMMAND.findall(warning.remedy) if "--once" in c)
    args = shlex.split(drain.replace("APP", "x"))[1:]
    args.remove("--app"), args.remove("x")  # the app comes from the environment here
    res = CliRunner().invoke(cli, args, env=_env(app))
    assert res.exit_code == 0 and "relayed 2 row(s)" in res.output, res.output
    assert [f.status for f in diagnose(app, NOW).by_check("outbox_lag")] == [Status.OK]


def test_without_an_outbox_table_or_a_database_the_check_is_skipped(make_app, tmp_path) -> None:
    for app in (make_app(fence_url=f"sqlite:///{tmp_path}/empty.db"), make_app()):
        assert [f.status for f in diagnose(app, NOW).by_check("outbox_lag")] == [Status.SKIPPED]
        assert outbox_lag(app) is None
    assert not (tmp_path / "ringfence.db").exists()


def test_the_exporter_serves_the_lag(make_app, db) -> None:
    app = _app(make_app, db)
    _write(app, db, 4)
    server = serve_exporter(app.broker, free_port(), "127.0.0.1", outbox=lambda: outbox_lag(app))
    try:
        got = scrape(server.server_port)
        assert got[("ringfence_outbox_waiting", ())] == 4 and got[("ringfence_outbox_up", ())] == 1
        assert 0 <= got[("ringfence_outbox_oldest_seconds", ())] < 60
        with kill_at("relay_after_send"), pytest.raises(faults.SimulatedKill):
            Relay(app, engine=db).step()
        Relay(app, engine=db).run(once=True)  # the four again: refused as sent before
        got = scrape(server.server_port)
        assert got[("ringfence_outbox_waiting", ())] == 0 and got[("ringfence_outbox_oldest_seconds", ())] == 0
        assert got[("ringfence_queue_jobs_outbox_refused_total", (("queue", "orders"),))] == 4
    finally:
        server.shutdown()
