"""Workflows: steps that run in order, at once, or behind a barrier, every step's job enqueued exactly once.

``chain(a.s(...), b.s(...))`` runs b after a; ``group([a.s(...), b.s(...)])`` runs both at once; ``chord(group,
c.s())`` runs c once every member finished. Nest them freely: a group in a chain is a barrier for the step after
it. ``.enqueue()`` stores the workflow and queues its first steps in one script and returns its id; each step's
ack queues the steps that waited for it in the same script (redis/workflows.py), so no crash loses or repeats a
step. A step in another queue than the workflow's first (another slot) is handed over, keyed by its job id, and its
completion comes back the same way; a sweep finishes a hand-over a crash left. A step whose handler declares a
``previous`` parameter receives the result of the step before it (after a group or in a chord's callback: the list
of the members' results, in order). See docs/workflows.md.
"""

from __future__ import annotations

import inspect as pyinspect
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from ringfence import jobs
from ringfence.client import Client, Tracing
from ringfence.errors import ConfigError
from ringfence.fence.aftercommit import after_commit
from ringfence.models import new_job_id
from ringfence.outbox import write as outbox_write
from ringfence.redis import workflows as stored
from ringfence.redis.broker import Broker
from ringfence.redis.call import Call
from ringfence.redis.connect import REDIS_ERRORS, broker_error
from ringfence.results import DEFAULT_TTL_S
from ringfence.runtime import Live
from ringfence.settings import TaskOptions, check_name
from ringfence.tasks import EnqueueOptions, JobContext, Signature, Task, check_seconds

PREVIOUS = "previous"  # the parameter a step declares to receive the result before it
MAX_STEPS = 10_000
POLICIES = ("fail", "continue")
START_TASK = "ringfence.workflow.start"  # the job that starts a workflow written to the outbox (enqueue_in)
START_RETRY_S = 300.0  # how long a start owed after a commit is retried when Redis does not answer
log = logging.getLogger("ringfence.workflows")


@dataclass
class _Step:
    sig: Signature
    after: list[int]
    takes: str  # '1': the one result before it, 'l': the list of them, '': none
    tolerant: bool = False  # its dependents start even when it dies (a chord's 'continue')
    then: list[int] = field(default_factory=list)


class _Plan:
    def __init__(self) -> None:
        self.steps: list[_Step] = []

    def add(self, sig: Signature, after: list[int], many: bool) -> int:
        if not isinstance(sig, Signature):
            raise ConfigError(f"a workflow step is task.s(...), a chain, a group or a chord; got {sig!r}")
        if len(self.steps) >= MAX_STEPS:
            raise ConfigError(f"a workflow holds at most {MAX_STEPS:,} steps")
        param = pyinspect.signature(sig.task.fn).parameters.get(PREVIOUS)
        wants = param is not None
        if wants and isinstance(sig.payload, dict) and PREVIOUS in sig.payload:
            raise ConfigError(f"step {sig.task.name!r}: '{PREVIOUS}' is the result of the step before it; "
                              "do not pass it in .s()")
        if param is not None and not after and param.default is param.empty:
            raise ConfigError(f"step {sig.task.name!r} needs '{PREVIOUS}' but no step comes before it (give the "
                              "parameter a default to start a workflow with it)")
        takes = ("l" if many else "1") if wants and after else ""
        self.steps.append(_Step(sig, list(after), takes))
        index = len(self.steps) - 1
        for i in after:
            self.steps[i].then.append(index)
        return index


