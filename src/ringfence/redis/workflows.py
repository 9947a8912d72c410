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

from ringfence.redis.broker import Broker
from ringfence.redis.call import Call, _str


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
                            b.keys.workflow(queue, workflow_id)],
                [b.clock(), k.wake, job_id, token, index, result], int)


def dead_keys(b: Broker, queue: str, workflow_id: str) -> list[str]:
    """The keys ``Broker.dead`` adds for a workflow step (lua/dead.lua: KEYS[11..13])."""
    k = b.keys.queue(queue)
    return [k.pending, k.idle, b.keys.workflow(queue, workflow_id)]


def cancel(b: Broker, queue: str, workflow_id: str) -> Call[list[str] | None]:
    """Cancel: no waiting step is queued any more. Parses to the job ids of the queued steps, None: no workflow."""
    def parse(raw: Any) -> list[str] | None:
        return None if not int(raw[0]) else [_str(x) for x in raw[1:]]

    return Call("wf_cancel", [b.keys.workflow(queue, workflow_id)], [], parse)


def read(b: Broker, queues: Sequence[str], workflow_id: str) -> tuple[str, dict[str, str]] | None:
    """(queue, fields) of a workflow, looked for in every queue (one pipelined call), or None."""
    p = b.sync.pipeline(transaction=False)
    for q in queues:
        p.hgetall(b.keys.workflow(q, workflow_id))
    for q, found in zip(queues, p.execute(), strict=True):
        if found:
            return q, {_str(f): _str(v) for f, v in found.items()}
    return None
