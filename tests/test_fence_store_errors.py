"""A fence whose database fails raises ringfence's own FenceStoreError, the driver's error kept as its
``__cause__``: with the database down (a PostgreSQL URL on a closed port) and with a permission refused (a role
without rights on the fence tables, made for the test and dropped after). Through ``ctx.fence`` in a plain call
(``ringfence.testing.run_job``) and through a real worker, whose verdict is the one a failed attempt always had:
retried, then dead-lettered when the database answers that the steps cannot be read. So do the operator's calls
(``FenceStore``, ``FailedJobs``, ``create_all``, the bulk reads; the CLI exits 3 on them) and ``jobs.cancel_job``
of a job owning a calling step. ``ctx.redis_fence`` with Redis down, and ``ctx.fence`` asking Redis whether the
job holding its step is alive, raise CannotConnect, redis-py's error as the cause."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError, ProgrammingError

import ringfence
from empty_databases import empty_database
from ringfence import (
    App,
    BrokerError,
    CannotConnect,
    FenceError,
    FenceStoreError,
    JobContext,
    JobFailed,
    RetryPolicy,
    RingfenceError,
)
from ringfence.cli import main as cli
from ringfence.fence import FenceRow, FenceState, FenceStore, Owner, create_all
from ringfence.fence.failed import FailedJobs
from ringfence.fence.model import params_hash
from ringfence.fence.reads import owner_rows, state_counts, step_rows
from ringfence.jobs import cancel_job, find_job
from ringfence.redis.embedded import free_port
from ringfence.settings import WorkerSettings
from ringfence.testing import run_job
from ringfence.worker.fencing import Fencing
from storeerrorsapp import declare
from support import ROOT, SERVERS, wait_until


def closed_port_url() -> str:
    """A PostgreSQL URL on a port nothing listens on: every connect is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql+psycopg://root@127.0.0.1:{port}/test"


@pytest.fixture
def refused_url(tmp_path: Path) -> Iterator[str]:
    """The URL of a role that may log in to a database holding the fence tables, with no rights on them."""
    with refused_role(tmp_path) as url:
        yield url


@pytest.fixture(scope="module")
def refused_module_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with refused_role(tmp_path_factory.mktemp("refused")) as url:
        yield url


@contextmanager
def refused_role(tmp_path: Path) -> Iterator[str]:
    with fence_role(tmp_path) as (_owner_url, url):
        yield url


@contextmanager
def fence_role(tmp_path: Path, grant: str = "") -> Iterator[tuple[str, str]]:
    """(the owner's URL, the URL of a role that may log in) on a database holding the fence tables; the role has
    ``grant`` on the fence table (no rights when empty)."""
    role = f"rf_norights_{uuid.uuid4().hex[:8]}"
    server = create_engine(make_url(SERVERS["postgresql"] or ""), isolation_level="AUTOCOMMIT")
    try:
        with empty_database("postgresql", tmp_path) as url:
            owner = create_engine(url)
            create_all(owner)
            with server.connect() as c:
                c.execute(text(f"CREATE ROLE {role} LOGIN"))
            if grant:
                with owner.begin() as c:
                    c.execute(text(f"GRANT {grant} ON ringfence_fences TO {role}"))
            owner.dispose()
            yield url, make_url(url).set(username=role).render_as_string(hide_password=False)
    finally:  # the database is gone with its connections: the role owns nothing
        with server.connect() as c:
            c.execute(text(f"DROP ROLE IF EXISTS {role}"))
        server.dispose()


def fenced_app(fence_url: str) -> App:
    return declare(App(fence_url=fence_url, retry=RetryPolicy(max_attempts=1)))


def check(err: BaseException, cause: type[Exception]) -> None:
    assert type(err) is FenceStoreError, repr(err)
    assert isinstance(err, FenceError) and isinstance(err, RingfenceError)
    assert isinstance(err.__cause__, cause), repr(err.__cause__)


@pytest.mark.parametrize("task", ["charge", "acharge"])
def test_ctx_fence_with_the_database_down_raises_fence_store_error(task: str) -> None:
    app = fenced_app(closed_port_url())
    with pytest.raises(FenceStoreError) as info:
        run_job(app.resolve(task), order=1)
    check(info.value, OperationalError)
    assert "Connection refused" in str(info.value), str(info.value)