class Node:
    """A chain, a group or a chord: ``enqueue()`` starts it as a workflow and returns its id."""

    def plan(self, plan: _Plan, after: list[int], many: bool) -> tuple[list[int], bool]:
        raise NotImplementedError

    def enqueue(self, business_id: str | None = None, result_ttl_s: float | None = None) -> str:
        """Store the workflow, queue its first steps; returns the workflow id. ``business_id``: fenced steps
        default to it and their step name; ``result_ttl_s``: how long it is kept once finished (default a day)."""
        start = _Start(self, business_id, result_ttl_s)
        start.hand_over(start.store())
        return start.workflow_id

    async def aenqueue(self, business_id: str | None = None, result_ttl_s: float | None = None) -> str:
        start = _Start(self, business_id, result_ttl_s)
        await start.ahand_over(await start.astore())
        return start.workflow_id

    def enqueue_in(self, conn: Any, business_id: str | None = None, result_ttl_s: float | None = None) -> str:
        """Write the workflow's start into the outbox table in ``conn``'s transaction (no commit, no Redis), one
        row carrying every step; the relay sends it once the transaction commits and a worker of its queue starts
        it (``START_TASK``, idempotent by workflow id). Returns the workflow id."""
        start = _Start(self, business_id, result_ttl_s)
        payload = {"queue": start.queue, "workflow_id": start.workflow_id, "steps": len(start.steps),
                   "fields": [[n, v.decode() if isinstance(v, bytes) else v]
                              for n, v in start.fields(int(time.time() * 1000))]}
        opts = EnqueueOptions(queue=start.queue, job_id=start.workflow_id)
        outbox_write.enqueue_in(starter(start.steps[0].sig.task.app), conn, payload, opts)
        return start.workflow_id

    def enqueue_on_commit(self, target: Any = None, business_id: str | None = None,
                          result_ttl_s: float | None = None, *, using: str | None = None) -> str:
        """Start the workflow once ``target``'s outer transaction commits (a SQLAlchemy Session, Connection,
        AsyncSession or AsyncConnection; a Django connection, or None: Django's ``transaction.on_commit`` on
        ``using``, default "default"); nothing on rollback. Checked now, its id fixed now. A start that Redis
        refuses after the commit is retried every second for ``START_RETRY_S``, then logged with its id."""
        start = _Start(self, business_id, result_ttl_s)
        if target is None or _is_django(target):
            _django_on_commit(start, target, using)
        else:
            after_commit(target, start, _started_after_commit)
        return start.workflow_id


def _nodes(steps: Iterable[Any]) -> list[Signature | Node]:
    out = list(steps)
    for s in out:
        if not isinstance(s, Signature | Node):
            raise ConfigError(f"a workflow step is task.s(...), a chain, a group or a chord; got {s!r}")
    return out


def _plan_one(node: Signature | Node, plan: _Plan, after: list[int], many: bool) -> tuple[list[int], bool]:
    if isinstance(node, Signature):
        return [plan.add(node, after, many)], False
    return node.plan(plan, after, many)


class Chain(Node):
    def __init__(self, steps: Sequence[Signature | Node]) -> None:
        self.steps = _nodes(steps)
        if not self.steps:
            raise ConfigError("chain() needs at least one step")

    def plan(self, plan: _Plan, after: list[int], many: bool) -> tuple[list[int], bool]:
        for node in self.steps:
            after, many = _plan_one(node, plan, after, many)
        return after, many


class Group(Node):
    def __init__(self, steps: Iterable[Signature | Node]) -> None:
        self.steps = _nodes(steps)
        if not self.steps:
            raise ConfigError("group() needs at least one step")

    def plan(self, plan: _Plan, after: list[int], many: bool) -> tuple[list[int], bool]:
        ends: list[int] = []
        for node in self.steps:
            ends += _plan_one(node, plan, after, many)[0]
        return ends, True


class Chord(Node):
    def __init__(self, header: Group | Iterable[Signature | Node], callback: Signature | Node,
                 on_member_dead: str = "fail") -> None:
        self.header = header if isinstance(header, Group) else Group(header)
        self.callback = _nodes([callback])[0]
        if on_member_dead not in POLICIES:
            raise ConfigError(f"chord on_member_dead={on_member_dead!r} must be one of {', '.join(POLICIES)}")
        self.policy = on_member_dead

    def plan(self, plan: _Plan, after: list[int], many: bool) -> tuple[list[int], bool]:
        members, _ = self.header.plan(plan, after, many)
        if self.policy == "continue":
            for i in members:
                plan.steps[i].tolerant = True
        return _plan_one(self.callback, plan, members, True)


