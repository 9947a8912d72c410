"""Redis Cluster under faults, on private redis-server processes: a slot resharded under a producer."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.errors import NotReplicated
from topology import HAVE_REDIS, Cluster, move_slot, owner_of

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


def _noop(ctx: object, n: int) -> None:
    pass


def test_durable_enqueues_follow_a_resharded_slot(cluster: Cluster, tmp_path: Path) -> None:
    """A producer making only durable enqueues: its queue's slot moves to another master (keys and ownership);
    the next enqueue follows the MOVED answer to the new owner, takes the write there and waits on its replicas
    (none here: NotReplicated, the job queued), instead of MOVED on every call."""
    app = App(cluster.url, f"t{uuid.uuid4().hex[:8]}", environment="test", replica_timeout_s=0.1)
    durable = app.task(name="noop")(_noop).with_options(queue="qd", durable=True)
    with pytest.raises(NotReplicated, match="0 of 1 replica"):
        durable.with_options(job_id="j1").enqueue(n=1)
    pending = app.broker.keys.queue("qd").pending
    slot = int(app.broker.sync.keyslot(pending))  # type: ignore[attr-defined]
    to = next(p for p in cluster.ports if p != owner_of(cluster.ports, slot))
    move_slot(cluster.ports, slot, to)
    for n in (2, 3):
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            durable.with_options(job_id=f"j{n}").enqueue(n=n)
    assert owner_of(cluster.ports, slot) == to
    assert sorted(redis.Redis(port=to).lrange(pending, 0, -1)) == [b"j1", b"j2", b"j3"]
    app.close()
