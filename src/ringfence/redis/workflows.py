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

Steps in other queues (other slots): the workflow's hash lives in its home queue's slot and also holds ``id`` and,
per such step, ``q<i>`` its queue and, while it is handed over, ``o<i>`` its spec (state ``handing``). The hand-over
out is keyed by job id: the script that queues the step (start, an ack's advance) records it in the home queue's
zset ``wf-out``; ``wf_hand_in`` puts the job in its queue once (its mark ``wf-in:<job id>`` in that slot says it
went in), ``wf_handed`` closes the entry. The way back: the step's ack (``wf_ack``) or dead-letter records its
completion in its own slot (``wf-back`` zset, ``wf-back-data`` hash: ``Back.entry``), ``wf_apply`` applies it to
the workflow (once: by the step's state), ``wf_back_done`` forgets it. A crash between two of these leaves an entry
that the sweep (``due``, worker/maintenance.py) finishes once it is ``SWEEP_AFTER_MS`` old.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ringfence.errors import ConfigError
from ringfence.faults import fault_point
from ringfence.redis.broker import Broker
from ringfence.redis.call import Call, as_text

SWEEP_AFTER_MS = 3000  # a hand-over entry this old was left by a crash (or a very slow caller): the sweep finishes it
MARK_TTL_MS = 7 * 86_400_000  # a hand-in mark whose step never comes back (cancelled, purged) expires
MARK_GRACE_MS = 300_000  # a mark's life once its step's completion reached the workflow
BATCH = 100  # entries the sweep takes per queue and round


@dataclass(frozen=True)
class Handed:
    """A step handed over to another queue: its workflow's home queue and id, its index, queue, job id, spec."""

    home: str
    workflow_id: str
    index: int
    queue: str
    job_id: str
    spec: str

    @property
    def member(self) -> str:
        return f"{self.workflow_id}:{self.index}"


@dataclass(frozen=True)
class Back:
    """A completion of a step of another queue, on its way to the workflow: 'd' (done, ``value`` its result) or
    'x' (dead, ``value`` its failure)."""

    home: str
    workflow_id: str
    index: int
    kind: str
    value: str

    @property
    def entry(self) -> str:  # JSON holds no raw newline, names none
        return "\n".join((self.home, self.workflow_id, str(self.index), self.kind, self.value))

    @staticmethod
    def parse(entry: str) -> Back:
        home, wid, index, kind, value = entry.split("\n", 4)
        return Back(home, wid, int(index), kind, value)


def _slot(b: Broker, queue: str, name: str) -> str:
    """A key of the hand-overs in ``queue``'s slot."""
    return b.keys.workflow(queue, "").removesuffix(":wf:") + ":" + name


def out_key(b: Broker, queue: str) -> str:
    return _slot(b, queue, "wf-out")


def _handed(b: Broker, home: str, workflow_id: str, raw: Any) -> tuple[int, list[Handed]]:
    """A reply of lua/_workflow.lua's ``with_handed``: n, and the steps handed over."""
    if not isinstance(raw, list):
        return int(raw), []
    items = [as_text(x) for x in raw[1:]]
    return int(raw[0]), [Handed(home, workflow_id, int(items[j]), items[j + 1], items[j + 2], items[j + 3])
                         for j in range(0, len(items), 4)]


def start(b: Broker, queue: str, workflow_id: str, steps: int, fields: Sequence[tuple[str, str | bytes | int]]
          ) -> Call[tuple[int, list[Handed]]]:
    """Parses to (1: started, 0: it existed already; the steps handed over to other queues)."""
    k = b.keys.queue(queue)
    args: list[Any] = [b.clock(), k.wake, steps]
    for name, value in fields:
        args += [name, value]
    return Call("wf_start", [b.keys.workflow(queue, workflow_id), k.jobs, k.pending, k.idle, k.stats,
                             out_key(b, queue)], args, lambda raw: _handed(b, queue, workflow_id, raw))


def advance(b: Broker, queue: str, job_id: str, token: str, workflow_id: str, index: int, result: bytes
            ) -> Call[tuple[int, list[Handed]]]:
    """Ack a step's job and queue what waited for it; parses to (the steps queued, -1: the lease had moved on;
    the steps handed over to other queues)."""
    k = b.keys.queue(queue)
    return Call("advance", [k.active, k.lease, k.jobs, k.attempts, k.history, k.stats, k.minutes, k.pending, k.idle,
                            b.keys.workflow(queue, workflow_id), k.waiters, k.waiting, out_key(b, queue)],
                [b.clock(), k.wake, job_id, token, index, result], lambda raw: _handed(b, queue, workflow_id, raw))


def step_ack(b: Broker, queue: str, job_id: str, token: str, back: Back) -> Call[int]:
    """Ack a step of another queue than its workflow's and record its completion in its slot (lua/wf_ack.lua);
    parses to the jobs its depends_on waiters queued, -1: the lease had moved on."""
    k = b.keys.queue(queue)
    return Call("wf_ack", [k.active, k.lease, k.jobs, k.attempts, k.history, k.stats, k.minutes, k.pending, k.idle,
                           k.waiters, k.waiting, _slot(b, queue, "wf-back"), _slot(b, queue, "wf-back-data")],
                [b.clock(), k.wake, job_id, token, back.entry], int)


def dead_parts(b: Broker, queue: str, extra: dict[str, Any], index: int, failure: bytes
               ) -> tuple[list[str], list[Any]]:
    """The keys and arguments ``Broker.dead`` adds for a workflow step (lua/dead.lua: KEYS[13..])."""
    k = b.keys.queue(queue)
    workflow_id = str(extra["w"]).rpartition(":")[0]
    home = extra.get("wq")
    if home is None:
        return ([k.pending, k.idle, b.keys.workflow(queue, workflow_id), out_key(b, queue)],
                [index, failure, k.wake])
    back = Back(str(home), workflow_id, index, "x", failure.decode())
    return [_slot(b, queue, "wf-back"), _slot(b, queue, "wf-back-data")], [back.entry]


def hand_in(b: Broker, h: Handed, block: bool = False) -> Call[bool]:
    """Put a handed-over step into its queue, once per job id (lua/wf_hand_in.lua); ``block``: make sure it never
    goes in (cancel). Parses to True when it is (or was put) in its queue."""
    k = b.keys.queue(h.queue)
    return Call("wf_hand_in", [_slot(b, h.queue, f"wf-in:{h.job_id}"), k.jobs, k.pending, k.idle, k.stats],
                [b.clock(), k.wake, h.job_id, h.spec, int(block), MARK_TTL_MS], lambda raw: bool(int(raw)))


def handed_call(b: Broker, h: Handed, went_in: bool) -> Call[int]:
    """Close a hand-over entry: the step is in its queue (``went_in``) or blocked (lua/wf_handed.lua)."""
    return Call("wf_handed", [b.keys.workflow(h.home, h.workflow_id), out_key(b, h.home)],
                [h.member, h.index, int(went_in)], int)


def hand_over(b: Broker, handed: Sequence[Handed]) -> None:
    """Put each step handed over into its queue (once per job id), then close its entry in its workflow's slot."""
    for h in handed:
        fault_point("before_hand_in")
        went_in = b.run(hand_in(b, h))
        fault_point("before_handed")
        b.run(handed_call(b, h, went_in))


async def ahand_over(b: Broker, handed: Sequence[Handed]) -> None:
    for h in handed:
        fault_point("before_hand_in")
        went_in = await b.arun(hand_in(b, h))
        fault_point("before_handed")
        await b.arun(handed_call(b, h, went_in))


def apply(b: Broker, back: Back) -> Call[tuple[int, list[Handed]]]:
    """Apply a step's completion to its workflow (lua/wf_apply.lua); parses as ``advance``."""
    k = b.keys.queue(back.home)
    return Call("wf_apply", [b.keys.workflow(back.home, back.workflow_id), k.jobs, k.pending, k.idle, k.stats,
                             out_key(b, back.home)], [b.clock(), k.wake, back.index, back.kind, back.value],
                lambda raw: _handed(b, back.home, back.workflow_id, raw))


def back_done(b: Broker, queue: str, job_id: str, back: Back) -> Call[int]:
    """Forget a completion applied to its workflow (lua/wf_back_done.lua)."""
    return Call("wf_back_done", [_slot(b, queue, "wf-back"), _slot(b, queue, "wf-back-data"),
                                 _slot(b, queue, f"wf-in:{job_id}")], [job_id, back.entry, MARK_GRACE_MS], int)


async def due(b: Broker, queue: str) -> tuple[list[Handed], list[tuple[str, Back]]]:
    """The hand-overs of ``queue``'s slot older than ``SWEEP_AFTER_MS``: steps handed out of its workflows, and
    completions of its steps on their way back (job id, entry). A stale entry (its step no longer handing, its
    workflow gone) is dropped here."""
    out: list[Handed] = []
    back: list[tuple[str, Back]] = []
    if not await b.aio.exists(out_key(b, queue), _slot(b, queue, "wf-back")):  # the common case: one call
        return out, back
    before = b.clock() - SWEEP_AFTER_MS
    for raw in await b.aio.zrangebyscore(out_key(b, queue), "-inf", before, start=0, num=BATCH):
        member = as_text(raw)
        workflow_id, _, index = member.rpartition(":")
        state, q, job_id, spec = (None if v is None else as_text(v) for v in await b.aio.hmget(
            b.keys.workflow(queue, workflow_id), [f"s{index}", f"q{index}", f"j{index}", f"o{index}"]))
        if state != "handing" or q is None or job_id is None or spec is None:
            await b.aio.zrem(out_key(b, queue), member)
            continue
        out.append(Handed(queue, workflow_id, int(index), q, job_id, spec))
    ids = [as_text(x) for x in await b.aio.zrangebyscore(_slot(b, queue, "wf-back"), "-inf", before, start=0,
                                                         num=BATCH)]
    if ids:
        for job_id, entry in zip(ids, await b.aio.hmget(_slot(b, queue, "wf-back-data"), ids), strict=True):
            if entry is None:
                await b.aio.zrem(_slot(b, queue, "wf-back"), job_id)
            else:
                back.append((job_id, Back.parse(as_text(entry))))
    return out, back


def on_its_way_back(b: Broker, queue: str, job_id: str) -> bool:
    """The step's completion is recorded in its slot, not yet applied to its workflow."""
    return bool(b.sync.hexists(_slot(b, queue, "wf-back-data"), job_id))


def cancel(b: Broker, queue: str, workflow_id: str) -> Call[tuple[list[str], list[int]] | None]:
    """Cancel: no waiting step is queued any more. Parses to (the job ids of the queued steps, the indexes of the
    steps being handed over), None: no workflow."""
    def parse(raw: Any) -> tuple[list[str], list[int]] | None:
        if not int(raw[0]):
            return None
        return [as_text(x) for x in raw[1]], [int(as_text(x)) for x in raw[2]]

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