def chain(*steps: Signature | Node) -> Chain:
    """Steps one after the other; each may take the one before it's result as ``previous``."""
    return Chain(steps)


def group(steps: Iterable[Signature | Node]) -> Group:
    """Steps that run at once; a step after the group takes the list of their results."""
    return Group(steps)


def chord(header: Group | Iterable[Signature | Node], callback: Signature | Node, *,
          on_member_dead: str = "fail") -> Chord:
    """A group, then ``callback`` once, when every member finished, with their results in order.
    ``on_member_dead``: 'fail' (a dead member fails the workflow, the callback waits for its replay) or
    'continue' (the callback runs with ``{"dead": reason, "error": ..., "job": ..., "step": ...}`` in its
    place)."""
    return Chord(header, callback, on_member_dead)


def _is_django(target: Any) -> bool:
    return type(target).__module__.startswith("django.")


def _django_on_commit(start: _Start, conn: Any, using: str | None) -> None:
    """Start it from Django's ``transaction.on_commit`` of database ``using`` (or ``conn``'s alias)."""
    try:
        from django.db import DEFAULT_DB_ALIAS, transaction
    except ImportError as exc:
        raise ConfigError("enqueue_on_commit needs a SQLAlchemy Session or Connection, or Django installed "
                          "(then pass its connection, or call it inside transaction.atomic())") from exc
    alias = using or (conn.alias if conn is not None else None) or DEFAULT_DB_ALIAS
    transaction.on_commit(lambda: _started_after_commit([start], False), using=alias)


def _started_after_commit(starts: list[_Start], in_async: bool) -> None:
    """The commit happened: start each workflow (wf_start is idempotent by id); never raises into the commit."""
    del in_async  # one short script call: sent from the committing thread either way
    for start in starts:
        if not start.send():
            threading.Thread(target=start.retry, name=f"ringfence-wf-start-{start.workflow_id}", daemon=True).start()


