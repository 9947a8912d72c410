"""Redis answering LOADING (reading its data after a restart or DEBUG RELOAD) is waited out, never an exit 3:
here during a worker's final ack flush at shutdown, on a private redis-server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from ringfence import App
from support import ROOT, wait_until


def _loading(r: redis.Redis) -> bool:
    try:
        return bool(r.info("persistence")["loading"])
    except redis.BusyLoadingError:
        return True


def _reload(url: str) -> None:
    with contextlib.suppress(redis.RedisError):  # its own answer does not matter here
        redis.Redis.from_url(url).execute_command("DEBUG", "RELOAD")


def _marked(directory: Path, kind: str) -> bool:
    return any(p.name.endswith(f".{kind}") for p in directory.iterdir())


def _slow(ctx: object, seconds: float) -> None:
    pass


def test_a_worker_stopping_while_redis_loads_waits_and_acks(private_redis: Any, tmp_path: Path) -> None:
    """SIGTERM while a job runs, then Redis reloads its data (DEBUG RELOAD, slowed to last): the job ends during
    the reload, so the final ack flush meets LOADING and waits; once loaded the ack goes through and the worker
    exits 0 (not 3), the job acknowledged (not left leased, to run again)."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(private_redis.url)
    app = App(private_redis.url, ns, environment="test")
    job = app.task(name="faultapp.slow_a", queue="a")(_slow).enqueue(seconds=2.0)
    env = {**os.environ, "RINGFENCE_REDIS_URL": private_redis.url, "RINGFENCE_NAMESPACE": ns,
           "FAULT_DIR": str(tmp_path), "FAULT_LEASE_S": "30",
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    w = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "faultapp:app", "--queues", "a"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    reload = threading.Thread(target=_reload, args=(private_redis.url,), daemon=True)
    try:
        wait_until(lambda: _marked(tmp_path, "started") or w.poll() is not None, timeout=30)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
        r.execute_command("DEBUG", "POPULATE", "40000", "filler")
        r.config_set("key-load-delay", 1000)  # µs per key: up to 40 s of LOADING, ended below
        r.config_set("loading-process-events-interval-bytes", 1024)
        w.send_signal(signal.SIGTERM)  # the running job (2 s) is waited for, then the final flush
        reload.start()
        wait_until(lambda: _loading(r), timeout=10, interval=0.01)
        wait_until(lambda: _marked(tmp_path, "finished") or w.poll() is not None, timeout=30)
        time.sleep(2.0)  # the final flush meets LOADING
    finally:
        loading = _loading(r)
        r.config_set("key-load-delay", 0)
        try:
            code = w.wait(60)
        finally:
            if w.poll() is None:
                w.kill()
            out = w.communicate(timeout=30)[0].decode(errors="replace")
            reload.join(30)
    assert loading, "Redis finished loading before the final flush: the test proved nothing"
    assert code == 0, out
    assert "is unreachable (BusyLoadingError" in out and "Traceback" not in out, out
    k = app.broker.keys.queue("a")
    assert r.zscore(k.active, job) is None and r.hget(k.stats, "processed") == b"1"
    app.close()
