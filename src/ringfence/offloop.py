"""Keep blocking calls off the event loop: a sync effect, a sync hook, a sync completion, a blocking context manager.

Every such hop of a coroutine goes through :data:`HOP`, cheaper than ``asyncio.to_thread``, which costs about
twice the CPU of the hop itself (the executor's ``concurrent.futures.Future``, chaining it to an asyncio future,
the executor's thread accounting): on a fenced no-op job that was a tenth of the job. Here a call is a tuple on a
queue and its answer one ``call_soon_threadsafe``. Semantics are ``to_thread``'s: the caller's context variables,
the call's exception raised in the caller, a cancelled caller stops waiting while the call runs on. (Job handlers
are not hops: a ``def`` handler runs on the worker's job threads, worker/calls.py, which bound them in time.)

A call never waits behind another: each one takes an idle thread, or starts one when none is idle (an effect
that blocks for minutes holds its thread only). Threads beyond ``MAX_IDLE`` idle ones end once they have waited
``IDLE_S`` for a call: ending them as soon as they were idle started a thread for most hops of a worker running more
async jobs at once than ``MAX_IDLE`` (10 jobs: 4,288 thread starts in 40,000 hops).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import queue
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any, TypeVar

T = TypeVar("T")
MAX_IDLE = 8
IDLE_S = 10.0  # how long a thread beyond MAX_IDLE idle ones waits for a call before it ends

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[..., Any],
              tuple[Any, ...]]


class Hop:
    """Threads that run blocking calls for coroutines (one process-wide instance: :data:`HOP`)."""

    def __init__(self, name: str = "ringfence-effect", idle_s: float = IDLE_S) -> None:
        self.name, self.idle_s = name, idle_s
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a call that no caller has reserved yet
        self._started = 0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``await asyncio.to_thread(fn, *args)``, on one of these threads."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._lock:
            start = self._idle == 0
            if start:
                self._started += 1
                name = f"{self.name}_{self._started}"
            else:
                self._idle -= 1  # reserved: an idle thread takes this call
        if start:
            threading.Thread(target=self._work, name=name, daemon=True).start()
        self._calls.put((loop, fut, contextvars.copy_context(), fn, args))
        return await fut

    def _work(self) -> None:
        calls, idle_s = self._calls, self.idle_s
        _call(calls.get())  # the call this thread was started for; a function: nothing of it outlives it while idle
        while True:
            with self._lock:
                self._idle += 1
            while not self._next(calls, idle_s):
                with self._lock:  # idle for idle_s: a thread beyond MAX_IDLE idle ones ends
                    if self._idle > MAX_IDLE:
                        self._idle -= 1  # another idle thread takes any call reserved meanwhile
                        return

    @staticmethod
    def _next(calls: queue.SimpleQueue[_Call], idle_s: float) -> bool:
        """Run the next call; False when none came within ``idle_s``."""
        try:
            call = calls.get(timeout=idle_s)
        except queue.Empty:
            return False
        _call(call)
        return True


def _call(call: _Call) -> None:
    loop, fut, ctx, fn, args = call
    try:
        value = ctx.run(fn, *args)
    except BaseException as exc:  # raised in the caller, as to_thread does
        _answer(loop, fut, None, exc)
    else:
        _answer(loop, fut, value, None)


def _answer(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    try:  # noqa: SIM105 (suppress() is three Python calls on every hop)
        loop.call_soon_threadsafe(_settle, fut, value, exc)
    except RuntimeError:  # the loop closed while the call ran: nobody waits for it
        pass


def _settle(fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if fut.done():  # the caller was cancelled
        return
    if exc is None:
        fut.set_result(value)
    elif isinstance(exc, StopIteration):  # a future refuses it (to_thread would never answer)
        fut.set_exception(RuntimeError(f"the effect raised {exc!r}"))
    else:
        fut.set_exception(exc)


HOP = Hop()


async def call_off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn`` without blocking the loop: an ``async def`` is awaited; anything else runs on a hop thread,
    and an awaitable it returns (``lambda: client.charge(...)``) is then awaited on the loop."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    value = await HOP.run(fn, *args)
    if inspect.isawaitable(value):
        value = await value
    return value


@asynccontextmanager
async def in_thread(cm: AbstractContextManager[T]) -> AsyncIterator[T]:
    """Enter and exit a blocking context manager on hop threads; the ``async with`` body stays on the loop."""
    value = await HOP.run(cm.__enter__)
    try:
        yield value
    except BaseException as exc:
        if not await HOP.run(cm.__exit__, type(exc), exc, exc.__traceback__):
            raise
    else:
        await HOP.run(cm.__exit__, None, None, None)