class _Start:
    """A workflow's steps and fields, checked, ready for ``wf_start.lua``."""

    def __init__(self, node: Node, business_id: str | None, result_ttl_s: float | None) -> None:
        plan = _Plan()
        node.plan(plan, [], False)
        self.steps = plan.steps
        self.client = _client(self.steps[0].sig)
        self.broker: Broker = self.client.app.broker
        queues = self._queues()
        if business_id is not None and (type(business_id) is not str or not business_id):
            raise ConfigError(f"business_id={business_id!r} must be a non-empty string")
        check_seconds("result_ttl_s", result_ttl_s, minimum=None)
        self.business_id = business_id or ""
        self.ttl_ms = max(1, int((result_ttl_s if result_ttl_s is not None else DEFAULT_TTL_S) * 1000))
        self.workflow_id = new_job_id()
        key = self.business_id or self.workflow_id  # a partitioned queue: each step in the partition of this key
        self.step_queues = [self.client.partition(q, key) for q in queues]
        self.queue = self.step_queues[0]  # the workflow's home: its hash lives in this queue's slot
        self.queues = sorted(set(self.step_queues))
        self.names = _names(self.steps)

    def send(self) -> bool:
        """Store and queue it now; False (logged) when Redis did not answer."""
        try:
            handed = self.store()
        except Exception as exc:  # after a commit: kept for retry, never raised into the caller
            log.error("workflow %s not started after its commit (%s: %s)", self.workflow_id, type(exc).__name__, exc)
            return False
        self.hand_over(handed)
        return True

    def store(self) -> list[stored.Handed]:
        """Store the workflow and queue its steps of the home queue; the steps due in other queues, to hand over.
        Raises ringfence's error (the start is not stored, or it is unknown whether it was: a retry with the same
        id is harmless)."""
        try:
            self.broker.register_queues(self.queues)
            return self.broker.run(self.call())[1]
        except REDIS_ERRORS as exc:
            raise broker_error(f"workflow {self.workflow_id} start", exc, self.broker.url) from exc

    async def astore(self) -> list[stored.Handed]:
        try:
            await self.broker.aregister_queues(self.queues)
            return (await self.broker.arun(self.call()))[1]
        except REDIS_ERRORS as exc:
            raise broker_error(f"workflow {self.workflow_id} start", exc, self.broker.url) from exc

    def hand_over(self, handed: list[stored.Handed]) -> None:
        """Hand each step over to its queue. The start is stored: a failure here is left to the workers' sweep,
        not raised (a caller who retried would start a second workflow)."""
        for n, h in enumerate(handed):
            try:
                stored.hand_over(self.broker, [h])
            except Exception as exc:
                self._left(handed[n:], exc)
                return

    async def ahand_over(self, handed: list[stored.Handed]) -> None:
        for n, h in enumerate(handed):
            try:
                await stored.ahand_over(self.broker, [h])
            except Exception as exc:
                self._left(handed[n:], exc)
                return

    def _left(self, left: list[stored.Handed], exc: Exception) -> None:
        steps = ", ".join(f"{self.names[h.index]} (job {h.job_id}, queue {h.queue})" for h in left)
        log.warning("workflow %s started; its hand-over of %s failed (%s: %s): a worker's sweep puts it in its "
                    "queue once Redis answers", self.workflow_id, steps, type(exc).__name__, " ".join(str(exc).split()))

    def retry(self) -> None:
        deadline = time.monotonic() + START_RETRY_S
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if self.send():
                return
        log.error("workflow %s given up after %gs: it was committed but never started", self.workflow_id,
                  START_RETRY_S)

    def _queues(self) -> list[str]:
        """Each step's queue, checked."""
        queues = [self.client.check_options(s.sig.task, s.sig.options) for s in self.steps]
        for s in self.steps:
            o = s.sig.options
            if o.delay_s is not None or o.run_at is not None or o.job_id or o.unique_for or o.expiry_s or o.durable:
                raise ConfigError(f"step {s.sig.task.name!r}: a workflow step takes no delay_s, run_at, job_id, "
                                  "unique_for, expiry_s or durable option")
        return queues

    def call(self) -> Call[tuple[int, list[stored.Handed]]]:
        fields = self.fields(self.broker.clock())
        return stored.start(self.broker, self.queue, self.workflow_id, len(self.steps), fields)

    def fields(self, created_ms: int) -> list[tuple[str, str | bytes | int]]:
        fields: list[tuple[str, str | bytes | int]] = [
            ("state", "running"), ("n", len(self.steps)), ("left", len(self.steps)), ("dead", 0),
            ("ttl", self.ttl_ms), ("created", created_ms), ("business_id", self.business_id)]
        if len(self.queues) > 1:
            fields.append(("id", self.workflow_id))  # names its hand-over entries (lua/_workflow.lua)
        for i, s in enumerate(self.steps):
            head, args = self._spec(i, s)
            fields += [(f"t{i}", self.names[i]), (f"j{i}", f"{self.workflow_id}.{i}"), (f"s{i}", "waiting"),
                       (f"w{i}", len(s.after)), (f"d{i}", ",".join(map(str, s.after))),
                       (f"c{i}", ",".join(map(str, s.then))), (f"p{i}", s.takes), (f"k{i}", int(s.tolerant)),
                       (f"h{i}", head), (f"a{i}", args)]
            if self.step_queues[i] != self.queue:
                fields.append((f"q{i}", self.step_queues[i]))
        return fields

    def _spec(self, i: int, s: _Step) -> tuple[bytes, bytes]:
        """The step's spec in two parts (lua/_workflow.lua joins them with its enqueue time and its inputs)."""
        task, opts = s.sig.task, s.sig.options
        payload = s.sig.payload
        args = task.codec.encode(payload) if not s.takes else _loose(task.name, payload)
        doc: dict[str, Any] = {"t": task.name, "v": task.version}
        if opts.max_attempts is not None:
            doc["m"] = opts.max_attempts
        if opts.timeout_s is not None:
            doc["to"] = int(opts.timeout_s * 1000)
        doc["w"] = f"{self.workflow_id}:{i}"
        doc["ws"] = self.names[i]
        if self.step_queues[i] != self.queue:
            doc["wq"] = self.queue  # its completion goes back to the workflow's queue (worker/workflows.py)
        if self.business_id:
            doc["wb"] = self.business_id
        if Tracing.fields is not None:  # each step's run continues the trace that started the workflow
            doc.update(Tracing.fields())
        return orjson.dumps(doc)[:-1], orjson.dumps(args)[1:-1]


