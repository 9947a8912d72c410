"""A fence as a handler sees it, as protocols: what ``ctx.fence(...)`` and ``ctx.redis_fence(...)`` return
(:class:`Fence`), and the step it opens (:class:`Step` in ``with``, :class:`AsyncStep` in ``async with``).

The implementations are ``fence/step.py`` (``FenceContext``, ``Step``, ``AsyncStep``) over either store:
``fence/store.py`` (SQL) or ``redis/fence.py`` (Redis). This module imports nothing, so the job context
(tasks.py) is typed end to end without loading either store.

Example::

    @app.task
    async def charge(ctx: JobContext, order_id: int) -> None:
        async with ctx.fence(f"order:{order_id}", "charge", params={"amount": 100}) as step:
            if step.done:
                return
            ref = await step.effect(lambda: psp.charge(key=step.key, amount=100))
            async with step.complete(engine) as conn:
                ...
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType
from typing import Any, Protocol


class _StepView(Protocol):
    @property
    def done(self) -> bool: ...  # completed on an earlier run: do nothing, return ``result``
    @property
    def result(self) -> Any: ...
    @property
    def key(self) -> str: ...  # the provider idempotency key, the same on every run
    @property
    def reference(self) -> str | None: ...
    @property
    def request(self) -> Any: ...
    @property
    def epoch(self) -> int: ...
    @property
    def replaying(self) -> bool: ...


class Step(_StepView, Protocol):
    """A fenced step in a sync handler."""

    def effect(self, fn: Callable[[], Any], request: Any = None,
               reference: Callable[[Any], Any] | None = None) -> str: ...
    def complete(self, db: Any, result: Any = None) -> AbstractContextManager[Any]: ...


class AsyncStep(_StepView, Protocol):
    """A fenced step in an async handler."""

    async def effect(self, fn: Callable[[], Any], request: Any = None,
                     reference: Callable[[Any], Any] | None = None) -> str: ...
    def complete(self, db: Any, result: Any = None) -> AbstractAsyncContextManager[Any]: ...


class Fence(Protocol):
    """``with ctx.fence(subject, step) as step`` (a :class:`Step`) or ``async with`` (an :class:`AsyncStep`)."""

    def __enter__(self) -> Step: ...
    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None: ...
    async def __aenter__(self) -> AsyncStep: ...
    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None: ...


class FenceOpener(Protocol):
    def open(self, subject: str, step: str, *, params: Any = None, provider_dedup: bool = False,
             key_window_s: float | None = None, reconcile: Callable[[str, Any], Any] | None = None,
             retention_s: float | None = None, reconcile_timeout_s: float | None = None) -> Fence: ...


class FenceWiring(Protocol):
    """The worker's fence wiring a job context opens fences through (``worker/fencing.py``)."""

    def sql(self, ctx: Any) -> FenceOpener: ...
    def redis(self, ctx: Any) -> FenceOpener: ...
