"""Worker recycling (``--max-jobs-per-child``, ``--max-memory-mb``) under real worker processes, one process or
two under the supervisor: a leaking handler marks each run; no job is lost or run twice, and replacements serve."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from support import ROOT, wait_until

pytestmark = pytest.mark.slow

APP = ("--app", "recycleapp:app", "-c", "1")


def producer(redis_url: str, namespace: str) -> Any:
    os.environ["RINGFENCE_NAMESPACE"] = namespace
    os.environ["RINGFENCE_REDIS_URL"] = redis_url
    import importlib

    import recycleapp

    return importlib.reload(recycleapp)


def runs(rdb: Any, namespace: str) -> list[tuple[str, int, str, int, int]]:
    """(job id, n, process image, pid, attempt) of each run, in order."""
    out = []
    for line in rdb.lrange(f"{namespace}:test:runs", 0, -1):
        job_id, n, boot, pid, attempt = line.decode().split()
        out.append((job_id, int(n), boot, int(pid), int(attempt)))
    return out


def run_all(m: Any, rdb: Any, namespace: str, count: int, mb: int, seconds: float = 0.0) -> list[Any]:
    ids = [m.leak.enqueue(n=n, mb=mb, seconds=seconds) for n in range(count)]
    done = wait_until(lambda: len(runs(rdb, namespace)) >= count and runs(rdb, namespace), timeout=90)
    stats = m.app.broker.queue_counts("default")["stats"]  # "orphaned": a run whose lease lapsed
    assert sorted(j for j, *_ in done) == sorted(ids), (done, stats)  # every job ran once: none lost, none twice
    return done


def assert_settled(app: Any, count: int) -> None:
    stats = wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == count
                       and app.broker.queue_counts("default")["stats"], timeout=30)
    assert stats.get("orphaned", 0) == 0 and stats.get("dead", 0) == 0
    assert app.broker.queue_counts("default")["pending"] == 0


@pytest.mark.parametrize("processes", ["1", "2"])
def test_max_jobs_per_child_replaces_the_worker_and_loses_nothing(
    redis_url, namespace, rdb, spawn_worker, processes
) -> None:
    m = producer(redis_url, namespace)
    w = spawn_worker(*APP, "-p", processes, "--max-jobs-per-child", "3")
    wait_until(lambda: len(m.app.broker.servers()) == int(processes), timeout=30)
    done = run_all(m, rdb, namespace, 12, mb=1)
    per_boot = collections.Counter(boot for _, _, boot, _, _ in done)
    assert max(per_boot.values()) <= 3 and len(per_boot) >= 4  # each image ran at most 3
    if processes == "1":  # the worker executed itself again: same process id, a new image
        assert {pid for _, _, _, pid, _ in done} == {w.pid}
    assert_settled(m.app, 12)
    # the replacements serve
    m.leak.enqueue(n=99, mb=1)
    wait_until(lambda: any(n == 99 for _, n, *_ in runs(rdb, namespace)), timeout=30)
    assert w.proc.poll() is None
    wait_until(lambda: len(m.app.broker.servers()) == int(processes), timeout=30)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_max_memory_mb_replaces_a_leaking_worker_after_its_running_job(
    redis_url, namespace, rdb, spawn_worker, processes
) -> None:
    """Each run leaks 40 MB and takes 0.3 s; past 150 MB resident the process is replaced once its job is done."""
    m = producer(redis_url, namespace)
    w = spawn_worker(*APP, "-p", processes, "--max-memory-mb", "150")
    wait_until(lambda: len(m.app.broker.servers()) == int(processes), timeout=30)
    done = run_all(m, rdb, namespace, 10, mb=40, seconds=0.3)
    per_boot = collections.Counter(boot for _, _, boot, _, _ in done)
    assert len(per_boot) >= 3 and max(per_boot.values()) <= 4  # none grew past ~150 MB + one job's leak
    assert_settled(m.app, 10)
    assert w.proc.poll() is None


@pytest.mark.parametrize("args", [["--max-jobs-per-child", "0"], ["--max-memory-mb", "-5"],
                                  ["--max-memory-mb", "lots"], ["--max-jobs-per-child", "2.5"]])
def test_bad_recycling_limits_are_refused_before_any_child_starts(redis_url, namespace, args) -> None:
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT / "tests")}
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "worker", *APP, "-p", "2", *args],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and args[0] in lines[0], out.stderr
    assert "supervisor" not in out.stdout + out.stderr


def test_the_supervisor_starts_the_replacement_while_the_recycling_child_finishes(tmp_path) -> None:
    """A child that says RECYCLING on its pipe is replaced at once: the replacement starts before the old child,
    still finishing its jobs, exits (else it would start only after that exit and the restart delay)."""
    child = [sys.executable, str(ROOT / "tests" / "recyclechild.py"), str(tmp_path)]
    code = f"import sys; from ringfence.worker.supervisor import supervise; sys.exit(supervise([{child!r}]))"
    sup = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        wait_until(lambda: (tmp_path / "exit-0").exists() and (tmp_path / "start-1").exists(), timeout=60)
        started = float((tmp_path / "start-1").read_text())
        assert started < float((tmp_path / "exit-0").read_text())
        assert not (tmp_path / "start-2").exists()  # one replacement, not two
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0  # the recycled child's 75 is not the supervisor's
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
            sup.wait(10)
