"""ringfence.contrib.django in a real Django project on PostgreSQL: settings, migrations, the fence completed in
``transaction.atomic()``, the admin (Django's test client), ``manage.py ringfence`` (call_command and a real
``manage.py ringfence worker`` process)."""

from __future__ import annotations

import html
import io
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from typing import Any

import orjson
import pytest

from support import wait_until

pytestmark = pytest.mark.usefixtures("django_project")


def new_order(amount: int = 500) -> int:
    from shop.models import Order

    return int(Order.objects.create(amount=amount).pk)


def charge_id(order_id: int) -> str | None:
    from shop.models import Order

    return Order.objects.get(pk=order_id).charge_id  # type: ignore[no-any-return]


def shown(page: Any) -> list[str]:
    """The admin's messages on a page."""
    return [html.unescape(m) for m in re.findall(r'<li class="(?:success|error|warning)">(.*?)</li>',
                                                  page.content.decode())]


@pytest.fixture
def admin_client() -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser(f"admin-{uuid.uuid4().hex[:8]}", password="x"))
    return client


# -- settings ---------------------------------------------------------------------------------------


def test_settings_build_the_app_on_the_django_database(django_project: dict[str, str]) -> None:
    from shop.jobs import app

    from ringfence.contrib.django import get_app

    schema = django_project["RINGFENCE_DJANGO_SCHEMA"]
    assert get_app() is app
    assert (app.namespace, app.environment) == (django_project["RINGFENCE_DJANGO_NAMESPACE"], "test")
    assert app.fence_url == f"postgresql+psycopg://root@127.0.0.1:5432/test?options=-c+search_path%3D{schema}"
    with app.fence_store.engine.connect() as conn:  # the store sees the project's schema, not public
        assert conn.exec_driver_sql("SHOW search_path").scalar() == schema


