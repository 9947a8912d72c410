"""A workflow step's job in the worker: its return value kept as JSON for the steps after it, its ack and its
dead-letter each one script with the workflow's advance (redis/workflows.py). A job that is not a step pays one
dict lookup (``"w" in spec.extra``)."""

from __future__ import annotations

from typing import Any

import orjson

from ringfence import results
from ringfence.errors import PayloadError
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
    """Ack the step's job and queue the steps that waited for it (one script); -1: the lease had moved on."""
    assert job.spec is not None
    workflow_id, index = where(job.spec.extra)
    return await b.arun(stored.advance(b, job.queue, job.id, job.token, workflow_id, index, step))


def dead_step(job: Fetched, reason: str, error: str) -> tuple[str, int, bytes] | None:
    """What ``Broker.dead`` needs to tell a step's workflow of its death; None for a job that is not a step."""
    spec = job.spec
    if spec is None or "w" not in spec.extra:
        return None
    workflow_id, index = where(spec.extra)
    failure = orjson.dumps({"dead": reason, "error": error, "job": job.id, "step": spec.extra.get("ws", "")})
    return workflow_id, index, failure
