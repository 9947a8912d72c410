"""``worker --processes``: real supervisor and worker processes, counted in /proc and the server registry."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from support import wait_until
from test_processes import producer, records

pytestmark = pytest.mark.slow


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


_pick = random.SystemRandom()


def free_ports(n: int) -> int:
    """A port p such that p .. p+n-1 are free now, below Linux's ephemeral range (32768 and up): there an
    outgoing connection of another test (a Redis client's source port) could take one before a child binds it,
    and the child would fail to start, again and again, while that connection lives."""
    for _ in range(200):
        base = _pick.randint(10000, 22000)
        if all(_free(base + i) for i in range(n)):
            return base
    raise AssertionError("no free port range")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_short_flag_starts_exactly_p_children_restarts_a_killed_one_and_stops_on_sigterm(
    redis_url, namespace, rdb, spawn_worker
) -> None:
    app, m = producer(redis_url, namespace)
    port = free_ports(2)
    sup = spawn_worker("-p", "2", "-c", "3", "--metrics-port", str(port))
    first = wait_until(lambda: len(app.broker.servers()) == 2 and app.broker.servers(), timeout=30)
    time.sleep(1.5)  # a runaway supervisor would have spawned more by now
    pids = {s["pid"] for s in first}
    assert descendants(sup.pid) == pids
    assert {s["concurrency"] for s in app.broker.servers()} == {3}  # options reach the children
    for p in (port, port + 1):  # one metrics port per child
        with urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5) as resp:
            assert resp.status == 200
    victim = first[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(app.broker.servers()) == 2 and victim not in {s["pid"] for s in app.broker.servers()},
               timeout=30)
    assert len(descendants(sup.pid)) == 2
    m.noop.enqueue(n=1)
    wait_until(lambda: records(rdb, namespace, "runs"))
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == 0
    assert not descendants(sup.pid)
    wait_until(lambda: not app.broker.servers(), timeout=10)


def test_children_failing_at_start_make_the_supervisor_give_up(redis_url, namespace, rdb, spawn_worker) -> None:
    app, _ = producer(redis_url, namespace)
    worker = spawn_worker()  # claims the namespace for environment "test"
    wait_until(lambda: app.broker.servers())
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    t0 = time.monotonic()
    sup = spawn_worker("-p", "2", env={"RINGFENCE_ENV": "staging", "TEST_RECORD_BOOTS": "1"})
    code = sup.wait(60)
    elapsed = time.monotonic() - t0
    assert code == 1
    boots = [b for b in records(rdb, namespace, "boots") if int(b[0]) != sup.pid]  # children only
    assert 5 <= len(boots) <= 6  # gives up after 5 quick deaths in a row; the other child is stopped
    assert elapsed < 45  # backoff 0.5 + 1 + 2 + 4 s, plus five worker start-ups
    assert not descendants(sup.pid)
    assert "giving up: 5 workers in a row exited before they started serving (last exit code 2)" in sup.output()


def test_supervisor_killed_takes_its_children_with_it(redis_url, namespace, spawn_worker) -> None:
    app, _ = producer(redis_url, namespace)
    sup = spawn_worker("--processes", "2")
    servers = wait_until(lambda: len(app.broker.servers()) == 2 and app.broker.servers(), timeout=30)
    sup.kill()
    pids = [s["pid"] for s in servers]
    wait_until(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), timeout=15)
    wait_until(lambda: not app.broker.servers(), timeout=10)  # they left the registry: a graceful stop


def test_bad_app_with_processes_fails_at_once(redis_url, namespace, spawn_worker) -> None:
    sup = spawn_worker("-p", "2", "--app", "no_such_module:app")
    assert sup.wait(20) == 2
    assert not descendants(sup.pid)


def test_ctrl_c_on_the_group_is_one_graceful_stop(redis_url, namespace, rdb, spawn_worker) -> None:
    """A terminal's Ctrl-C signals the foreground process group: only the supervisor is in it, and it passes
    on one SIGTERM, so a running job still gets to finish (a worker takes a second signal as "exit now")."""
    app, m = producer(redis_url, namespace)
    sup = spawn_worker("-p", "2")
    wait_until(lambda: len(app.broker.servers()) == 2, timeout=30)
    job = m.slow.enqueue(seconds=1.5)
    wait_until(lambda: records(rdb, namespace, "started"))
    os.killpg(sup.pid, signal.SIGINT)
    assert sup.wait(20) == 0
    assert [f[0] for f in records(rdb, namespace, "finished")] == [job]


def test_a_second_signal_stops_children_at_once_and_the_exit_code_says_so(
    redis_url, namespace, rdb, spawn_worker
) -> None:
    app, m = producer(redis_url, namespace)
    sup = spawn_worker("-p", "2", env={"TEST_SHUTDOWN_S": "20"})
    wait_until(lambda: len(app.broker.servers()) == 2, timeout=30)
    m.slow_sync.enqueue(seconds=30)
    wait_until(lambda: records(rdb, namespace, "started"))
    sup.signal(signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    sup.signal(signal.SIGTERM)
    code = sup.wait(20)
    assert code == 130, sup.output()  # the children's "exited at once" code, not a clean 0
    assert time.monotonic() - t0 < 10
    assert not records(rdb, namespace, "finished")


def test_restart_delays_double_after_each_failed_start_up_to_the_cap() -> None:
    from ringfence.worker.supervisor import Backoff

    assert [Backoff().delay_s(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_a_second_signal_during_the_interpreter_teardown_does_not_kill_the_worker(
    redis_url, namespace, spawn_worker, tmp_path: Path
) -> None:
    """A worker stopped cleanly that gets a second signal after its last Python code ran (the interpreter frees
    its modules, slow under load; the supervisor passes a second signal on to every child) exits with its own
    code, not killed by the signal (143), which the supervisor would report instead of its children's."""
    mark = tmp_path / "teardown"
    app, _ = producer(redis_url, namespace)
    w = spawn_worker("--app", "slowexitapp:app", env={"TEST_TEARDOWN_MARK": str(mark)})
    wait_until(lambda: len(app.broker.servers()) == 1, timeout=30)
    w.signal(signal.SIGTERM)
    wait_until(mark.exists, timeout=20)
    w.signal(signal.SIGTERM)
    code = w.wait(20)
    assert code == 0, w.output()
