"""Workflow check: a running or failed workflow with a step queued or dead whose job no longer exists (cancelled,
purged, deleted from the dead-letter) waits for ever: nothing will advance it (docs/workflows.md)."""

from __future__ import annotations

from collections.abc import Iterator

from ringfence.doctor.context import Context
from ringfence.doctor.model import Finding, Status, check
from ringfence.redis.call import as_text

SCAN_LIMIT = 10_000  # workflow hashes read per run: the check stays bounded on a namespace with many


@check("workflow_stuck", "no workflow waits on a step whose job is gone", cheap=False)
def workflow_stuck(ctx: Context) -> Iterator[Finding]:
    from ringfence import workflows

    for wid in _unfinished(ctx):
        view = workflows.read(ctx.app, wid)
        if view is None or not view.stuck:
            continue
        yield Finding(
            "workflow_stuck", Status.FAILURE, subject=f"workflow:{wid}",
            symptom=f"workflow {wid} ({view.state}, queue {view.queue!r}) waits on step(s) "
                    f"{', '.join(view.stuck)} whose job is gone",
            hypothesis="the step's job was cancelled, purged or deleted from the dead-letter: no ack or replay "
                       "will ever advance the workflow",
            remedy=view.remedy, numbers={"workflow": wid, "stuck": view.stuck, "queue": view.queue})


def _unfinished(ctx: Context) -> list[str]:
    """Ids of the running or failed workflows of every queue (at most SCAN_LIMIT hashes read)."""
    b = ctx.app.broker
    out: list[str] = []
    read = 0
    for queue in ctx.after.queues:  # those that could be read (a Cluster node down: its queues are named)
        prefix = b.keys.workflow(queue, "")
        # On a Cluster only the queue's own node holds its workflows (its hash tag): the others are not asked.
        where = {"target_nodes": b.sync.get_node_from_key(prefix)} if b.cluster else {}  # type: ignore[attr-defined]
        for key in b.sync.scan_iter(match=prefix.replace("[", "\\[").replace("?", "\\?").replace("*", "\\*") + "*",
                                    count=1000, **where):
            read += 1
            if read > SCAN_LIMIT:
                return out
            if as_text(b.sync.hget(key, "state") or b"") in ("running", "failed"):
                out.append(as_text(key)[len(prefix):])
    return out
