"""Keep blocking calls off the event loop: a sync provider call, a sync hook, a sync completion."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any, TypeVar

T = TypeVar("T")


async def call_off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn`` without blocking the loop: an ``async def`` is awaited; anything else runs in a
    thread, and an awaitable it returns (``lambda: client.charge(...)``) is then awaited on the loop."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    value = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(value):
        value = await value
    return value


@asynccontextmanager
async def in_thread(cm: AbstractContextManager[T]) -> AsyncIterator[T]:
    """Enter and exit a blocking context manager in a thread; the ``async with`` body stays on the loop."""
    value = await asyncio.to_thread(cm.__enter__)
    try:
        yield value
    except BaseException as exc:
        if not await asyncio.to_thread(cm.__exit__, type(exc), exc, exc.__traceback__):
            raise
    else:
        await asyncio.to_thread(cm.__exit__, None, None, None)
