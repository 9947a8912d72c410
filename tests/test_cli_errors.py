"""Operator mistakes on the real CLI (subprocesses): one line each, an exit code that says what happened.

- Redis down, a bad scheme or port, a wrong or missing password: exit 3 ("cannot connect"), `--debug` adds
  the traceback; the doctor too (its 0/1/2 stay for health).
- No Redis URL at all: exit 2, and no embedded Redis is started; fence commands without a fence URL: exit 2,
  and no ./ringfence.db appears.
- A fenced task without a fence database outside the default environment, and `complete(db)` on another
  database than the fence store: the job is dead-lettered once (reason permanent) with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from ringfence.queries import DeadFilter, dead_jobs
from ringfence.redis.embedded import EmbeddedRedis, free_port
from test_worker import run_until

COMMANDS = [["info"], ["doctor", "--sample-s", "0"], ["worker"], ["servers"], ["dead", "list"],
            ["dead", "prune", "--older-than-days", "1"], ["queue", "pause", "default"], ["watch", "--iterations", "1"],
            ["exporter", "--port", "0"]]


def ringfence(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")}
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], env={**clean, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[EmbeddedRedis]:
    """A private redis-server with requirepass (never the shared one)."""
    server = EmbeddedRedis.temporary(port=free_port(), extra=("--requirepass", "s3cret"))
    yield server
    server.stop()


def _down_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # a free port: nothing listens there


CASES = {
    "down": (lambda srv: _down_url(), "cannot connect to Redis at redis://127.0.0.1:"),
    "bad scheme": (lambda srv: "http://127.0.0.1:6379/0", "bad Redis URL http://127.0.0.1:6379/0"),
    "port out of range": (lambda srv: "redis://127.0.0.1:99999/0", "Port out of range"),
    "port not a number": (lambda srv: "redis://127.0.0.1:abc/0", "bad Redis URL redis://127.0.0.1:abc/0"),
    "wrong password": (lambda srv: f"redis://:wrong@127.0.0.1:{srv.port}/0",
                       "Redis at redis://:***@127.0.0.1:{port}/0 refused the login"),
    "missing password": (lambda srv: f"redis://127.0.0.1:{srv.port}/0", "requires a password"),
}


# Every case on three commands, Redis down on every command (a starting worker waits for a down Redis: see
# below); each run is a real process, so the matrix stays small.
MATRIX = [(case, cmd) for case in CASES for cmd in COMMANDS[:3] if (case, cmd) != ("down", ["worker"])] + \
         [("down", cmd) for cmd in COMMANDS[3:]]


@pytest.mark.parametrize(("case", "command"), MATRIX, ids=[f"{c}-{' '.join(m[:2])}" for c, m in MATRIX])
def test_cannot_connect_is_one_line_and_exit_3(locked_redis, case, command) -> None:
    make_url, expected = CASES[case]
    url = make_url(locked_redis)
    out = ringfence(*command, env={"RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": "tbadinput"})
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ")
    assert expected.format(port=locked_redis.port) in out.stderr
    assert "wrong" not in out.stderr  # the password is never printed


def test_a_starting_worker_waits_for_a_down_redis_then_exits_3(tmp_path) -> None:
    (tmp_path / "downapp.py").write_text(
        "from ringfence import App\n"
        "from ringfence.redis.connection import ConnectionSettings\n"
        f"app = App({_down_url()!r}, 'tbadinput', redis=ConnectionSettings(first_connect_s=1.0))\n")
    out = ringfence("worker", "--app", "downapp:app", env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Redis at redis://127.0.0.1:") and "did not answer within 1s" in last
    assert "Traceback" not in out.stderr


def test_debug_adds_the_traceback(locked_redis) -> None:
    out = ringfence("--debug", "info", env={"RINGFENCE_REDIS_URL": f"redis://127.0.0.1:{locked_redis.port}/0"})
    assert out.returncode == 3 and "Traceback" in out.stderr and "AuthenticationError" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: Redis at")


def test_the_right_password_works(locked_redis) -> None:
    out = ringfence("info", "--json", env={"RINGFENCE_REDIS_URL": f"redis://:s3cret@127.0.0.1:{locked_redis.port}/0"})
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("command", [*COMMANDS, ["scheduler"]], ids=lambda c: " ".join(c[:2]))
def test_no_redis_url_is_one_line_and_starts_nothing(tmp_path, command) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = ringfence(*command, env={"TMPDIR": str(tmp)}, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1 and ("no Redis URL" in out.stderr or "no @app.periodic" in out.stderr)
    assert list(tmp.iterdir()) == []  # no embedded redis-server directory was created


@pytest.mark.parametrize("command", [["fence", "list"], ["fence", "show", "order:1", "charge"], ["fence", "init"],
                                     ["fence", "resolve", "order:1", "charge", "--not-done"], ["fence", "prune"],
                                     ["reconcile", "--step", "charge"]], ids=lambda c: " ".join(c[:2]))
def test_fence_commands_need_a_fence_url(tmp_path, redis_url, command) -> None:
    out = ringfence(*command, env={"RINGFENCE_REDIS_URL": redis_url}, cwd=tmp_path)
    assert out.returncode == 2 and "no fence database" in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "ringfence.db").exists()


@pytest.fixture(scope="module")
def no_tables(tmp_path_factory) -> Iterator[str]:
    """A PostgreSQL database of this module's own, without the fence tables."""
    from empty_databases import empty_database

    with empty_database("postgresql", tmp_path_factory.mktemp("pg")) as url:
        yield url


