"""The app of the workflow tests' real worker processes (tests/test_workflow*.py). Each run is recorded as a file
``<job id>.<attempt>.<pid>.<kind>`` under $WF_DIR, not in Redis: a run counted where the worker writes its state
could hide a second one."""

from __future__ import annotations

import os
import time
from typing import Any

from ringfence import JobContext, Permanent, RetryPolicy
from ringfence.testing import FakeProvider
from support import worker_app

# The kill tests SIGKILL a worker at each fault point with p = 0.25: every kill burns an attempt, so three
# attempts would let a step die of kills alone (the failure tests raise Permanent, which skips retries).
app = worker_app(fence="FENCE_URL" in os.environ, retry=RetryPolicy(max_attempts=20, base_s=0.1, cap_s=1.0))
DIR = os.environ.get("WF_DIR", ".")
_provider: list[FakeProvider] = []


def provider() -> FakeProvider:
    """The provider every worker process shares (a file under $WF_DIR); it ignores keys, so only the fence can
    keep a charge from happening twice."""
    if not _provider:
        _provider.append(FakeProvider(os.path.join(DIR, "provider.db"), honours_keys=False))
    return _provider[0]


def mark(ctx: JobContext, kind: str = "ran") -> None:
    with open(os.path.join(DIR, f"{ctx.id}.{ctx.attempt}.{os.getpid()}.{kind}"), "w") as f:
        f.write(repr(time.time()))


@app.task(queue="wf")
def add(ctx: JobContext, x: int, previous: int | None = None) -> int:
    mark(ctx)
    return x + (previous or 0)


@app.task(queue="wf")
def total(ctx: JobContext, previous: list[Any]) -> Any:
    mark(ctx)
    return {"sum": sum(p for p in previous if isinstance(p, int)), "inputs": previous}


@app.task(queue="wf")
def boom(ctx: JobContext, n: int, previous: Any = None) -> int:
    """Dies (permanent) until the test writes $WF_DIR/fixed-<n>."""
    mark(ctx)
    if not os.path.exists(os.path.join(DIR, f"fixed-{n}")):
        raise Permanent(f"boom {n}")
    return n


@app.task(queue="wf")
def slow(ctx: JobContext, seconds: float) -> None:
    mark(ctx)
    if ctx.cancelled.wait(seconds):
        mark(ctx, "cancelled")


@app.task(queue="other")
def elsewhere(ctx: JobContext) -> None:
    mark(ctx)


@app.task(queue="third")
def far(ctx: JobContext, x: int, previous: Any = None) -> int:
    """A step in a third queue (steps across queues; the others take ``with_options(queue="other")``)."""
    mark(ctx)
    return x


@app.task(queue="wf")
def charge(ctx: JobContext, amount: int, previous: Any = None) -> str:
    """A fenced charge whose subject and step default to the workflow's business id and the step's name. A worker
    killed while another job's charge is in flight leaves that charge in doubt; the reconcile hook settles it."""
    mark(ctx)
    with ctx.fence(params={"amount": amount}, reconcile=find_charge) as step:
        if step.done:
            return str(step.result["charge_id"])
        ref = step.effect(lambda: provider().charge(amount, step.key, order=ctx.id))
        with step.complete(app.fence_store.engine, result={"charge_id": ref}):
            pass
    return str(ref)


def find_charge(key: str, request: Any) -> Any:
    """The reconcile hook: the charge made with ``key`` at the provider, else NOT_HAPPENED (safe to charge)."""
    from ringfence.fence import NOT_HAPPENED

    found = provider().lookup(key)
    return found if found is not None else NOT_HAPPENED


@app.task(queue="wf")
def member(ctx: JobContext, x: int) -> int:
    """A chord member that takes no input."""
    mark(ctx)
    return x


@app.task(queue="wf")
def gated(ctx: JobContext, n: int, die: bool = False) -> int:
    """Runs until the test writes $WF_DIR/open-<n> (or it is cancelled), then records its run; ``die``: then
    fails for good."""
    if ctx.cancelled.wait(0) or not wait_for_file(ctx, f"open-{n}"):
        return -1
    mark(ctx)
    if die:
        raise Permanent(f"gated {n} dies")
    return n


def wait_for_file(ctx: JobContext, name: str) -> bool:
    for _ in range(600):
        if os.path.exists(os.path.join(DIR, name)):
            return True
        if ctx.cancelled.wait(0.05):
            return False
    return False