def test_a_wrong_setting_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings
    from django.test import override_settings

    from ringfence import ConfigError
    from ringfence.contrib.django import fence_url, make_app

    with override_settings(RINGFENCE={"REDIS": "redis://x"}), pytest.raises(ConfigError, match="'REDIS'"):
        make_app()
    with override_settings(RINGFENCE={"DATABASE": "other"}), pytest.raises(ConfigError, match="'other' is not in"):
        fence_url()
    monkeypatch.setitem(settings.DATABASES, "legacy", {"ENGINE": "django.db.backends.oracle", "NAME": "x"})
    with override_settings(RINGFENCE={"DATABASE": "legacy"}), pytest.raises(ConfigError, match="FENCE_URL"):
        fence_url()
    with override_settings(RINGFENCE={"FENCE_URL": "sqlite:///x.db"}):
        assert fence_url() == "sqlite:///x.db"
    monkeypatch.setitem(settings.DATABASES, "maria", {"ENGINE": "django.db.backends.mysql", "NAME": "shop",
                                                      "USER": "app", "PASSWORD": "p@ss:word", "HOST": "db",
                                                      "PORT": "3306", "OPTIONS": {"charset": "utf8mb4"}})
    assert fence_url("maria") == "mysql+pymysql://app:p%40ss%3Aword@db:3306/shop?charset=utf8mb4"
    monkeypatch.setitem(settings.DATABASES, "lite", {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/db.sqlite3"})
    assert fence_url("lite") == "sqlite:////srv/db.sqlite3"


# -- migrations -------------------------------------------------------------------------------------


def test_migrations_create_the_tables_with_ringfences_ddl() -> None:
    from django.core.management import call_command
    from shop.jobs import app
    from sqlalchemy import MetaData, UniqueConstraint
    from sqlalchemy import inspect as sa_inspect

    from ringfence.fence.schema import failed_jobs_table, fence_table
    from ringfence.outbox import outbox_table

    md = MetaData()
    insp = sa_inspect(app.fence_store.engine)
    for table in (fence_table(md), failed_jobs_table(md), outbox_table(md)):
        dialect = app.fence_store.engine.dialect
        columns = {c["name"]: (c["type"].compile(dialect), c["nullable"]) for c in insp.get_columns(table.name)}
        want = {c.name: (c.type.compile(dialect), c.nullable) for c in table.columns}
        assert columns == want
        indexes = {ix["name"] for ix in insp.get_indexes(table.name) if not ix.get("duplicates_constraint")}
        assert indexes == {ix.name for ix in table.indexes}
        assert {u["name"] for u in insp.get_unique_constraints(table.name)} == {
            c.name for c in table.constraints if isinstance(c, UniqueConstraint)}
    call_command("makemigrations", "ringfence", "--check", "--dry-run", verbosity=0)  # models match migrations


def test_migrate_zero_drops_and_an_existing_table_is_kept() -> None:
    from django.core.management import call_command
    from django.db import connection
    from shop.jobs import app

    from ringfence.fence import create_all

    def tables() -> set[str]:
        return {t for t in connection.introspection.table_names() if t.startswith("ringfence_")}

    subject = f"kept:{uuid.uuid4().hex[:8]}"
    try:
        call_command("migrate", "ringfence", "zero", verbosity=0)
        assert tables() == set()
        create_all(app.fence_store.engine)  # made by `ringfence fence init` before the app was installed
        with app.fence_store.engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO ringfence_fences (subject, step, state, epoch, params_hash, provider_key, created_at, "
                f"updated_at) VALUES ('{subject}', 's', 'completed', 1, 'h', 'k', now(), now())")
    finally:
        call_command("migrate", "ringfence", verbosity=0)
    assert tables() == {"ringfence_fences", "ringfence_failed_jobs", "ringfence_outbox"}
    assert app.fence_store.get(subject, "s") is not None  # left as it was


# -- the fence completed with Django's connection, inside transaction.atomic() ----------------------


def test_complete_with_djangos_connection_in_atomic_second_run_empty() -> None:
    from shop.jobs import charge_order, psp

    from ringfence.testing import assert_second_run_empty

    orders: list[int] = []

    def payload(n: int) -> dict[str, int]:
        orders.append(new_order())
        return {"order_id": orders[-1]}

    report = assert_second_run_empty(charge_order, payload=payload, effects=psp.count)
    assert not report.failed and not report.parked
    assert all(charge_id(o) is not None for o in orders)


def test_a_rolled_back_atomic_rolls_the_fence_completion_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import shop.jobs as jobs

    from ringfence.testing import JobRunner

    class Boom(Exception):
        pass

    def boom(order_id: int) -> None:
        raise Boom

    oid, runner = new_order(), JobRunner(jobs.charge_order)
    monkeypatch.setattr(jobs, "after_complete", boom)  # fails after complete(), inside the caller's atomic()
    first = runner.attempt({"order_id": oid}, job_id="j1")
    assert isinstance(first.error, Boom)
    row = jobs.app.fence_store.get(f"order:{oid}", "charge")
    assert (row.state, charge_id(oid)) == ("effected", None)  # both writes rolled back together
    monkeypatch.undo()
    charges = jobs.psp.count()
    assert runner.attempt({"order_id": oid}, job_id="j1").error is None
    row = jobs.app.fence_store.get(f"order:{oid}", "charge")
    assert (row.state, charge_id(oid), jobs.psp.count()) == ("completed", row.reference, charges)


# -- database connections of a job thread ---------------------------------------------------------


def test_a_job_gets_a_new_connection_after_the_database_dropped_the_threads_one() -> None:
    import psycopg
    from django.db import connection
    from shop.jobs import count_orders

    from ringfence.testing import run_job

    new_order()  # this thread's connection, as a job thread keeps it between jobs
    pid = connection.connection.info.backend_pid
    with psycopg.connect(f"postgresql://{connection.settings_dict['USER']}@127.0.0.1:5432/test",
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))  # a restart, a failover, an idle timeout
    assert run_job(count_orders) >= 1  # closed as past CONN_MAX_AGE before the job, then opened afresh
    assert connection.connection is None  # and closed after it, as at the end of a request


def test_a_job_inside_an_atomic_block_keeps_its_connection() -> None:
    from django.db import connection, transaction
    from shop.jobs import count_orders
    from shop.models import Order

    from ringfence.testing import run_job

    with transaction.atomic():  # a Django TestCase runs each test like this
        Order.objects.create(amount=1)
        seen = Order.objects.count()
        assert run_job(count_orders) == seen  # the job saw the uncommitted order: same connection
        assert connection.in_atomic_block and connection.connection is not None


def test_tasks_and_periodic_tasks_of_a_django_app_are_wrapped_sync_only() -> None:
    from ringfence.contrib.django import make_app

    app = make_app(namespace=f"w{uuid.uuid4().hex[:8]}")

    def tick(ctx: Any) -> None: ...

    async def atick(ctx: Any) -> None: ...

    periodic = app.periodic("*/5 * * * *")(tick)
    plain = app.task(name="plain")(tick)
    direct = app.task(atick)
    assert periodic.fn.__wrapped__ is tick and plain.fn.__wrapped__ is tick and direct.fn is atick
    assert [p.task for p in app.periodics] == [periodic]


# -- the producer side: the outbox and enqueue_on_commit in Django's transactions ---------------------


class Rollback(Exception):
    pass


def test_enqueue_in_writes_the_job_in_the_atomic_and_the_relay_sends_it() -> None:
    from django.core.management import call_command
    from django.db import connection, transaction
    from shop.jobs import app, charge_order

    from ringfence.contrib.django.models import OutboxRow

    oid = new_order()
    with transaction.atomic():
        sent = charge_order.enqueue_in(connection, order_id=oid)
    with pytest.raises(Rollback), transaction.atomic():
        lost = charge_order.enqueue_in(connection, order_id=oid)
        raise Rollback
    assert list(OutboxRow.objects.filter(job_id__in=[sent, lost]).values_list("job_id", flat=True)) == [sent]
    out = io.StringIO()
    call_command("ringfence", "relay", "--once", stdout=out)
    assert "relayed 1 row(s)" in out.getvalue()
    assert app.broker.job_spec("default", sent) is not None and app.broker.job_spec("default", lost) is None
    assert not OutboxRow.objects.filter(job_id=sent).exists()


def test_a_row_the_relay_cannot_send_is_parked_and_shown_in_the_admin(admin_client: Any) -> None:
    """A row written by hand with a job id Redis would store as a phantom job: the relay parks it with the
    reason, sends the row after it, and the admin's outbox list shows the reason."""
    from django.core.management import call_command
    from django.db import connection, transaction
    from shop.jobs import app, charge_order

    from ringfence.contrib.django.models import OutboxRow

    bad = f"poison{{{uuid.uuid4().hex[:6]}"
    with connection.cursor() as cur:
        cur.execute("INSERT INTO ringfence_outbox (namespace, job_id, queue, task, spec, created_at) "
                    "VALUES (%s, %s, 'default', 'charge', '{}', now())", [app.namespace, bad])
    with transaction.atomic():
        sent = charge_order.enqueue_in(connection, order_id=new_order())
    out = io.StringIO()
    call_command("ringfence", "relay", "--once", stdout=out)
    assert "1 parked" in out.getvalue(), out.getvalue()
    assert app.broker.job_spec("default", sent) is not None and not OutboxRow.objects.filter(job_id=sent).exists()
    row = OutboxRow.objects.get(job_id=bad)
    assert row.parked_at is not None and row.parked_reason.startswith(f"job id {bad!r} must ")
    page = admin_client.get("/admin/ringfence/outboxrow/", {"q": bad}).content.decode()
    assert bad in page and "must " in page
    row.delete()


# -- the admin ---------------------------------------------------------------------------------------


def in_doubt_step() -> tuple[int, Any]:
    """A charge_strict step parked in doubt: killed after 'calling', then a rerun that cannot tell."""
    from shop.jobs import charge_strict

    from ringfence import InDoubt
    from ringfence.contrib.django.models import Fence
    from ringfence.testing import JobRunner

    oid, runner = new_order(), JobRunner(charge_strict)
    assert runner.attempt({"order_id": oid}, job_id=f"s{oid}", kill_at="after_calling").killed
    assert isinstance(runner.attempt({"order_id": oid}, job_id=f"s{oid}").error, InDoubt)
    return oid, Fence.objects.get(subject=f"order:{oid}", step="charge_strict")


def test_admin_lists_fences_read_only(admin_client: Any) -> None:
    from shop.jobs import charge_order

    from ringfence.contrib.django.models import Fence
    from ringfence.testing import run_job

    oid = new_order()
    run_job(charge_order, order_id=oid)
    fence = Fence.objects.get(subject=f"order:{oid}", step="charge")
    page = admin_client.get("/admin/ringfence/fence/", {"q": f"order:{oid}"})
    assert page.status_code == 200 and f"order:{oid}" in page.content.decode()
    detail = admin_client.get(f"/admin/ringfence/fence/{fence.pk}/change/")
    assert detail.status_code == 200 and fence.reference in detail.content.decode()
    assert 'name="_save"' not in detail.content.decode()
    assert admin_client.get("/admin/ringfence/fence/add/").status_code == 403
    assert admin_client.post(f"/admin/ringfence/fence/{fence.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Fence.objects.filter(pk=fence.pk).exists()


def test_admin_resolve_happened_then_the_rerun_completes_without_calling(admin_client: Any) -> None:
    from shop.jobs import app, charge_strict, psp

    from ringfence.testing import JobRunner

    oid, fence = in_doubt_step()
    form = {"action": "resolve_happened", "_selected_action": [fence.pk], "reference": "ch_by_hand", "index": 0}
    assert admin_client.post("/admin/ringfence/fence/", form).status_code == 302
    row = app.fence_store.get(f"order:{oid}", "charge_strict")
    assert (row.state, row.reference) == ("effected", "ch_by_hand")
    charges = psp.count()
    assert JobRunner(charge_strict).attempt({"order_id": oid}, job_id=f"s{oid}").error is None
    assert (app.fence_store.get(f"order:{oid}", "charge_strict").state, charge_id(oid)) == ("completed", "ch_by_hand")
    assert psp.count() == charges


def test_admin_resolve_refusals(admin_client: Any) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client
    from shop.jobs import app

    oid, fence = in_doubt_step()
    key = (f"order:{oid}", "charge_strict")
    no_ref = {"action": "resolve_happened", "_selected_action": [fence.pk], "reference": "", "index": 0}
    page = admin_client.post("/admin/ringfence/fence/", no_ref, follow=True)
    assert shown(page) == ["Not resolved: type the provider's reference (its id of the effect) in the box next to "
                           "the action"]
    assert app.fence_store.get(*key).state == "in_doubt"

    viewer = User.objects.create_user(f"viewer-{uuid.uuid4().hex[:8]}", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_fence"))
    client = Client()
    client.force_login(viewer)
    assert client.get("/admin/ringfence/fence/").status_code == 200
    not_done = {"action": "resolve_not_happened", "_selected_action": [fence.pk], "index": 0}
    client.post("/admin/ringfence/fence/", not_done)
    assert app.fence_store.get(*key).state == "in_doubt"  # no resolve_fence permission: nothing happened

    page = admin_client.post("/admin/ringfence/fence/", not_done, follow=True)
    assert shown(page) == [f"Step order:{oid}/charge_strict: now claimed (epoch 3); replay its job s{oid} under Dead "
                           "jobs to finish it"]
    assert app.fence_store.get(*key).state == "claimed"  # the replay calls the provider again
    page = admin_client.post("/admin/ringfence/fence/", not_done, follow=True)  # not in doubt any more
    assert shown(page)[0].startswith(f"Step order:{oid}/charge_strict not resolved: ")


def kill_job(app: Any, job_id: str, *, in_redis: bool, queue: str = "graveyard") -> None:
    """A dead job as the worker leaves it: the Redis dead-letter (unless Redis lost it) and its failed_jobs row."""
    from ringfence.models import DeadJob

    b = app.broker
    spec = {"t": "shop.jobs.charge_order", "v": 1, "e": 1.0, "a": {"order_id": 1}}
    if in_redis:
        b.run(b.enqueue(queue, [(job_id, orjson.dumps(spec), 0)]))
        b.register_queues([queue])
        [(got, _, _)] = b.run(b.fetch(queue, 1, b.clock() + 60_000, "tok"))
        assert got == job_id
        assert b.run(b.dead(queue, job_id, "tok", {"attempt": 1}, {"reason": "permanent", "error": "E",
                                                                     "traceback": "", "task": spec["t"],
                                                                     "queue": queue}, durable=True))
    app.failed_jobs.record(DeadJob(job_id, queue, spec["t"], spec["a"], "permanent", "E", "", 1, b.clock(), []),
                           spec)


def test_admin_replays_dead_jobs_from_redis_and_from_the_table(admin_client: Any) -> None:
    from shop.jobs import app

    from ringfence.contrib.django.models import FailedJob

    kept, lost = f"kept-{uuid.uuid4().hex[:8]}", f"lost-{uuid.uuid4().hex[:8]}"
    kill_job(app, kept, in_redis=True)
    kill_job(app, lost, in_redis=False)  # Redis lost it: only the table has it
    listing = admin_client.get("/admin/ringfence/failedjob/", {"replayed": "no"}).content.decode()
    assert kept in listing and lost in listing
    pks = list(FailedJob.objects.filter(job_id__in=[kept, lost]).values_list("pk", flat=True))
    page = admin_client.post("/admin/ringfence/failedjob/", {"action": "replay", "_selected_action": pks,
                                                             "index": 0}, follow=True)
    assert shown(page) == ["Replayed 2 job(s) (1 restored from the failed_jobs table)"]
    assert app.broker.job_spec("graveyard", kept) is not None and app.broker.job_spec("graveyard", lost) is not None
    assert not FailedJob.objects.filter(job_id__in=[kept, lost], replayed_at__isnull=True).exists()
    again = admin_client.post("/admin/ringfence/failedjob/", {"action": "replay", "_selected_action": pks,
                                                              "index": 0}, follow=True)
    assert shown(again) == ["Skipped 2 row(s) already replayed"]


def test_admin_shows_only_this_namespaces_dead_jobs(admin_client: Any) -> None:
    from shop.jobs import app

    from ringfence import App

    other = App(app.redis_url, f"other{uuid.uuid4().hex[:8]}", fence_url=app.fence_url)
    job = f"theirs-{uuid.uuid4().hex[:8]}"
    kill_job(other, job, in_redis=False)
    try:
        assert job not in admin_client.get("/admin/ringfence/failedjob/").content.decode()
    finally:
        other.failed_jobs.delete([job])


# -- manage.py ringfence ------------------------------------------------------------------------------


def test_call_command_passes_through_to_the_cli() -> None:
    from django.core.management import CommandError, call_command
    from shop.jobs import charge_order

    from ringfence.testing import run_job

    oid = new_order()
    run_job(charge_order, order_id=oid)
    out = io.StringIO()
    call_command("ringfence", "fence", "list", "--subject", f"order:{oid}", "--json", stdout=out)
    assert [(r["subject"], r["state"]) for r in json.loads(out.getvalue())] == [(f"order:{oid}", "completed")]
    err = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("ringfence", "dead", "show", "no-such-job", stderr=err)
    assert refused.value.returncode == 2 and "not in dead-letter: no-such-job" in err.getvalue()
    err = io.StringIO()
    with pytest.raises(CommandError):  # an explicit --app wins over RINGFENCE["APP"]
        call_command("ringfence", "fence", "list", "--app", "no_such_module:app", stderr=err)
    assert "cannot import 'no_such_module'" in err.getvalue()


def test_manage_py_ringfence_worker_runs_the_projects_jobs(django_project: dict[str, str]) -> None:
    from shop.jobs import charge_order

    from ringfence.contrib.django.management.commands import ringfence as command

    oid = new_order()
    env = {**os.environ, **django_project}
    manage = os.path.join(django_project["PYTHONPATH"], "manage.py")
    worker = subprocess.Popen([sys.executable, manage, "ringfence", "worker", "-q", "default", "-c", "2"], env=env,
                              cwd=django_project["PYTHONPATH"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        charge_order.enqueue(order_id=oid)
        wait_until(lambda: charge_id(oid) is not None, timeout=30)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
    listed = subprocess.run([sys.executable, "-m", "ringfence.cli", "fence", "list", "--app", command.ENTRY,
                             "--subject", f"order:{oid}", "--json"], env=env, cwd=django_project["PYTHONPATH"],
                            capture_output=True, text=True, check=True)  # as worker -p N starts its children
    assert [r["state"] for r in json.loads(listed.stdout)] == ["completed"]
    usage = subprocess.run([sys.executable, manage, "ringfence", "--help"], env=env, capture_output=True, text=True,
                           cwd=django_project["PYTHONPATH"], check=True)
    assert "manage.py ringfence" in usage.stdout and "worker" in usage.stdout
    assert command.__doc__ is not None
