"""Fault-injection points: off unless asked for.

A fault point is a named place in the fence protocol where a crash matters
(``after_capture``, ``after_calling``, ``after_effect``, ``after_record``,
``before_commit``), or in the worker (``before_dead_letter``: the steps a dead job leaves are parked,
its Redis dead-letter not yet made; ``after_dead_letter``: between the Redis dead-letter and the failed_jobs
row), or in the outbox relay (``relay_after_read``, ``relay_after_send``, ``relay_after_mark``). Two ways to fire one:

- the environment: ``RINGFENCE_FAULTS="after_effect"`` SIGKILLs the process the
  first time it reaches that point; ``"after_effect:0.3,before_commit"`` kills at
  ``after_effect`` with probability 0.3 and always at ``before_commit``.
  Used by tests and chaos runs on real worker processes. Read once per process, at the
  first fault point; :func:`reload` reads it again (a test that changes it in-process).
- in-process, for tests: ``with faults.inject(hook): ...`` calls ``hook(name)``
  at every point; the hook may raise to simulate a crash there.

Example::

    from ringfence import faults

    def crash_after_effect(name: str) -> None:
        if name == "after_effect":
            raise faults.SimulatedKill(name)

    with faults.inject(crash_after_effect):
        run_the_job()
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ENV = "RINGFENCE_FAULTS"

#: Every fault point the fence protocol calls, in protocol order.
POINTS = ("after_capture", "after_calling", "after_effect", "after_record", "before_commit")
#: The worker's own fault points.
WORKER_POINTS = ("before_dead_letter", "after_dead_letter")
#: A workflow step's (worker/settle.py): its handler returned, before and after its ack-and-advance script.
WORKFLOW_POINTS = ("before_step_ack", "after_step_ack")
#: A hand-over of a step between two queues (redis/workflows.py, worker/workflows.py): recorded in the workflow's
#: slot, not yet in the step's queue; in its queue, the entry not yet closed; a step's completion applied to its
#: workflow, not yet forgotten in its own slot.
HANDOVER_POINTS = ("before_hand_in", "before_handed", "before_back_done")
#: The outbox relay's (outbox/relay.py), in step order.
RELAY_POINTS = ("relay_after_read", "relay_after_send", "relay_after_mark")

_hooks: list[Callable[[str], None]] = []
_lock = threading.Lock()
# RINGFENCE_FAULTS parsed, None until the first fault point: a fenced job passes six points, and
# os.environ.get of an unset name costs more than the rest of the point.
_env: dict[str, float] | None = None


class SimulatedKill(BaseException):
    """Raised by test hooks to stand in for SIGKILL.

    A BaseException on purpose: handlers' ``except Exception`` and the fence's own
    cleanup must not run, just as they would not after a real SIGKILL.
    """


def parse(spec: str | None) -> dict[str, float]:
    """Parse ``"name[:probability],..."`` into ``{name: probability}``."""
    points: dict[str, float] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, prob = part.partition(":")
        points[name.strip()] = float(prob) if prob else 1.0
    return points


def fault_point(name: str) -> None:
    """Maybe crash here: run test hooks, then SIGKILL if ``RINGFENCE_FAULTS`` names this point."""
    if _hooks:  # tests only; a worker's fenced job passes six points
        with _lock:
            hooks = list(_hooks)
        for hook in hooks:
            hook(name)
    points = _env if _env is not None else reload()
    if not points:  # the common case
        return
    prob = points.get(name)
    if prob is not None and random.random() < prob:
        os.kill(os.getpid(), signal.SIGKILL)


def reload() -> dict[str, float]:
    """Read ``RINGFENCE_FAULTS`` again (it is read once per process) and return its points."""
    global _env
    _env = parse(os.environ.get(ENV))
    return _env


@contextmanager
def inject(hook: Callable[[str], None]) -> Iterator[None]:
    """Call ``hook(point_name)`` at every fault point while the block runs (tests only)."""
    with _lock:
        _hooks.append(hook)
    try:
        yield
    finally:
        with _lock:
            _hooks.remove(hook)
