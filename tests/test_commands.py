"""Every documented command not covered elsewhere, run as a real process against the real services, each
asserting its effect: scheduler, worker --scheduler, watch, exporter, dead prune, fence init|ddl|list|show|prune.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import create_engine, inspect, text

from ringfence.fence import FenceStore
from ringfence.fence.model import Owner
from ringfence.models import JobSpec, now_ms
from ringfence.redis.broker import Broker
from support import kill_groups, wait_until

PERIODIC_APP = """
import os
import redis
from ringfence import App, WorkerSettings

app = App(os.environ["RINGFENCE_REDIS_URL"], os.environ["RINGFENCE_NAMESPACE"], environment="test",
          worker=WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                                shutdown_timeout_s=3.0, server_ttl_s=3.0))
r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])

@app.periodic("* * * * *", name="beat")
def beat(ctx) -> None:
    r.rpush(os.environ["RINGFENCE_NAMESPACE"] + ":test:beats", ctx.id)
"""


@pytest.fixture
def env(redis_url: str, namespace: str, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "periodicapp.py").write_text(PERIODIC_APP)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")}
    return {**clean, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def run(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=90)


@pytest.fixture
def spawn(env: dict[str, str]) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "ringfence.cli", *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(p)
        return p

    yield start
    kill_groups(procs)


def stop(p: subprocess.Popen[str]) -> int:
    p.send_signal(signal.SIGTERM)
    return p.wait(30)


# -- scheduling ---------------------------------------------------------------------------------------------

def test_scheduler_enqueues_the_due_tick_once(spawn, make_app, rdb, namespace) -> None:
    app = make_app()
    two = [spawn("scheduler", "--app", "periodicapp:app", "--interval", "0.2") for _ in range(2)]
    wait_until(lambda: app.broker.queue_counts("default")["pending"] >= 1, timeout=30)
    time.sleep(1.0)  # both schedulers ran several more checks
    counts = app.broker.queue_counts("default")
    assert counts["pending"] == 1 and counts["stats"]["enqueued"] == 1  # one tick, however many schedulers
    [job_id] = [j.decode() for j in rdb.lrange(app.broker.keys.queue("default").pending, 0, -1)]
    assert job_id.startswith("cron:beat:")
    assert [stop(p) for p in two] == [0, 0]


def test_worker_with_scheduler_runs_the_periodic_task(spawn, rdb, namespace) -> None:
    w = spawn("worker", "--app", "periodicapp:app", "--scheduler")
    beats = wait_until(lambda: rdb.lrange(f"{namespace}:test:beats", 0, -1), timeout=30)
    assert beats[0].decode().startswith("cron:beat:")
    assert stop(w) == 0


# -- watch and exporter -------------------------------------------------------------------------------------

class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_watch_opens_an_incident_and_posts_the_webhook(env, make_app, rdb, namespace) -> None:
    app = make_app()
    app.broker.register_queues(["orphans"])
    app.broker.run(app.broker.enqueue("orphans", [("j1", JobSpec("t", {}, app.broker.clock()).encode(), 0)]))
    _Hook.received = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = run("watch", "--iterations", "2", "--interval-s", "0.1",  # the first evaluation only samples
                  "--webhook-url", f"http://127.0.0.1:{server.server_port}/", env=env)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    assert rdb.hexists(f"{namespace}:alerts", "queue_unserved:orphans")
    assert "queue_unserved" in [h["kind"] for h in _Hook.received]


def test_exporter_serves_the_queue_gauges(spawn, make_app) -> None:
    app = make_app()
    app.broker.register_queues(["default"])
    spec = JobSpec("t", {}, app.broker.clock()).encode()
    app.broker.run(app.broker.enqueue("default", [("j1", spec, 0), ("j2", spec, 0)]))
    p = spawn("exporter", "--port", "0", "--addr", "127.0.0.1")
    first = p.stdout.readline()
    url = first.split()[2]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), first
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'ringfence_queue_pending{queue="default"} 2.0' in body
    assert "ringfence_redis_up 1.0" in body


# -- dead prune ---------------------------------------------------------------------------------------------

def _dead_job(b: Broker, job_id: str) -> None:
    b.register_queues(["default"])
    b.run(b.enqueue("default", [(job_id, JobSpec("t", {}, b.clock()).encode(), 0)]))
    [(got, _, _)] = b.run(b.fetch("default", 1, b.clock() + 60_000, "tok"))
    assert got == job_id and b.run(b.dead("default", job_id, "tok", {"attempt": 1}, {"reason": "permanent"}))


def test_dead_prune_deletes_only_older_dead_jobs(env, make_app, redis_url, namespace) -> None:
    app = make_app()
    two_days_ago = Broker(redis_url, namespace, clock=lambda: now_ms() - 2 * 86_400_000)
    _dead_job(two_days_ago, "old")
    _dead_job(app.broker, "new")
    out = run("dead", "prune", "--older-than-days", "1", env=env)
    assert out.returncode == 0 and "deleted 1 job(s)" in out.stdout, out.stderr
    assert app.broker.dead_ids("default", 0, 10) == ["new"]
    assert app.broker.queue_counts("default")["dead"] == 1


# -- fence --------------------------------------------------------------------------------------------------

def _completed_fence(store: FenceStore, subject: str, retention_s: float | None) -> None:
    row = store.capture(subject, "charge", Owner("job-1", "tok-1", 30.0), "h", retention_s)
    assert row is not None
    store.mark_calling(subject, "charge", row.epoch, None, 30.0)
    store.record(subject, "charge", row.epoch, "ch_1")
    store.complete(subject, "charge", row.epoch, '{"charge_id": "ch_1"}')


def test_fence_ddl_creates_the_tables_it_prints(tmp_path, env) -> None:
    out = run("fence", "ddl", "--dialect", "sqlite", env=env)
    assert out.returncode == 0 and "CREATE TABLE ringfence_fences" in out.stdout
    engine = create_engine(f"sqlite:///{tmp_path}/ddl.db")
    with engine.begin() as c:
        for statement in out.stdout.split(";"):
            if statement.strip():
                c.execute(text(statement))
    assert {"ringfence_fences", "ringfence_failed_jobs"} <= set(inspect(engine).get_table_names())
    for dialect in ("postgresql", "mysql"):
        other = run("fence", "ddl", "--dialect", dialect, env=env)
        assert other.returncode == 0 and "CREATE TABLE ringfence_fences" in other.stdout


def test_fence_init_list_show_and_prune(tmp_path, env) -> None:
    url = f"sqlite:///{tmp_path}/fences.db"
    env = {**env, "RINGFENCE_FENCE_URL": url}
    out = run("fence", "init", env=env)
    assert out.returncode == 0 and "fence tables ready" in out.stdout, out.stderr
    engine = create_engine(url)
    assert {"ringfence_fences", "ringfence_failed_jobs"} <= set(inspect(engine).get_table_names())

    store = FenceStore(engine)
    _completed_fence(store, "order:1", retention_s=None)   # kept forever
    _completed_fence(store, "order:2", retention_s=0.5)    # prunable once half a second old
    listed = run("fence", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert sorted((r["subject"], r["state"]) for r in json.loads(listed.stdout)) == [
        ("order:1", "completed"), ("order:2", "completed")]
    shown = run("fence", "show", "order:1", "charge", env=env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["reference"] == "ch_1"
    missing = run("fence", "show", "order:9", "charge", env=env)
    assert missing.returncode == 2 and "no fence 'order:9'/'charge'" in missing.stderr

    time.sleep(1.5)
    pruned = run("fence", "prune", env=env)
    assert pruned.returncode == 0 and "deleted 1 fence row(s)" in pruned.stdout, pruned.stderr
    assert store.get("order:2", "charge") is None and store.get("order:1", "charge") is not None