@pytest.mark.parametrize("task", ["charge", "acharge"])
def test_ctx_fence_with_a_permission_refused_raises_fence_store_error(task: str, refused_url: str) -> None:
    app = fenced_app(refused_url)
    with pytest.raises(FenceStoreError) as info:
        run_job(app.resolve(task), order=1)
    check(info.value, ProgrammingError)
    assert "permission denied" in str(info.value), str(info.value)
    app.fence_store.engine.dispose()


class Worker:
    def __init__(self, fence_url: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
        self.log = tmp_path / "worker.log"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
               "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": fence_url,
               "RINGFENCE_APP": "storeerrorsapp:app",
               "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        with self.log.open("a") as sink:
            self.proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker"], env=env, cwd=tmp_path,
                                         stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.log.read_text()


def producer(redis_url: str, namespace: str, fence_url: str | None = None) -> App:
    app = App(redis_url, namespace, fence_url=fence_url)
    for name in ("charge", "acharge"):  # the producer's declarations: the worker runs them
        app.task(name=name, store_result=True)(lambda ctx, order: None)
    return app


def test_a_worker_retries_a_fenced_job_whose_database_is_down(redis_url: str, namespace: str,
                                                              tmp_path: Path) -> None:
    """Two attempts retried, each with FenceStoreError; the last one is not dead-lettered while the database
    cannot say which steps the job owns: its lease lapses instead."""
    app = producer(redis_url, namespace)
    ids = [app.enqueue("charge", order=1), app.enqueue("acharge", order=2)]
    worker = Worker(closed_port_url(), redis_url, namespace, tmp_path)
    try:
        views = wait_until(lambda: [v for v in (find_job(app, i) for i in ids) if v and len(v.history) >= 3]
                           if worker.proc.poll() is None else ["exited"], timeout=30)
    finally:
        worker.stop()
    assert len(views) == 2, worker.log.read_text()
    for view in views:
        errors = [entry["error"] for entry in view.history]
        assert all(e.startswith("FenceStoreError: fence 'order:") and "Connection refused" in e
                   for e in errors[:2]), errors
        assert errors[2].startswith("lease expired"), errors
        assert view.state != "dead", view
    app.close()


def test_a_worker_dead_letters_a_fenced_job_refused_by_the_database(refused_url: str, redis_url: str,
                                                                    namespace: str, tmp_path: Path) -> None:
    """Retried with FenceStoreError, then dead-lettered after its last attempt (reason max_attempts) naming it."""
    app = producer(redis_url, namespace)
    ids = [app.enqueue("charge", order=1), app.enqueue("acharge", order=2)]
    worker = Worker(refused_url, redis_url, namespace, tmp_path)
    try:
        for job_id in ids:
            with pytest.raises(JobFailed) as info:
                app.result(job_id, timeout=30)
            assert info.value.reason == "max_attempts", info.value
            assert info.value.error.startswith("FenceStoreError: fence 'order:"), info.value.error
            assert "permission denied" in info.value.error, info.value.error
            view = find_job(app, job_id)
            assert view is not None and view.state == "dead" and view.attempts == 3, view
            assert all(e["error"].startswith("FenceStoreError: ") for e in view.history), view.history
    finally:
        worker.stop()
    app.close()


NEVER_CREATED = "rf_never_created"  # a table the role may not create (PostgreSQL 15: no CREATE on public)


class Opened:
    """The stores an operator's call opens on ``url``, their engines disposed at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engines: list[Engine] = []

    def fences(self, **kw: str) -> FenceStore:
        store = FenceStore(self.url, **kw)
        self.engines.append(store.engine)
        return store

    def failed(self, **kw: str) -> FailedJobs:
        failed = FailedJobs(self.url, **kw)
        self.engines.append(failed.engine)
        return failed

    def engine(self) -> Engine:
        self.engines.append(engine := create_engine(self.url))
        return engine


# Every call an operator (or the CLI, the dashboard, reconcile) makes on the fence database.
OPERATOR_CALLS: dict[str, Callable[[Opened], object]] = {
    "FenceStore.get": lambda o: o.fences().get("order:1", "charge"),
    "FenceStore.list_steps": lambda o: o.fences().list_steps(state="in_doubt"),
    "FenceStore.resolve": lambda o: o.fences().resolve("order:1", "charge", happened=False),
    "FenceStore.prune": lambda o: o.fences().prune(),
    "FenceStore.owned": lambda o: o.fences().owned("job-1"),
    "FenceStore.db_now": lambda o: o.fences().db_now(),
    "FenceStore.park": lambda o: o.fences().park("order:1", "charge", 1),  # a cancel, a dead-letter
    "FenceStore.fence_out": lambda o: o.fences().fence_out(
        FenceRow("order:1", "charge", FenceState.CLAIMED, 1, "job-1", "tok-1", "-", "order:1:charge"),
        Owner("job-1", "tok-2", lease_s=30.0)),
    "FenceStore.create_all": lambda o: o.fences(table_name=NEVER_CREATED).create_all(),
    "fence.create_all": lambda o: create_all(o.engine(), table_name=NEVER_CREATED,
                                             failed_jobs_name=f"{NEVER_CREATED}_jobs"),
    "FailedJobs.create_all": lambda o: o.failed(table_name=NEVER_CREATED).create_all(),
    "FailedJobs.prune": lambda o: o.failed().prune(60),
    "FailedJobs.unreplayed": lambda o: o.failed().unreplayed(),
    "FailedJobs.delete": lambda o: o.failed().delete(["job-1"]),
    "FailedJobs.mark_replayed": lambda o: o.failed().mark_replayed(["job-1"]),
    "reads.step_rows": lambda o: list(step_rows(o.fences(), "charge")),
    "reads.owner_rows": lambda o: owner_rows(o.fences(), "job-1"),
    "reads.state_counts": lambda o: state_counts(o.fences()),
}


def operator_error(url: str, call: str) -> FenceStoreError:
    opened = Opened(url)
    try:
        with pytest.raises(FenceStoreError) as info:
            OPERATOR_CALLS[call](opened)
    finally:
        for engine in opened.engines:
            engine.dispose()
    return info.value


@pytest.mark.parametrize("call", OPERATOR_CALLS)
def test_an_operator_call_with_the_database_down_raises_fence_store_error(call: str) -> None:
    url = closed_port_url().replace("root@", "root:s3cret@")
    err = operator_error(url, call)
    check(err, OperationalError)
    assert "Connection refused" in str(err) and f"at {url.replace('s3cret', '***')}" in str(err), str(err)


@pytest.mark.parametrize("call", [c for c in OPERATOR_CALLS if c != "FenceStore.db_now"])  # needs no rights
def test_an_operator_call_refused_by_the_database_raises_fence_store_error(call: str,
                                                                           refused_module_url: str) -> None:
    err = operator_error(refused_module_url, call)
    check(err, ProgrammingError)
    assert "permission denied" in str(err), str(err)


@pytest.mark.parametrize("down", [True, False], ids=["down", "refused"])
def test_the_cli_exits_3_when_the_fence_database_fails(down: bool, refused_module_url: str) -> None:
    """``fence resolve`` (whose FenceError is otherwise a refused input, exit 2) with the database down or refusing
    the statement: one line, exit 3."""
    url = closed_port_url() if down else refused_module_url
    out = CliRunner().invoke(cli, ["fence", "resolve", "order:1", "charge", "--not-done"],
                             env={"RINGFENCE_FENCE_URL": url, "RINGFENCE_APP": None})
    said = "cannot connect to the fence database" if down else "permission denied"
    assert out.exit_code == 3 and said in out.stderr and out.stderr.count("\n") == 1, out.stderr


def calling_step(url: str, job_id: str) -> None:
    """Job ``job_id`` owns step order:1/charge, marked calling (its effect may have left)."""
    store = FenceStore(url)
    try:
        row = store.capture("order:1", "charge", Owner(job_id, "tok-1", lease_s=60.0), params_hash(None), None)
        assert row is not None
        store.mark_calling("order:1", "charge", row.epoch, None, 60.0)
    finally:
        store.engine.dispose()


def test_cancel_with_the_database_down_raises_fence_store_error(redis_url: str, namespace: str) -> None:
    """``ringfence job cancel`` (jobs.cancel_job) reads the steps the job owns first: the job stays queued."""
    app = producer(redis_url, namespace, fence_url=closed_port_url())
    job_id = app.enqueue("charge", order=1)
    with pytest.raises(FenceStoreError) as info:
        cancel_job(app, job_id)
    check(info.value, OperationalError)
    assert "Connection refused" in str(info.value), str(info.value)
    view = find_job(app, job_id)
    assert view is not None and view.state == "pending", view
    app.close()


def test_cancel_refused_the_park_of_a_calling_step_raises_fence_store_error(redis_url: str, namespace: str,
                                                                           tmp_path: Path) -> None:
    """The job owns a calling step, and the database lets the role read it but refuses to park it in doubt: a
    ringfence error naming the step, the job stays queued."""
    with fence_role(tmp_path, grant="SELECT") as (owner_url, reader_url):
        app = producer(redis_url, namespace, fence_url=reader_url)
        job_id = app.enqueue("charge", order=1)
        calling_step(owner_url, job_id)
        try:
            with pytest.raises(FenceStoreError) as info:
                cancel_job(app, job_id)
        finally:
            app.fence_store.engine.dispose()
        check(info.value, ProgrammingError)
        assert "parking fence 'order:1'/'charge'" in str(info.value), str(info.value)
        assert "permission denied" in str(info.value), str(info.value)
        view = find_job(app, job_id)
        assert view is not None and view.state == "pending", view
        app.close()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_the_owner_check_in_a_fence_with_redis_down_raises_cannot_connect(sync: bool, tmp_path: Path) -> None:
    """A step held by another job: ``ctx.fence`` asks Redis whether that job's lease is live, and Redis is down.
    The handler gets CannotConnect, redis-py's error as the cause."""
    with empty_database("postgresql", tmp_path) as owner_url:
        engine = create_engine(owner_url)
        create_all(engine)
        engine.dispose()
        calling_step(owner_url, "job-other")
        app = App(f"redis://127.0.0.1:{free_port()}/0", "rf-redis-down", fence_url=owner_url)
        ctx = JobContext(id="job-mine", task="charge", queue="default", attempt=1, max_attempts=3, enqueued_ms=0,
                         token="tok-mine", fencing=Fencing(app, app.broker, WorkerSettings()))

        async def enter() -> None:
            async with ctx.fence("order:1", "charge"):
                pass

        def run() -> None:
            if not sync:
                return asyncio.run(enter())
            with ctx.fence("order:1", "charge"):
                pass

        try:
            with pytest.raises(CannotConnect) as info:
                run()
        finally:
            app.fence_store.engine.dispose()
            app.close()
    err = info.value
    assert isinstance(err, BrokerError) and isinstance(err, RingfenceError)
    assert isinstance(err.__cause__, redis.ConnectionError), repr(err.__cause__)
    assert "checking the lease of job job-other" in str(err) and app.redis_url in str(err), str(err)


def redis_fenced_app() -> App:
    """Tasks with a Redis fence, on a Redis URL nothing listens on."""
    app = App(f"redis://127.0.0.1:{free_port()}/0", "rf-redis-down", retry=RetryPolicy(max_attempts=1))

    @app.task(name="rcharge")
    def rcharge(ctx: JobContext, order: int) -> str:
        with ctx.redis_fence(f"order:{order}", "charge") as step:
            return "charged" if step.done else step.effect(lambda: "charged")

    @app.task(name="archarge")
    async def archarge(ctx: JobContext, order: int) -> str:
        async with ctx.redis_fence(f"order:{order}", "charge") as step:
            return "charged" if step.done else await step.effect(lambda: "charged")

    return app


@pytest.mark.parametrize("task", ["rcharge", "archarge"])
def test_ctx_redis_fence_with_redis_down_raises_cannot_connect(task: str) -> None:
    app = redis_fenced_app()
    with pytest.raises(CannotConnect) as info:
        run_job(app.resolve(task), order=1)
    err = info.value
    assert isinstance(err, BrokerError) and isinstance(err, RingfenceError)
    assert isinstance(err.__cause__, redis.ConnectionError), repr(err.__cause__)
    assert "redis fence 'order:1'/'charge'" in str(err) and app.redis_url in str(err), str(err)
    app.close()


def test_every_public_error_is_exported_from_ringfence() -> None:
    import ringfence.errors as errors

    public = {name for name, value in vars(errors).items()
              if isinstance(value, type) and issubclass(value, BaseException) and not name.startswith("_")}
    assert public - set(ringfence.__all__) == set()
    assert all(getattr(ringfence, name) is getattr(errors, name) for name in public)
