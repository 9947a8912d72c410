"""The doctor tells the truth: every command its remedies print parses with the real CLI, a job left active by a
SIGKILLed worker is reported, and an orphaned attempt is reported after its job was recovered and finished."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from ringfence.cli import main as cli
from ringfence.doctor import Status, Thresholds, diagnose
from ringfence.fence.model import Owner
from support import ROOT, wait_until
from test_doctor import _task, finding

QUICK = Thresholds(sample_s=0.2)
SOURCES = [*sorted((ROOT / "src/ringfence/doctor").glob("*.py")), ROOT / "src/ringfence/alerts.py"]
COMMAND = re.compile(r"`(ringfence [^`]+)`")


def _strings(path: Path) -> list[str]:
    """Every string literal of a module, f-strings with their placeholders rendered as X."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values))
    return out


def printed_commands() -> list[str]:
    return sorted({c for path in SOURCES for s in _strings(path) for c in COMMAND.findall(s)})


def parse(command: str) -> None:
    """Parse ``command`` with the real click command tree: unknown commands, options or arguments raise."""
    args = shlex.split(command.replace("[", "").replace("]", ""))[1:]
    cmd: click.Command = cli
    ctx = click.Context(cli)
    while isinstance(cmd, click.Group):
        assert args, f"{command!r} names no subcommand of {cmd.name}"
        name, *args = args
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"{command!r}: no command {name!r}"
        cmd = sub
    cmd.make_context(cmd.name, _typed(cmd, args))


def _typed(cmd: click.Command, args: list[str]) -> list[str]:
    """Placeholders (N, SECONDS, ROW_ID) of a numeric option or argument become a number, so the type check runs
    on a real value."""
    options = {name: p for p in cmd.params if isinstance(p, click.Option) for name in p.opts}
    numeric_argument = any(isinstance(p, click.Argument) and p.type.name in ("float", "integer") for p in cmd.params)
    out = list(args)
    for i in range(len(out)):
        option = options.get(out[i - 1]) if i else None
        takes_value = option is not None and not option.is_flag
        numeric = option.type.name in ("float", "integer") if takes_value and option else numeric_argument
        if numeric and re.fullmatch(r"[A-Z_]+", out[i]):
            out[i] = "1"
    return out


def test_every_command_a_remedy_prints_parses() -> None:
    commands = printed_commands()
    assert any("fence resolve" in c for c in commands) and len(commands) >= 5, commands
    for command in commands:
        parse(command)


def test_the_parser_check_catches_a_wrong_option() -> None:
    with pytest.raises(click.NoSuchOption):
        parse("ringfence fence resolve SUBJECT STEP --happened --reference REF")


def test_the_in_doubt_remedy_settles_the_fence_through_the_cli(make_app, tmp_path, redis_url, namespace) -> None:
    url = f"sqlite:///{tmp_path}/fences.db"
    app = make_app(environment="test", fence_url=url)
    store = app.fence_store
    store.capture("order:7", "charge", Owner("job-1", "tok-1", 30.0), "h", None)
    store.mark_calling("order:7", "charge", 1, None, 30.0)
    store.park("order:7", "charge", 1)
    remedy = finding(diagnose(app, QUICK), "in_doubt", "fences").remedy
    commands = COMMAND.findall(remedy)
    assert any("--done" in c for c in commands) and any("--not-done" in c for c in commands)
    for command in commands:
        parse(command)
    not_done = next(c for c in commands if "--not-done" in c).replace("SUBJECT STEP", "order:7 charge")
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "RINGFENCE_FENCE_URL": url}
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", *shlex.split(not_done)[1:]], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert str(store.get("order:7", "charge").state) == "claimed"


@pytest.mark.slow
def test_a_job_left_active_by_a_sigkilled_worker_is_a_failure(make_app, spawn_worker) -> None:
    app = make_app(environment="test")
    first = spawn_worker()
    job = app.enqueue_many(_task(app, "workerapp.slow"), [{"seconds": 60}])[0]
    wait_until(lambda: app.broker.lease_token("default", job))
    first.kill()
    wait_until(lambda: not app.broker.servers(), timeout=15)  # its heartbeat entry expires
    report = diagnose(app, QUICK)
    stuck = finding(report, "stuck_active", "default")
    assert stuck.status == Status.FAILURE and stuck.numbers["active"] == 1 and stuck.numbers["servers"] == 0
    assert report.exit_code == 2
    spawn_worker()  # a live worker recovers it: the check is healthy again
    wait_until(lambda: any(h.get("orphaned") for h in app.broker.history("default", job)), timeout=30)
    assert [f.status for f in diagnose(app, QUICK).by_check("stuck_active")] == [Status.OK]


@pytest.mark.slow
def test_an_orphaned_attempt_is_reported_after_its_job_was_recovered_and_acked(make_app, spawn_worker) -> None:
    app = make_app(environment="test")
    first = spawn_worker()
    job = app.enqueue_many(_task(app, "workerapp.slow"), [{"seconds": 2}])[0]
    wait_until(lambda: app.broker.lease_token("default", job))
    first.kill()
    spawn_worker()
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed", 0) >= 1, timeout=40)
    assert app.broker.history("default", job) == []  # the history left with the ack
    f = finding(diagnose(app, QUICK), "orphaned", "default")
    assert f.numbers["total"] == 1 and f.numbers["recent"] == 0 and f.numbers["last_s_ago"] < 60
