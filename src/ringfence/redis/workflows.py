"""A workflow's Redis side: one hash per workflow in the slot of the queue its steps run in, so a step's own
transition (ack, dead-letter) and the workflow's advance are one script (lua/advance.lua, lua/dead.lua,
lua/_workflow.lua).

Fields of ``<ns>:{<ns>:<queue>}:wf:<id>``: ``state`` (running, done, failed, cancelled), ``n`` steps, ``left``
steps not finished, ``dead`` steps in dead-letter, ``ttl`` ms it is kept once finished or cancelled, ``created``
ms, ``business_id``; per step i: ``t<i>`` name, ``j<i>`` job id, ``s<i>`` state (waiting, queued, done, dead),
``w<i>`` inputs not finished, ``d<i>`` its inputs (indexes, in order), ``c<i>`` its dependents, ``p<i>`` how it
takes its inputs' results (``1``: the one result, ``l``: a list, empty: not at all), ``k<i>`` 1 when its
dependents start even when it dies, ``h<i>``/``a<i>`` its spec's head and payload fields until it is queued,
``r<i>`` its result (JSON), ``e<i>`` its failure (JSON), ``x<i>`` set once its dependents were told.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ringfence.errors import ConfigError
from ringfence.redis.broker import Broker
from ringfence.redis.call import Call, as_text


def start(b: Broker, queue: str, workflow_id: str, steps: int, fields: Sequence[tuple[str, str | bytes | int]]
          ) -> Call[bool]:
    k = b.keys.queue(queue)
    args: list[Any] = [b.clock(), k.wake, steps]
    for name, value in fields:
        args += [name, value]
    return Call("wf_start", [b.keys.workflow(queue, workflow_id), k.jobs, k.pending, k.idle, k.stats], args, bool)


def advance(b: Broker, queue: str, job_id: str, token: str, workflow_id: str, index: int, result: bytes
            ) -> Call[int]:
    """Ack a step's job and queue what waited for it; parses to the steps queued, -1: the lease had moved on."""
    k = b.keys.queue(queue)
    return Call("advance", [k.active, k.lease, k.jobs, k.attempts, k.history, k.stats, k.minutes, k.pending, k.idle,
                            b.keys.workflow(queue, workflow_id), k.waiters, k.waiting],
                [b.clock(), k.wake, job_id, token, index, result], int)


def dead_keys(b: Broker, queue: str, workflow_id: str) -> list[str]:
    """The keys ``Broker.dead`` adds for a workflow step (lua/dead.lua: KEYS[13..15])."""
    k = b.keys.queue(queue)
    return [k.pending, k.idle, b.keys.workflow(queue, workflow_id)]


def cancel(b: Broker, queue: str, workflow_id: str) -> Call[list[str] | None]:
    """Cancel: no waiting step is queued any more. Parses to the job ids of the queued steps, None: no workflow."""
    def parse(raw: Any) -> list[str] | None:
        return None if not int(raw[0]) else [as_text(x) for x in raw[1:]]

    return Call("wf_cancel", [b.keys.workflow(queue, workflow_id)], [], parse)


def read(b: Broker, queues: Sequence[str], workflow_id: str) -> tuple[str, dict[str, str]] | None:
    """(queue, fields) of a workflow, looked for in every queue (one pipelined call), or None."""
    p = b.sync.pipeline(transaction=False)
    for q in queues:
        p.hgetall(b.keys.workflow(q, workflow_id))
    for q, found in zip(queues, p.execute(), strict=True):
        if found:
            return q, {as_text(f): as_text(v) for f, v in found.items()}
    return None


def depend(b: Broker, queue: str, job_id: str, spec: bytes, deps: Sequence[str]) -> Call[list[str]]:
    """Add one job that runs once ``deps`` (jobs of ``queue``) are acked (lua/depend.lua). Parses to
    ['waiting', deps...], ['queued'], ['dead', dep], ['same'] (a retried call) or ['exists'] (the id is taken)."""
    k = b.keys.queue(queue)
    args: list[Any] = [b.clock(), k.wake, job_id, spec]
    for dep in deps:
        args += [dep, b.inline_entry(queue, dep)]
    return Call("depend", [k.jobs, k.pending, k.dead, k.dead_jobs, k.stats, k.waiters, k.waiting, k.idle], args,
                lambda raw: [as_text(x) for x in raw])


def check_deps(b: Broker, queue: str, deps: Sequence[str]) -> None:
    """Refuse a dependency that lives in another queue: its ack cannot reach this queue's slot."""
    for dep in deps:
        if b.job_state(queue, dep) is not None:
            continue
        for other in b.queues():
            if other != queue and b.job_state(other, dep) is not None:
                raise ConfigError(f"depends_on: job {dep} is in queue {other!r}, not {queue!r}: a job can wait only "
                                  "for jobs of its own queue")


def waits_for(b: Broker, queue: str, job_id: str) -> list[str]:
    """The dependencies a waiting job still waits for ([] when it waits for none)."""
    raw = b.sync.hget(b.keys.queue(queue).waiting, job_id)
    return [] if raw is None else [x for x in as_text(raw).split(",") if x]
