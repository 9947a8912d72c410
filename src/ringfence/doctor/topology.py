"""The Redis topology (a Cluster): nodes down, slots no node serves, masters without a replica, queues that cannot
be read. The doctor answers for the rest of the namespace even so."""

from __future__ import annotations

from collections.abc import Iterator

from ringfence.doctor.context import Context
from ringfence.doctor.model import Finding, Status, check
from ringfence.redis.topology import ClusterView, cluster_view, promotion

SLOTS = 16384


@check("topology", "every Redis node answers and every slot is served (or a single Redis)", cheap=False)
def topology(ctx: Context) -> Iterator[Finding]:
    for queue, error in sorted(ctx.after.unreachable.items()):
        yield Finding("topology", Status.FAILURE, subject=queue,
                      symptom=f"queue {queue} cannot be read: {error}",
                      hypothesis="the Redis node that owns its slot is down or failing over",
                      remedy="restart the node or wait for its replica to take over; the other queues are served")
    if not ctx.broker.cluster:
        return
    view = cluster_view(ctx.broker, ctx.silent)
    if view is None:
        yield Finding("topology", Status.FAILURE, symptom="no node of the Redis Cluster answered CLUSTER NODES",
                      hypothesis="the cluster is down or unreachable from here", remedy="check the nodes")
        return
    yield from _nodes(view)


def _nodes(view: ClusterView) -> Iterator[Finding]:
    for node in view.down():
        role = "master" if node.master else "replica"
        seen = "does not answer" if not node.answers else f"is flagged failing by {view.read_from}"
        yield Finding("topology", Status.FAILURE if node.master else Status.WARNING, subject=node.address,
                      symptom=f"Redis Cluster {role} {node.address} is down: it {seen}",
                      hypothesis="the node's process died or its host is unreachable",
                      remedy="restart it; a master's replica takes over after cluster-node-timeout")
    if view.state != "ok" or view.slots_ok < SLOTS:
        yield Finding("topology", Status.FAILURE, subject="slots",
                      symptom=f"cluster_state {view.state}: {SLOTS - view.slots_ok} of {SLOTS} slots not served",
                      hypothesis="a master is down and no replica took over its slots",
                      remedy="bring the master back or fail over to a replica (CLUSTER FAILOVER); add replicas",
                      numbers={"slots_ok": view.slots_ok})
    for node in view.without_replica():
        yield Finding("topology", Status.WARNING, subject=node.address,
                      symptom=f"Redis Cluster master {node.address} ({node.slots} slots) has no live replica",
                      hypothesis="if it fails, its slots stay unserved until it is back",
                      remedy="add a replica (redis-cli --cluster add-node --cluster-slave)")


@check("failover", "the Redis master was not promoted by a failover (Sentinel or manual)", cheap=False)
def failover(ctx: Context) -> Iterator[Finding]:
    promoted = promotion(ctx.broker)
    if promoted is None:
        return
    orphans = sum(ctx.after.stat(q, "orphaned") for q in ctx.after.queues)
    written = promoted.offset_now - promoted.offset_at_promotion
    yield Finding(
        "failover", Status.WARNING if orphans else Status.OK, subject=promoted.address,
        symptom=(f"Redis master {promoted.address} was a replica promoted by a failover ({written} bytes written "
                 "since); the writes the old master acknowledged but had not replicated are gone"),
        hypothesis=("what may be lost: jobs enqueued without durable=True in the replication lag before the "
                    "failover, acks and retries (those jobs run again), counters; orphaned attempts since then "
                    "may be leases the failover rolled back, not dead workers" if orphans else
                    "what may be lost: jobs enqueued without durable=True in the replication lag before the "
                    "failover, acks and retries (those jobs run again), counters"),
        remedy="enqueue with durable=True (or App(min_replicas=1)) where a lost job matters; the mark stays until "
               "the node restarts",
        numbers={"bytes_since": written, "orphaned": orphans})