def _acl_user(srv: EmbeddedRedis, denied: str) -> str:
    """A Redis URL of a user of ``srv`` with every command but ``denied``."""
    import redis

    admin = redis.Redis(port=srv.port, password="s3cret")
    name = f"no{denied.strip('-@')}"
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", "~*", "&*", "+@all", denied)
    admin.close()
    return f"redis://{name}:pw@127.0.0.1:{srv.port}/0"


# Operator mistakes that printed a traceback (or nothing): id -> (command, env made from the fixtures, exit code,
# what the one line says). A fence URL whose database is down or unreachable and a Redis user refused a command
# are "cannot connect" (3); the rest are a refused input or configuration (2).
TRAPS: dict[str, tuple[list[str], Callable[[Any], dict[str, str]], int, str]] = {
    "fence list, database down": (["fence", "list"], lambda f: {
        "RINGFENCE_FENCE_URL": f"postgresql://root:pw@127.0.0.1:{free_port()}/test"}, 3,
        "cannot connect to the fence database at postgresql://root:***@127.0.0.1:"),
    "fence show, database down": (["fence", "show", "order:1", "charge"], lambda f: {
        "RINGFENCE_FENCE_URL": f"mysql+pymysql://root@127.0.0.1:{free_port()}/test"}, 3,
        "cannot connect to the fence database at mysql+pymysql://root@127.0.0.1:"),
    "fence list, no tables": (["fence", "list"], lambda f: {"RINGFENCE_FENCE_URL": f.no_tables}, 2,
                              "no fence table ringfence_fences in postgresql"),
    "fence show, no tables": (["fence", "show", "order:1", "charge"], lambda f: {"RINGFENCE_FENCE_URL": f.no_tables},
                              2, "`ringfence fence init`"),
    "fence list, driver not installed": (["fence", "list"], lambda f: {
        "RINGFENCE_FENCE_URL": "mssql+pyodbc://sa:pw@127.0.0.1/test"}, 2,
        "fence database mssql+pyodbc://sa:***@127.0.0.1/test: its driver is not installed"),
    "fence show, unknown driver": (["fence", "show", "order:1", "charge"], lambda f: {
        "RINGFENCE_FENCE_URL": "postgresql+nodriver://root@127.0.0.1/test"}, 2, "bad fence database URL"),
    "log level": (["--log-level", "garbage", "info"], lambda f: {}, 2, "--log-level 'garbage' is not a log level"),
    "doctor sample": (["doctor", "--sample-s", "-1"], lambda f: {}, 2, "--sample-s -1.0 must be >= 0"),
    "worker port": (["worker", "--metrics-port", "99999"], lambda f: {}, 2, "--metrics-port 99999 is not a TCP port"),
    "exporter port": (["exporter", "--port", "99999"], lambda f: {}, 2, "--port 99999 is not a TCP port"),
    "reconcile file": (["reconcile", "--step", "charge", "--effects", "missing.csv"], lambda f: {
        "RINGFENCE_FENCE_URL": f"sqlite:///{f.tmp}/fences.db"}, 2, "--effects missing.csv: no such file"),
    "reconcile table": (["reconcile", "--step", "charge", "--effects", "payments"], lambda f: {
        "RINGFENCE_FENCE_URL": f.no_tables}, 2, "no table 'payments' in postgresql"),
    "servers, ACL without TIME": (["servers"], lambda f: {"RINGFENCE_REDIS_URL": _acl_user(f.redis, "-time")}, 3,
                                  "refused a command to this user (grant it in the user's ACL): this user has no "
                                  "permissions to run the 'time' command"),
    "doctor, ACL without TIME": (["doctor", "--sample-s", "0"], lambda f: {
        "RINGFENCE_REDIS_URL": _acl_user(f.redis, "-time")}, 3, "no permissions to run the 'time' command"),
    "info, ACL without SMEMBERS": (["info"], lambda f: {"RINGFENCE_REDIS_URL": _acl_user(f.redis, "-smembers")}, 3,
                                   "no permissions to run the 'smembers' command"),
    "django entry without settings": (["info", "--app", "ringfence.contrib.django.entry:app"], lambda f: {
        "DJANGO_SETTINGS_MODULE": ""}, 2,
                                      "needs DJANGO_SETTINGS_MODULE"),
    "redis database not a number": (["info"], lambda f: {"RINGFENCE_REDIS_URL": "redis://127.0.0.1:6379/abc"}, 3,
                                    "bad Redis URL redis://127.0.0.1:6379/abc: database 'abc' is not a number"),
}


