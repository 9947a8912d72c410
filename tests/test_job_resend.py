"""``ringfence job resend`` as an operator runs it: the log of a real producer whose Redis was down at commit
(text or ``--log-json``), every line checked before anything is sent, a report per line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from ringfence import App
from ringfence.redis.embedded import free_port

# A producer whose Redis is down at commit: its jobs are logged ("on-commit job not sent ... {record}").
PRODUCER = """
import sys
from datetime import UTC, datetime, timedelta
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from ringfence import App, logs

logs.configure(json=sys.argv[1] == "json")
app = App(sys.argv[2], "unused")
app.on_commit.retry_for_s = 0.2

@app.task(name="receipt")
def receipt(ctx, order_id: int) -> None: ...

with Session(create_engine(sys.argv[3])) as s:
    receipt.enqueue_on_commit(s, order_id=1)
    receipt.with_options(run_at=datetime.now(UTC) + timedelta(hours=1)).enqueue_on_commit(s, order_id=2)
    s.commit()
"""

APP = """
import os
from ringfence import App

app = App(os.environ["RINGFENCE_REDIS_URL"], os.environ["RINGFENCE_NAMESPACE"])

@app.task(name="receipt")
def receipt(ctx, order_id: int) -> None: ...
"""


def env_for(tmp_path: Path, redis_url: str, namespace: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
            "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def resend(tmp_path: Path, redis_url: str, namespace: str, log: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "resendapp.py").write_text(APP)
    return subprocess.run([sys.executable, "-m", "ringfence.cli", "job", "resend", "--app", "resendapp:app", str(log)],
                          env=env_for(tmp_path, redis_url, namespace), capture_output=True, text=True, timeout=60)


def producer_log(tmp_path: Path, fmt: str) -> Path:
    """The stderr of a real producer process that committed two on-commit jobs while Redis was down."""
    (tmp_path / "producer.py").write_text(PRODUCER)
    down = f"redis://127.0.0.1:{free_port()}/0"
    done = subprocess.run([sys.executable, str(tmp_path / "producer.py"), fmt, down, f"sqlite:///{tmp_path}/app.db"],
                          capture_output=True, text=True, timeout=60, env=env_for(tmp_path, down, "unused"))
    assert done.returncode == 0, done.stderr
    log = tmp_path / f"producer.{fmt}.log"
    log.write_text(done.stderr)
    return log


def ids_in(log: Path) -> list[str]:
    """The job ids the producer logged as not sent, in order, once each."""
    import re

    return list(dict.fromkeys(re.findall(r'\\?"id\\?":\s*\\?"([0-9a-zA-Z_-]+)', log.read_text())))


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_resend_reads_the_producers_log_in_either_format(fmt, tmp_path, redis_url, namespace) -> None:
    log = producer_log(tmp_path, fmt)
    first, second = ids_in(log)
    if fmt == "json":
        assert all(orjson.loads(line)["level"] for line in log.read_text().splitlines())  # JSON log lines only
    log.write_text(log.read_text() * 2)  # two copies of a log concatenated: each job is sent once
    out = resend(tmp_path, redis_url, namespace, log)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "2 sent, 0 queued already", out.stdout
    assert sum("the same job as line" in line for line in out.stdout.splitlines()) == 2
    live = App(redis_url, namespace)
    try:
        assert live.broker.job_state("default", first) == "pending"
        assert live.broker.job_state("default", second) == "scheduled"
        again = resend(tmp_path, redis_url, namespace, log)
        assert again.returncode == 0 and again.stdout.splitlines()[-1] == "0 sent, 2 queued already", again.stdout
    finally:
        live.close()


def test_one_bad_line_sends_nothing_and_each_bad_line_is_named(tmp_path, redis_url, namespace) -> None:
    def record(job_id: str, **extra: object) -> str:
        return orjson.dumps({"id": job_id, "task": "receipt", "args": {"order_id": 1}, **extra}).decode()

    lines = [
        record("good-1"),
        "2026-01-01 00:00:00,000 INFO ringfence.worker: started",  # another log line: skipped
        record("bad-date", options={"run_at": "not a date"}),
        record("good-2"),
        record("bad-task", task="nosuch"),
        '{"id": "cut-short", "task": "receipt", "args": {"order_',
        record("bad-args", args={"order_id": "one"}),
    ]
    log = tmp_path / "mixed.log"
    log.write_text("\n".join(lines) + "\n")
    out = resend(tmp_path, redis_url, namespace, log)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    errors = out.stderr.splitlines()
    assert [e.split(":")[0] for e in errors[:-1]] == ["line 3", "line 5", "line 6", "line 7"], out.stderr
    assert "run_at 'not a date' is not an ISO-8601 date" in errors[0]
    assert "task 'nosuch' is not registered" in errors[1]
    assert errors[-1] == ("error: 4 line(s) refused (listed above); nothing sent: fix or remove them and run "
                          "again")
    assert "Traceback" not in out.stderr
    live = App(redis_url, namespace)
    try:
        assert live.broker.job_state("default", "good-1") is None  # the good lines wait for the fixed file
        log.write_text("\n".join(lines[:2] + lines[3:4]) + "\n")
        fixed = resend(tmp_path, redis_url, namespace, log)
        assert fixed.returncode == 0, fixed.stderr
        assert fixed.stdout.splitlines() == ["line 1: good-1: sent", "line 3: good-2: sent",
                                             "2 sent, 0 queued already"]
        assert live.broker.job_state("default", "good-1") == "pending"
    finally:
        live.close()
