"""A workflow step's job in the worker: its return value kept as JSON for the steps after it, its ack and its
dead-letter each one script with the workflow's advance (redis/workflows.py). A job that is not a step pays one
dict lookup (``"w" in spec.extra``). Steps in other queues than their workflow's go by hand-over (redis/workflows.py):
the worker finishes each hand-over its scripts started, and the sweep (``sweep``) those a crash left."""

from __future__ import annotations

from typing import Any

import orjson

from ringfence import results
from ringfence.errors import PayloadError
from ringfence.faults import fault_point
from ringfence.models import Fetched, JobSpec
from ringfence.redis import workflows as stored
from ringfence.redis.broker import Broker
from ringfence.tasks import Task
from ringfence.worker.outcomes import Outcome, Verdict


def where(extra: dict[str, Any]) -> tuple[str, int]:
    """(workflow id, step index) of a step's spec field ``w`` ('<id>:<index>')."""
    workflow_id, _, index = str(extra["w"]).rpartition(":")
    return workflow_id, int(index)


def step_of(extra: dict[str, Any]) -> tuple[str, str, str]:
    """(workflow id, step name, business id or '') for the step's JobContext."""
    return where(extra)[0], str(extra.get("ws", "")), str(extra.get("wb", ""))


def step_verdict(task: Task, job: Fetched, spec: JobSpec, value: Any, now_ms: int) -> Verdict:
    """The ack of a step that returned ``value``; a value that is not JSON sends the job to dead-letter."""
    problem = results.result_problem(value)
    if problem is not None:
        return Verdict(Outcome.DEAD, results.BAD_RESULT,
                       f"job {job.id}: task {task.name!r}: a workflow step returns JSON: {problem}")
    value = results.plain_result(value)
    record = None
    if task.store_result:
        try:
            record = results.done_record(task, job.queue, value, now_ms, spec.enqueued_ms)
        except PayloadError as exc:
            return Verdict(Outcome.DEAD, results.BAD_RESULT, f"job {job.id}: {exc}")
    return Verdict(Outcome.ACK, result=record, step=orjson.dumps(value))


async def advance(b: Broker, job: Fetched, step: bytes) -> int:
    """Ack the step's job and queue the steps that waited for it (one script); -1: the lease had moved on. A step
    of another queue than its workflow's: its ack records its completion, which is then applied to the workflow."""
    assert job.spec is not None
    workflow_id, index = where(job.spec.extra)
    home = job.spec.extra.get("wq")
    if home is None:
        queued, handed = await b.arun(stored.advance(b, job.queue, job.id, job.token, workflow_id, index, step))
        fault_point("after_step_ack")
        await stored.ahand_over(b, handed)
        return queued
    back = stored.Back(str(home), workflow_id, index, "d", step.decode())
    queued = await b.arun(stored.step_ack(b, job.queue, job.id, job.token, back))
    fault_point("after_step_ack")
    if queued >= 0:
        await bring_back(b, job.queue, job.id, back)
    return queued


def dead_step(b: Broker, job: Fetched, reason: str, error: str) -> tuple[list[str], list[Any]] | None:
    """What ``Broker.dead`` needs to tell a step's workflow of its death; None for a job that is not a step."""
    spec = job.spec
    if spec is None or "w" not in spec.extra:
        return None
    failure = orjson.dumps({"dead": reason, "error": error, "job": job.id, "step": spec.extra.get("ws", "")})
    return stored.dead_parts(b, job.queue, spec.extra, where(spec.extra)[1], failure)


async def died(b: Broker, job: Fetched, step: tuple[list[str], list[Any]] | None) -> None:
    """After a step's dead-letter: the death of a step of another queue is applied to its workflow."""
    if step is None or job.spec is None or "wq" not in job.spec.extra:
        return
    await bring_back(b, job.queue, job.id, stored.Back.parse(str(step[1][0])))


async def bring_back(b: Broker, queue: str, job_id: str, back: stored.Back) -> None:
    """Apply a step's completion (recorded in ``queue``'s slot) to its workflow, hand over the steps it released in
    other queues, then forget the completion."""
    _, handed = await b.arun(stored.apply(b, back))
    await stored.ahand_over(b, handed)
    fault_point("before_back_done")
    await b.arun(stored.back_done(b, queue, job_id, back))


async def sweep(b: Broker, queue: str) -> int:
    """Finish the hand-overs of ``queue``'s slot a crash left (older than ``SWEEP_AFTER_MS``); returns how many."""
    handed, back = await stored.due(b, queue)
    await stored.ahand_over(b, handed)
    for job_id, entry in back:
        await bring_back(b, queue, job_id, entry)
    return len(handed) + len(back)
