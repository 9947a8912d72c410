"""Runs the app's ``on_dead`` hooks after a job reaches dead-letter; a failing hook is logged, never raised."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ringfence.models import DeadJob, JobSpec
from ringfence.worker.observers import Observer

log = logging.getLogger("ringfence.worker")


class DeadHooksObserver(Observer):
    def __init__(self, hooks: list[Callable[[DeadJob], Any]]) -> None:
        self.hooks = hooks

    async def dead(self, dead: DeadJob, spec: JobSpec | None) -> None:
        for hook in self.hooks:
            try:
                result = hook(dead)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("on_dead hook %r failed for job %s", hook, dead.id)
