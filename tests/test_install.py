"""The wheel installed in a fresh virtualenv without the dev extra — core alone and each documented extra alone —
runs every documented entry point there: enqueue, enqueue_on_commit with a sync Session, the outbox and its
relay, the fence tables, a worker process that runs the jobs, the dashboard, the Django app. A module of the
core that imports an optional package at module level fails here (the dev extra brings them all elsewhere)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from installed import DEV_ONLY, build_wheel, fresh_venv, run, venv_env
from ringfence.redis.embedded import free_port
from support import ROOT, SERVERS, database_answering, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # venvs built with pip: minutes on a busy machine

CHECK_APP = '''
import os

from sqlalchemy import Column, MetaData, String, Table, create_engine, insert

from ringfence import App

URL = os.environ["CHECK_DB_URL"]
NAMESPACE = os.environ["RINGFENCE_NAMESPACE"]
engine = create_engine(URL)
seen = Table(os.environ["CHECK_TABLE"], MetaData(), Column("tag", String(64), primary_key=True))
app = App(os.environ["RINGFENCE_REDIS_URL"], NAMESPACE, fence_url=URL)


@app.task
def record(ctx, tag: str) -> None:
    with ctx.fence(f"{NAMESPACE}:{tag}", "record") as step:
        if step.done:
            return
        with step.complete(engine) as conn:
            conn.execute(insert(seen).values(tag=tag))
'''

PRODUCE = '''
from sqlalchemy.orm import Session

from checkapp import engine, record, seen

seen.metadata.create_all(engine)
record.enqueue(tag="enqueue")
with Session(engine) as session, session.begin():
    record.enqueue_on_commit(session, tag="on-commit")
with engine.begin() as conn:
    record.enqueue_in(conn, tag="outbox")
'''

IMPORT_ALL = '''
import importlib
import pkgutil
import sys

import ringfence

extras = ("ringfence.dashboard", "ringfence.contrib.django", "ringfence.contrib.otel")  # their extra's name
extras += ("ringfence.testing.plugin",)  # pytest's plugin: only pytest imports it
wanted = sys.argv[1] if len(sys.argv) > 1 else None  # one extra's modules, else the core's
names = [m.name for m in pkgutil.walk_packages(ringfence.__path__, "ringfence.")
         if (m.name.startswith(wanted) if wanted else not m.name.startswith(extras))
         and not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(len(names))
'''

DJANGO_SETTINGS = '''
SECRET_KEY = "install-check"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "ringfence.contrib.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "django.db"}}
RINGFENCE = {"APP": "djangojobs:app"}
USE_TZ = True
'''

DJANGO_JOBS = '''
from ringfence.contrib.django import make_app

app = make_app()


@app.task
def send_receipt(ctx, order_id: int) -> None:
    pass
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def ns(redis_url: str) -> Iterator[str]:
    namespace = f"tin{uuid.uuid4().hex[:10]}"
    yield namespace
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{namespace}:*", count=1000))
    if keys:
        r.delete(*keys)


def write(folder: Path, **files: str) -> None:
    for name, body in files.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(body))


def absent(bin_dir: Path, *names: str) -> list[str]:
    """Which of ``names`` the venv cannot import (proves it has no dev extra)."""
    probe = "import importlib.util as u, sys; print(*[n for n in sys.argv[1:] if u.find_spec(n) is None])"
    return run([str(bin_dir / "python"), "-c", probe, *names]).stdout.split()


DATABASES = {"": None, "postgres": SERVERS["postgresql"], "mysql": SERVERS["mariadb"]}


@pytest.mark.parametrize("extra", ["", "postgres", "mysql"], ids=["core", "postgres", "mysql"])
def test_every_core_entry_point_runs_with_only_this_extra(extra: str, wheel: Path, tmp_path: Path, redis_url: str,
                                                          ns: str) -> None:
    server = DATABASES[extra]
    url = database_answering(extra, server) if server else f"sqlite:///{tmp_path}/app.db"
    table = f"install_seen_{uuid.uuid4().hex[:8]}"
    bin_dir = fresh_venv(wheel, extra, tmp_path / "venv")
    assert absent(bin_dir, *DEV_ONLY) == list(DEV_ONLY)
    assert int(run([str(bin_dir / "python"), "-c", IMPORT_ALL]).stdout) > 50
    work = tmp_path / "work"
    work.mkdir()
    write(work, checkapp=CHECK_APP, produce=PRODUCE)
    env = venv_env(bin_dir, CHECK_DB_URL=url, CHECK_TABLE=table, RINGFENCE_NAMESPACE=ns,
                   RINGFENCE_REDIS_URL=redis_url)
    try:
        _produce_and_work(bin_dir, work, env, url, table)
    finally:
        if server:
            engine = create_engine(url)
            with engine.begin() as conn:
                conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
                conn.execute(text("DELETE FROM ringfence_fences WHERE subject LIKE :ns"), {"ns": f"{ns}:%"})
            engine.dispose()


def _produce_and_work(bin_dir: Path, work: Path, env: dict[str, str], url: str, table: str) -> None:
    cli = str(bin_dir / "ringfence")
    for command in (["fence", "init"], ["outbox", "init"]):
        run([cli, *command, "--app", "checkapp:app"], cwd=work, env=env)
    run([str(bin_dir / "python"), "produce.py"], cwd=work, env=env)
    relayed = run([cli, "relay", "--once", "--app", "checkapp:app"], cwd=work, env=env)
    assert "relayed 1 row(s)" in relayed.stdout + relayed.stderr
    worker = subprocess.Popen([cli, "worker", "--app", "checkapp:app"], cwd=work, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    engine = create_engine(url)
    try:
        def recorded() -> set[str]:
            with engine.connect() as conn:
                return {r[0] for r in conn.execute(text(f"SELECT tag FROM {table}"))}

        wait_until(lambda: len(recorded()) == 3, timeout=60, interval=0.2)
        assert recorded() == {"enqueue", "on-commit", "outbox"}
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        engine.dispose()
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        assert worker.stdout is not None
        worker.stdout.close()


def test_the_dashboard_starts_with_its_extra_and_says_so_without(wheel: Path, tmp_path: Path, redis_url: str,
                                                                 ns: str) -> None:
    env = {"RINGFENCE_NAMESPACE": ns, "RINGFENCE_REDIS_URL": redis_url}
    core = fresh_venv(wheel, "", tmp_path / "core")
    refused = subprocess.run([str(core / "ringfence"), "dashboard"], env=venv_env(core, **env),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "pip install 'ringfence[dashboard]'" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1

    bin_dir = fresh_venv(wheel, "dashboard", tmp_path / "dashboard")
    assert int(run([str(bin_dir / "python"), "-c", IMPORT_ALL, "ringfence.dashboard"]).stdout) >= 5
    port = free_port()
    server = subprocess.Popen([str(bin_dir / "ringfence"), "dashboard", "--port", str(port)],
                              env=venv_env(bin_dir, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        def page() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                    return str(answer.read().decode()) if answer.status == 200 else ""
            except OSError:
                return ""

        assert ns in wait_until(page, timeout=30, interval=0.2)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        assert server.stdout is not None
        server.stdout.close()


def test_the_otel_extra_traces_an_enqueue_and_says_so_without(wheel: Path, tmp_path: Path, redis_url: str,
                                                                ns: str) -> None:
    core = fresh_venv(wheel, "", tmp_path / "core")
    refused = subprocess.run([str(core / "python"), "-c", "import ringfence.contrib.otel"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "pip install 'ringfence[otel]'" in refused.stderr.strip().splitlines()[-1]

    bin_dir = fresh_venv(wheel, "otel", tmp_path / "otel")
    assert int(run([str(bin_dir / "python"), "-c", IMPORT_ALL, "ringfence.contrib.otel"]).stdout) >= 2
    traced = ("from ringfence import App\nfrom ringfence.contrib.otel import RingfenceInstrumentor\n"
              f"app = App({redis_url!r}, {ns!r})\n"
              "@app.task\ndef ping(ctx, n: int) -> None: ...\n"
              "RingfenceInstrumentor().instrument()\nprint(ping.enqueue(n=1))\napp.close()\n")
    job_id = run([str(bin_dir / "python"), "-c", traced], env=venv_env(bin_dir)).stdout.strip()
    r = redis.Redis.from_url(redis_url)
    assert [k for k in r.scan_iter(f"{ns}:*default*pending")] and job_id


def test_the_django_app_imports_migrates_and_runs_the_cli(wheel: Path, tmp_path: Path, redis_url: str,
                                                          ns: str) -> None:
    bin_dir = fresh_venv(wheel, "django", tmp_path / "venv")
    write(tmp_path, installsettings=DJANGO_SETTINGS, djangojobs=DJANGO_JOBS)
    env = venv_env(bin_dir, DJANGO_SETTINGS_MODULE="installsettings", PYTHONPATH=str(tmp_path),
                   RINGFENCE_NAMESPACE=ns, RINGFENCE_REDIS_URL=redis_url)
    admin = str(bin_dir / "django-admin")
    run([admin, "migrate", "-v", "0"], cwd=tmp_path, env=env)
    listed = run([admin, "ringfence", "fence", "list", "--json"], cwd=tmp_path, env=env)
    assert listed.stdout.strip().startswith("[") or listed.stdout.strip().startswith("{"), listed.stdout
    enqueued = run([str(bin_dir / "python"), "-c", "import django; django.setup()\n"
                    "from djangojobs import send_receipt\nprint(send_receipt.enqueue(order_id=1))"],
                   cwd=tmp_path, env=env)
    r = redis.Redis.from_url(redis_url)
    pending = [k for k in r.scan_iter(f"{ns}:*default*pending")]
    assert len(pending) == 1 and r.llen(pending[0]) == 1, enqueued.stdout


def test_make_demo_installs_the_package_alone_and_make_test_the_dev_extra(tmp_path: Path) -> None:
    """What a fresh clone's ``make demo`` and ``make test`` would run (``make -n``, a venv path not made yet). The
    core venv above imports ``ringfence.demo`` with no extra."""
    venv = tmp_path / "venv"
    # `make test` runs this test: an outer make's variables would make this one print its directory changes
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    demo = run(["make", "-n", f"VENV={venv}", "demo"], cwd=ROOT, env=env).stdout.splitlines()
    installs = [line for line in demo if " install " in line]
    assert installs and not [line for line in installs if "[" in line], demo
    assert installs[-1].endswith("install -q -e .") and demo[-1] == f"{venv}/bin/ringfence demo", demo
    test = run(["make", "-n", f"VENV={venv}", "test"], cwd=ROOT, env=env).stdout
    assert "install -q -e '.[dev]'" in test