def starter(app: Any) -> Task:  # the App (an import of app.py here would point up the layers)
    """The task of ``START_TASK`` jobs: a workflow start written to the outbox, run by a worker of its queue."""
    def start_workflow(ctx: JobContext, queue: str, workflow_id: str, steps: int, fields: list[Any]) -> None:
        del ctx
        fields = [(str(n), v) for n, v in fields]
        app.broker.register_queues({queue, *(str(v) for n, v in fields if n[0] == "q" and n[1:].isdigit())})
        stored.hand_over(app.broker, app.broker.run(stored.start(app.broker, queue, workflow_id, steps, fields))[1])

    return Task(app, start_workflow, TaskOptions(name=START_TASK, expiry_s=None))


def _loose(task: str, payload: Any) -> dict[str, Any]:
    """The payload of a step that also takes ``previous``: checked as JSON here, against the handler's types when
    it runs (with its ``previous``)."""
    if not isinstance(payload, dict):
        raise ConfigError(f"step {task!r} takes '{PREVIOUS}': give its other fields as keywords")
    try:
        orjson.dumps(payload)
    except TypeError as exc:
        raise ConfigError(f"step {task!r}: its payload is not JSON: {exc}") from exc
    return payload


def _names(steps: list[_Step]) -> list[str]:
    """A step's name: its task's, with '#2', '#3', ... for a task's later steps in the same workflow."""
    seen: Counter[str] = Counter()
    out = []
    for s in steps:
        seen[s.sig.task.name] += 1
        n = seen[s.sig.task.name]
        out.append(s.sig.task.name if n == 1 else f"{s.sig.task.name}#{n}")
    return out


def _client(sig: Signature) -> Client:
    client = sig.task.app.client
    if not isinstance(client, Client):
        raise ConfigError(f"task {sig.task.name!r} is not declared on an App: its workflow has no Redis")
    return client


# -- reading and cancelling ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepView:
    index: int
    name: str
    job_id: str
    state: str  # waiting, handing (on its way to its queue), queued, done, dead (a cancelled workflow's waiting
    #             steps never run)
    after: list[int]
    result: Any = None
    failure: dict[str, Any] | None = None
    queue: str = ""  # its queue


@dataclass(frozen=True)
class WorkflowView:
    id: str
    queue: str
    state: str  # running, done, failed, cancelled
    business_id: str
    created_ms: int
    steps: list[StepView]
    stuck: list[str] = field(default_factory=list)  # steps queued or dead whose job no longer exists

    @property
    def remedy(self) -> str:
        """What to do about a stuck workflow ('' when it is not)."""
        if not self.stuck:
            return ""
        return (f"step(s) {', '.join(self.stuck)} wait on a job that no longer exists (cancelled, purged or "
                f"deleted): nothing will advance it; `ringfence workflow cancel {self.id}` ends it")

    @property
    def failed(self) -> list[str]:
        """The names of the steps in dead-letter."""
        return [s.name for s in self.steps if s.state == "dead"]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "queue": self.queue, "state": self.state, "business_id": self.business_id,
                "created_ms": self.created_ms, "failed": self.failed, "stuck": self.stuck, "remedy": self.remedy,
                "steps": [{"index": s.index, "name": s.name, "job_id": s.job_id, "queue": s.queue, "state": s.state,
                           "after": s.after, "result": s.result, "failure": s.failure} for s in self.steps]}


