"""``depends_on``: a job that waits for jobs of its queue, on a real worker process and a real Redis. It is shown
waiting (``ringfence job show``), queued once by its last dependency's ack, decided by a dependency that dies or
is cancelled, and can be cancelled itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import orjson
import pytest

import ringfence
from ringfence import ConfigError, jobs
from support import wait_until
from test_workflow import Served, cli, runs, serve
from test_workflow import wf as idle  # noqa: F401  (a fixture: the app on this namespace, no worker)


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The app and one real worker process, shared by this module's tests."""
    yield from serve(redis_url, tmp_path_factory)


def show(s: Served, job_id: str) -> dict:
    """What `ringfence job show` prints (its function, in this process: the CLI costs seconds on a busy host)."""
    found = jobs.find_job(s.wf.app, job_id)
    assert found is not None, job_id
    return found.to_dict()


def state(s: Served, job_id: str) -> str | None:
    found = jobs.find_job(s.wf.app, job_id)
    return None if found is None else found.state


def ran_at(directory: Path, job_id: str) -> float:
    (found,) = [p for p in directory.iterdir() if p.name.startswith(job_id + ".") and p.name.endswith(".ran")]
    return float(found.read_text())


def tag() -> int:
    return uuid.uuid4().int % 10**9


def counters(s: Served) -> tuple[int, int, int]:
    b = s.wf.app.broker
    k = b.keys.queue("wf")
    return int(b.sync.hget(k.stats, "enqueued") or 0), b.sync.hlen(k.waiting), b.sync.hlen(k.waiters)


def test_a_job_waits_for_its_dependencies_and_is_queued_once_by_the_last_ack(served: Served) -> None:
    wf, n = served.wf, tag()
    before = counters(served)[0]
    a = wf.gated.enqueue(n=n)
    b = wf.add.with_options(depends_on=[a]).enqueue(x=1)
    c = wf.add.with_options(depends_on=[a, b]).enqueue(x=2)
    out = cli(served.namespace, served.redis_url, "job", "show", c)
    assert out.returncode == 0, out.stderr
    shown = orjson.loads(out.stdout)
    assert (shown["state"], shown["waits_for"]) == ("waiting", [a, b])
    assert show(served, b)["waits_for"] == [a]
    assert runs(served.dir, b) == 0

    (served.dir / f"open-{n}").write_text("")
    wait_until(lambda: runs(served.dir, c) == 1, timeout=30)
    assert ran_at(served.dir, a) <= ran_at(served.dir, b) <= ran_at(served.dir, c)
    assert [runs(served.dir, j) for j in (a, b, c)] == [1, 1, 1]
    assert counters(served) == (before + 3, 0, 0)  # each queued once; nothing left waiting


def test_a_workflow_step_is_a_dependency(served: Served) -> None:
    wf = served.wf
    n = tag()
    wid = ringfence.chain(wf.gated.s(n=n), wf.add.s(x=1)).enqueue()
    after = wf.add.with_options(depends_on=[f"{wid}.0"]).enqueue(x=5)
    assert state(served, after) == "waiting"
    (served.dir / f"open-{n}").write_text("")
    wait_until(lambda: runs(served.dir, after) == 1, timeout=30)
    assert ran_at(served.dir, f"{wid}.0") <= ran_at(served.dir, after)


def test_a_dead_dependency_sends_its_waiters_to_dead_letter_naming_it(served: Served) -> None:
    wf, n = served.wf, tag()
    a = wf.gated.enqueue(n=n, die=True)
    b = wf.add.with_options(depends_on=[a]).enqueue(x=1)
    c = wf.add.with_options(depends_on=[b]).enqueue(x=2)
    assert state(served, c) == "waiting"
    (served.dir / f"open-{n}").write_text("")
    wait_until(lambda: state(served, c) == "dead", timeout=30)
    shown_b, shown_c = show(served, b), show(served, c)
    assert (shown_b["reason"], shown_b["error"]) == ("dependency_dead", f"dependency {a} is dead (permanent)")
    assert shown_c["reason"] == "dependency_dead" and shown_c["error"].startswith(f"dependency {b} is dead")
    late = wf.add.with_options(depends_on=[a]).enqueue(x=3)  # enqueued after its dependency died
    assert show(served, late)["error"] == f"dependency {a} is dead (permanent)"
    assert [runs(served.dir, j) for j in (b, c, late)] == [0, 0, 0]
    assert counters(served)[1:] == (0, 0)


def test_cancel_a_waiting_job_and_a_dependency(served: Served) -> None:
    wf, n = served.wf, tag()
    a = wf.gated.enqueue(n=n)
    b = wf.add.with_options(depends_on=[a]).enqueue(x=1)
    c = wf.add.with_options(depends_on=[b]).enqueue(x=2)
    out = cli(served.namespace, served.redis_url, "job", "cancel", b)
    assert out.returncode == 0, out.stderr
    assert show(served, c)["error"] == f"dependency {b} was cancelled"
    (served.dir / f"open-{n}").write_text("")
    wait_until(lambda: runs(served.dir, a) == 1, timeout=30)

    d = wf.gated.enqueue(n=n + 1)
    e = wf.add.with_options(depends_on=[d]).enqueue(x=3)
    wait_until(lambda: state(served, d) == "active", timeout=30)
    assert jobs.cancel_job(served.wf.app, d) == ("wf", "active")
    assert show(served, e)["error"] == f"dependency {d} was cancelled"
    assert [runs(served.dir, j) for j in (b, c, d, e)] == [0, 0, 0, 0]
    assert counters(served)[1:] == (0, 0)


def test_finished_dependency_queues_at_once_and_bad_ones_are_refused(served: Served) -> None:
    wf = served.wf
    done = wf.add.enqueue(x=1)
    wait_until(lambda: runs(served.dir, done) == 1, timeout=30)
    after = wf.add.with_options(depends_on=[done]).enqueue(x=2)
    wait_until(lambda: runs(served.dir, after) == 1, timeout=30)

    with pytest.raises(ConfigError, match="depends_on='abc' must be a non-empty list of job ids"):
        wf.add.with_options(depends_on="abc").enqueue(x=1)  # type: ignore[typeddict-item]
    other = wf.elsewhere.with_options(delay_s=600).enqueue()
    with pytest.raises(ConfigError, match=f"job {other} is in queue 'other', not 'wf'"):
        wf.add.with_options(depends_on=[other]).enqueue(x=1)
    with pytest.raises(ConfigError, match="depends_on is taken by enqueue"):
        wf.app.enqueue_many(wf.add, [{"x": 1}], depends_on=[done])


def test_a_purged_dependency_sends_its_waiters_to_dead_letter(idle: ModuleType) -> None:  # noqa: F811
    wf = idle
    a = wf.add.enqueue(x=1)  # no worker: it stays pending (inline)
    b = wf.add.with_options(depends_on=[a]).enqueue(x=2)
    assert jobs.find_job(wf.app, b).state == "waiting"
    assert jobs.purge_queue(wf.app, "wf") == (1, 0)
    shown = jobs.find_job(wf.app, b)
    assert (shown.state, shown.reason, shown.error) == ("dead", "dependency_dead", f"dependency {a} was purged")
