"""A fence whose database fails raises ringfence's own FenceStoreError, the driver's error kept as its
``__cause__``: with the database down (a PostgreSQL URL on a closed port) and with a permission refused (a role
without rights on the fence tables, made for the test and dropped after). Through ``ctx.fence`` in a plain call
(``ringfence.testing.run_job``) and through a real worker, whose verdict is the one a failed attempt always had:
retried, then dead-lettered when the database answers that the steps cannot be read."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import OperationalError, ProgrammingError

import ringfence
from empty_databases import empty_database
from ringfence import App, FenceError, FenceStoreError, JobFailed, RetryPolicy, RingfenceError
from ringfence.fence import create_all
from ringfence.jobs import find_job
from ringfence.testing import run_job
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
    role = f"rf_norights_{uuid.uuid4().hex[:8]}"
    server = create_engine(make_url(SERVERS["postgresql"] or ""), isolation_level="AUTOCOMMIT")
    try:
        with empty_database("postgresql", tmp_path) as url:
            owner = create_engine(url)
            create_all(owner)
            owner.dispose()
            with server.connect() as c:
                c.execute(text(f"CREATE ROLE {role} LOGIN"))
            yield make_url(url).set(username=role).render_as_string(hide_password=False)
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


def producer(redis_url: str, namespace: str) -> App:
    app = App(redis_url, namespace)
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


def test_every_public_error_is_exported_from_ringfence() -> None:
    import ringfence.errors as errors

    public = {name for name, value in vars(errors).items()
              if isinstance(value, type) and issubclass(value, BaseException) and not name.startswith("_")}
    assert public - set(ringfence.__all__) == set()
    assert all(getattr(ringfence, name) is getattr(errors, name) for name in public)