def _json(raw: str | None) -> Any:
    return None if raw is None else orjson.loads(raw)


def read(app: Live, workflow_id: str) -> WorkflowView | None:
    """A workflow's state, or None (no such id, or it expired); ``stuck`` names its steps queued or dead whose job
    is gone (read twice: a step that finished between the two reads is not stuck; nor is a step of another queue
    whose completion is on its way back)."""
    check_name("workflow id", workflow_id)
    view = _read(app, app.broker.queues(), workflow_id)
    if view is None or view.state not in ("running", "failed"):
        return view
    gone = {s.index for s in view.steps
            if s.state in ("queued", "dead") and app.broker.job_state(s.queue, s.job_id) is None
            and not (s.queue != view.queue and stored.on_its_way_back(app.broker, s.queue, s.job_id))}
    if not gone:
        return view
    again = _read(app, [view.queue], workflow_id)
    if again is None:
        return None
    stuck = [s.name for s in again.steps if s.index in gone and s.state == view.steps[s.index].state]
    return replace(again, stuck=stuck)


def _read(app: Live, queues: list[str], workflow_id: str) -> WorkflowView | None:
    found = stored.read(app.broker, queues, workflow_id)
    if found is None:
        return None
    queue, f = found
    steps = [StepView(index=i, name=f[f"t{i}"], job_id=f[f"j{i}"], state=f[f"s{i}"],
                      after=[int(x) for x in f.get(f"d{i}", "").split(",") if x],
                      result=_json(f.get(f"r{i}")) if f[f"s{i}"] == "done" else None,
                      failure=_json(f.get(f"e{i}")), queue=f.get(f"q{i}", queue))
             for i in range(int(f["n"]))]
    return WorkflowView(id=workflow_id, queue=queue, state=f["state"], business_id=f.get("business_id", ""),
                        created_ms=int(f.get("created", 0)), steps=steps)


def cancel(app: Live, workflow_id: str) -> tuple[WorkflowView, list[str]]:
    """Cancel a workflow: no waiting step is queued any more, queued steps are cancelled (a running one loses its
    lease: its ``ctx.cancelled`` is set); a step on its way to another queue is blocked there, or cancelled if it
    got in first. Returns the workflow and the job ids cancelled."""
    view = read(app, workflow_id)
    if view is None:
        raise ConfigError(f"no workflow {workflow_id!r} in namespace {app.namespace} (wrong id, or it expired)")
    if view.state == "done":
        raise ConfigError(f"workflow {workflow_id} is done already; nothing to cancel")
    queued, handing = app.broker.run(stored.cancel(app.broker, view.queue, workflow_id)) or ([], [])
    for i in handing:
        step = view.steps[i]
        h = stored.Handed(view.queue, workflow_id, i, step.queue, step.job_id, "")
        went_in = app.broker.run(stored.hand_in(app.broker, h, block=True))
        app.broker.run(stored.handed_call(app.broker, h, went_in))
        if went_in:
            queued.append(step.job_id)
    cancelled = []
    for job_id in queued:
        try:
            jobs.cancel_job(app, job_id)
        except ConfigError:
            continue  # it finished or died meanwhile
        cancelled.append(job_id)
    return read(app, workflow_id) or view, cancelled


__all__ = ["Chain", "Chord", "Group", "Node", "StepView", "WorkflowView", "chain", "chord", "group"]