@pytest.mark.parametrize("trap", list(TRAPS))
def test_operator_traps_are_one_line_with_their_exit_code(trap, locked_redis, no_tables, redis_url,
                                                          tmp_path) -> None:
    command, make_env, code, expected = TRAPS[trap]
    found = SimpleNamespace(redis=locked_redis, no_tables=no_tables, tmp=tmp_path)
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": "tbadinput", **make_env(found)}
    out = ringfence(*command, env=env, cwd=tmp_path)
    assert out.returncode == code, (out.stdout, out.stderr)
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert expected in out.stderr, out.stderr
    assert ":pw@" not in out.stderr and "s3cret" not in out.stderr  # no password printed


def test_embedded_redis_only_when_asked(tmp_path, monkeypatch) -> None:
    from ringfence import App, ConfigError

    # Restored afterwards: an embedded app exports its URL to child processes through this variable.
    monkeypatch.delenv("RINGFENCE_REDIS_URL", raising=False)

    with pytest.raises(ConfigError, match="no Redis URL"):
        App(environment="test").broker  # noqa: B018
    app = App("embedded", "tbadinput")
    try:
        assert app.broker.sync.ping() and app.redis_url.startswith("unix://")
    finally:
        app.close()


async def test_fenced_task_without_fence_url_outside_default_environment_dead_letters_once(make_app) -> None:
    app = make_app(environment="production")

    @app.task(name="charge")
    def charge(ctx, order_id: int) -> None:
        with ctx.fence(f"order:{order_id}", "charge") as step:
            step.effect(lambda: "ch_1")

    charge.enqueue(order_id=1)
    await run_until(app, lambda: dead_jobs(app.broker, DeadFilter()))
    [job] = dead_jobs(app.broker, DeadFilter())
    assert job.reason == "permanent" and job.attempts == 1
    assert "environment 'production' needs an explicit fence database" in job.error and "\n" not in job.error


async def test_complete_on_another_database_names_both_once(make_app, tmp_path) -> None:
    fence_url, other_url = f"sqlite:///{tmp_path}/fences.db", f"sqlite:///{tmp_path}/orders.db"
    other = create_engine(other_url)
    with other.begin() as c:
        c.execute(text("create table orders (id integer primary key, charge_id text)"))
    app = make_app(environment="test", fence_url=fence_url)

    @app.task(name="charge")
    def charge(ctx, order_id: int) -> None:
        with ctx.fence(f"order:{order_id}", "charge") as step:
            ref = step.effect(lambda: "ch_1")
            with step.complete(other) as conn:
                conn.execute(text("insert into orders values (:i, :r)"), {"i": order_id, "r": ref})

    charge.enqueue(order_id=1)
    await run_until(app, lambda: dead_jobs(app.broker, DeadFilter()))
    [job] = dead_jobs(app.broker, DeadFilter())
    assert job.reason == "permanent" and job.attempts == 1, job
    assert other_url in job.error and fence_url in job.error and "\n" not in job.error
    assert "no fence table ringfence_fences" in job.error and "SELECT" not in job.error.upper()
    assert str(app.fence_store.get("order:1", "charge").state) == "effected"  # kept: a replay completes it
    with other.connect() as c:
        assert c.execute(text("select count(*) from orders")).scalar() == 0


async def test_a_stray_ringfence_db_is_ignored_outside_the_default_environment(make_app, tmp_path,
                                                                              monkeypatch) -> None:
    """The dead-letter path looks for steps the job owns; in production it never opens ./ringfence.db."""
    from ringfence import Permanent

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ringfence.db").write_bytes(b"")
    app = make_app(environment="production")

    @app.task(name="refuse")
    def refuse(ctx, n: int) -> None:
        raise Permanent("no")

    refuse.enqueue(n=1)
    await run_until(app, lambda: dead_jobs(app.broker, DeadFilter()))
    [job] = dead_jobs(app.broker, DeadFilter())
    assert job.reason == "permanent" and "Permanent: no" in job.error
    assert (tmp_path / "ringfence.db").read_bytes() == b""
