"""Small operator traps, each through the real CLI against real Redis (and MariaDB for the DDL)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import click
import orjson
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, inspect, text

from ringfence.cli import main as cli
from ringfence.fence.schema import ddl
from ringfence.redis.embedded import free_port
from support import database_url, wait_until


def run(namespace: str, redis_url: str, *args: str) -> Result:
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace}
    return CliRunner().invoke(cli, list(args), env=env)


def test_pause_refuses_an_unknown_or_malformed_queue(make_app, namespace, redis_url, rdb) -> None:
    app = make_app()
    app.broker.register_queues(["mail"])
    for name in ("mial", "bad name!"):
        res = run(namespace, redis_url, "queue", "pause", name)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "no queue 'mial'" in run(namespace, redis_url, "queue", "resume", "mial").output
    assert sorted(k.decode() for k in rdb.scan_iter(f"{namespace}:*")) == [f"{namespace}:queues"]  # no stray key
    assert run(namespace, redis_url, "queue", "pause", "mail").exit_code == 0
    assert app.broker.queue_counts("mail")["paused"]
    assert run(namespace, redis_url, "queue", "resume", "mail").exit_code == 0
    assert not app.broker.queue_counts("mail")["paused"]


def test_prune_refuses_a_negative_age(make_app, namespace, redis_url) -> None:
    make_app().broker.register_queues(["default"])
    for bad in ("-1", "nan"):
        res = run(namespace, redis_url, "dead", "prune", "--older-than-days", bad)
        assert res.exit_code == 2 and "must be >= 0" in res.output, res.output


def _listening(port: int) -> str | None:
    """The local address a TCP socket listens on at ``port`` (from /proc/net/tcp), e.g. 127.0.0.1."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if int(hexport, 16) == port and state == "0A":
                return ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return None


@pytest.mark.parametrize("host_args,expected", [((), "127.0.0.1"), (("--metrics-host", "0.0.0.0"), "0.0.0.0")])
def test_worker_metrics_bind_loopback_unless_told(spawn_worker, host_args, expected) -> None:
    port = free_port()
    w = spawn_worker("--metrics-port", str(port), *host_args)
    try:
        assert wait_until(lambda: _listening(port), timeout=30) == expected
    finally:
        w.kill()


async def test_unknown_task_is_warned_once_naming_the_known_tasks(make_app, caplog) -> None:
    from ringfence.worker.worker import Worker

    producer = make_app()

    @producer.task(name="gone")
    async def gone(ctx) -> None: ...

    job = gone.enqueue()
    consumer = make_app()
    consumer.worker_settings = consumer.worker_settings.__class__(
        **{**consumer.worker_settings.__dict__, "defer_s": 0.05, "grace_s": 3600})

    @consumer.task(name="known_one")
    async def known_one(ctx) -> None: ...

    caplog.set_level(logging.INFO, logger="ringfence")
    worker = Worker(consumer)
    runner = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 15
    while consumer.broker.queue_counts("default")["stats"].get("unknown_task", 0) < 5:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    worker.request_stop()
    await asyncio.wait_for(runner, 10)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and job in r.getMessage()]
    assert len(warned) == 1 and "it knows: known_one" in warned[0], warned
    started = [r.getMessage() for r in caplog.records if "no --queues: the queues its tasks declare" in r.getMessage()]
    assert len(started) == 1


def test_help_says_what_a_worker_without_queues_serves() -> None:
    res = CliRunner().invoke(cli, ["worker", "--help"])
    assert "default: only the queues the app's tasks" in " ".join(res.output.split())
    assert "--metrics-host" in res.output


def test_version() -> None:
    from importlib.metadata import version

    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"ringfence, version {version('ringfence')}"


def test_every_command_and_option_has_help() -> None:
    missing: list[str] = []

    def walk(cmd: click.Command, path: str) -> None:
        if not (cmd.help or cmd.short_help):
            missing.append(path)
        missing.extend(f"{path} {p.opts[0]}" for p in cmd.params
                       if isinstance(p, click.Option) and not p.hidden and not p.help)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(cli, "ringfence")
    assert missing == []


def test_interval_is_spelled_interval_s_everywhere_and_the_old_spelling_still_parses(make_app) -> None:
    for command in (["scheduler"], ["watch"], ["relay"]):
        res = CliRunner().invoke(cli, [*command, "--help"])
        assert "--interval-s" in res.output and "--interval " not in res.output
    scheduler = cli.commands["scheduler"]
    assert scheduler.make_context("scheduler", ["--interval", "2"]).params["interval_old"] == 2.0
    assert scheduler.make_context("scheduler", ["--interval-s", "3"]).params["interval_s"] == 3.0


@pytest.mark.parametrize("dialect", ["mariadb", "mysql", "postgresql", "sqlite"])
def test_ddl_of_every_dialect_runs_on_its_database(dialect, tmp_path) -> None:
    suffix = uuid.uuid4().hex[:8]
    names = {"table_name": f"ddl_f_{suffix}", "failed_jobs_name": f"ddl_j_{suffix}"}
    statements = [s for s in ddl(dialect, **names).split(";\n") if s.strip()]
    res = CliRunner().invoke(cli, ["fence", "ddl", "--dialect", dialect])
    assert res.exit_code == 0 and "CREATE TABLE ringfence_failed_jobs" in res.output
    db = {"mariadb": "mariadb", "mysql": "mariadb", "postgresql": "postgresql", "sqlite": "sqlite"}[dialect]
    engine = create_engine(database_url(db, tmp_path))
    try:
        with engine.begin() as c:
            for s in statements:
                c.execute(text(s))
        assert {names["table_name"], names["failed_jobs_name"]} <= set(inspect(engine).get_table_names())
    finally:
        with engine.begin() as c:
            for name in names.values():
                c.execute(text(f"DROP TABLE IF EXISTS {name}"))
        engine.dispose()



def test_info_on_a_namespace_without_queues_names_the_namespaces_that_have_some(make_app, namespace,
                                                                                  redis_url) -> None:
    from test_cli_errors import ringfence

    make_app().broker.register_queues(["mail"])
    typo = f"{namespace}x"
    out = ringfence("info", env={"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": typo})
    assert out.returncode == 0, out.stderr
    [hint] = out.stderr.splitlines()
    assert hint.startswith(f"hint: namespace '{typo}' has no queues: is RINGFENCE_NAMESPACE (or the app's "
                           f"namespace) right? Namespaces with queues on this Redis: {namespace}")  # the closest first
    as_json = ringfence("info", "--json", env={"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": typo})
    in_json = orjson.loads(as_json.stdout)["hint"]
    assert in_json.startswith(f"namespace '{typo}' has no queues") and f": {namespace}" in in_json
    served = ringfence("info", "--json", env={"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace})
    assert "hint" not in orjson.loads(served.stdout) and served.stderr == ""
