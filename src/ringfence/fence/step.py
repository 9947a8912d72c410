"""The fence protocol as handlers use it: capture → calling → effect → record → complete.

::

    async with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount}) as step:
        if step.done:                      # the second run is empty
            return step.result
        charge_id = await step.effect(lambda: psp.charge(order_id, amount, idempotency_key=step.key))
        async with step.complete(db, result={"charge_id": charge_id}) as conn:
            await conn.execute(orders.update().values(charge_id=charge_id))

The same object works with plain ``with`` in sync handlers. The rules a rerun follows
(takeover, in doubt, busy, conflict) are in ``docs/fences.md``. A fence database that fails one of the fence's
own statements raises ``FenceStoreError``, the driver's error as its ``__cause__``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Final, Protocol, TypeVar

from sqlalchemy.exc import DBAPIError

from ..errors import ConfigError, FenceStoreError, ReconcileTimeout
from ..offloop import HOP, call_off_loop
from .core import RECONCILE, Core, NotHappened
from .dbretry import store_error
from .model import FenceBackend, Owner

__all__ = ["NOT_HAPPENED", "AsyncStep", "FenceContext", "Fences", "Owner", "Step", "StepOptions", "Tracing"]

#: What a ``reconcile`` hook returns when the provider has no record of the key: calling again is safe.
NOT_HAPPENED: Final = NotHappened()
T = TypeVar("T")

ReconcileAnswer = str | None | NotHappened
Reconcile = Callable[[str, Any], ReconcileAnswer | Awaitable[ReconcileAnswer]]


@dataclass(frozen=True)
class StepOptions:
    """How a step behaves when its effect is in doubt, and how long its row is kept.

    - ``provider_dedup``: the provider deduplicates by the idempotency key, so replaying the
      stored request with the same key is safe while ``key_window_s`` (since the first call,
      database clock) has not passed. Stripe: 24 h; PayPal Orders: 6 h by default.
    - ``reconcile(key, request)``: look the effect up at the provider; return its reference
      (adopt it), ``NOT_HAPPENED`` (safe to call again) or ``None`` (unknown → park).
    - ``reconcile_timeout_s``: the hook's time bound (default: 30 s or half the job's timeout, the shorter).
      The hook starts only if the bound fits before the attempt is stopped, else ``ReconcileTimeout`` (a
      failed attempt; the step stays calling); a bound longer than the job's timeout parks the step. An
      ``async with`` stops waiting for the hook at the bound (``ReconcileTimeout``).
    - ``retention_s``: delete the completed row after this long; ``None`` keeps it forever
      (always for money).
    """

    params: Any = None
    provider_dedup: bool = False
    key_window_s: float | None = None
    reconcile: Reconcile | None = None
    retention_s: float | None = None
    reconcile_timeout_s: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.provider_dedup and self.key_window_s is None:
            problems.append("provider_dedup=True needs key_window_s (the provider's key window)")
        if self.key_window_s is not None and self.key_window_s <= 0:
            problems.append(f"key_window_s must be > 0, got {self.key_window_s}")
        if self.reconcile_timeout_s is not None and self.reconcile_timeout_s <= 0:
            problems.append(f"reconcile_timeout_s must be > 0, got {self.reconcile_timeout_s}")
        if self.retention_s is not None and self.retention_s <= 0:
            problems.append(f"retention_s must be > 0 or None, got {self.retention_s}")
        if problems:
            raise ConfigError(problems)


class StepTracer(Protocol):
    """Sees a step open (``begin``, returning its span) and close (``end``, with the error that left the block)."""

    def begin(self, core: Core) -> Any: ...
    def end(self, span: Any, core: Core, exc: BaseException | None) -> None: ...


class Tracing:
    """Set by an instrumentation (contrib/otel); None: steps are not traced and pay one attribute read."""

    tracer: ClassVar[StepTracer | None] = None


class Fences:
    """The fences one job attempt may own. The worker builds one per attempt.

    Example::

        fences = Fences(FenceStore(engine), Owner(job_id="j1", token="lease-token", lease_s=60))
        with fences.open("order:42", "charge", params={"amount": 500}) as step:
            ...
    """

    def __init__(self, store: FenceBackend, owner: Owner) -> None:
        self.store = store
        self.owner = owner

    def open(self, subject: str, step: str, *, params: Any = None, provider_dedup: bool = False,
             key_window_s: float | None = None, reconcile: Reconcile | None = None,
             retention_s: float | None = None, reconcile_timeout_s: float | None = None) -> FenceContext:
        """A fence on (subject, step), entered with ``with`` or ``async with``."""
        opts = StepOptions(params=params, provider_dedup=provider_dedup, key_window_s=key_window_s,
                           reconcile=reconcile, retention_s=retention_s, reconcile_timeout_s=reconcile_timeout_s)
        return FenceContext(Core(self.store, self.owner, subject, step, opts))


class FenceContext:
    """Enter with ``with`` (→ :class:`Step`) or ``async with`` (→ :class:`AsyncStep`)."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._astore: Any = None
        self._span: Any = None

    def _begin(self) -> None:
        if Tracing.tracer is not None:
            self._span = Tracing.tracer.begin(self._core)

    def _end(self, exc: BaseException | None) -> None:
        span, self._span = self._span, None
        if span is not None and Tracing.tracer is not None:
            Tracing.tracer.end(span, self._core, exc)

    def __enter__(self) -> Step:
        self._begin()
        try:
            return self._enter()
        except BaseException as exc:
            self._end(exc)
            raise

    def _enter(self) -> Step:
        core = self._core
        if _stored(core, core.enter) is RECONCILE:
            answer = core.opts.reconcile(core.key, core.request) if core.opts.reconcile else None
            if inspect.isawaitable(answer):
                _close(answer)
                raise TypeError("reconcile returned an awaitable: use `async with` for async hooks")
            _stored(core, core.apply_reconcile, answer)
        return Step(core)

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            _stored(self._core, self._core.exit, exc)
        finally:
            self._end(exc)

    async def __aenter__(self) -> AsyncStep:
        self._begin()
        try:
            return await self._aenter()
        except BaseException as exc:
            self._end(exc)
            raise

    async def _aenter(self) -> AsyncStep:
        core = self._core
        # The store's statements run on the loop where it has an async engine (astore.py); otherwise they are
        # blocking I/O and run in a thread.
        self._astore = _async_store(core.store)
        try:
            if self._astore is not None:
                decided = await core.aenter(self._astore)
            else:
                decided = await HOP.run(core.enter)
        except DBAPIError as exc:
            raise _failed(core, exc) from exc
        if decided is RECONCILE:
            answer = await _bounded_hook(core)
            await HOP.run(_stored, core, core.apply_reconcile, answer)
        return AsyncStep(core, self._astore)

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self._aexit(exc)
        finally:
            self._end(exc)

    async def _aexit(self, exc: BaseException | None) -> None:
        core = self._core
        if core.settled():  # nothing left to write: no thread hop
            return
        try:
            if self._astore is not None:
                await core.aexit(self._astore, exc)
            else:
                await HOP.run(core.exit, exc)
        except DBAPIError as err:
            raise _failed(core, err) from err


class _StepView:
    """What a handler reads from a step (shared by the sync and async step)."""

    def __init__(self, core: Core) -> None:
        self._core = core

    @property
    def done(self) -> bool:
        """True when the step completed on an earlier run: do nothing, return :attr:`result`."""
        return self._core.done

    @property
    def result(self) -> Any:
        """The result stored by ``complete(..., result=...)`` (decoded JSON)."""
        return self._core.row.result_value

    @property
    def key(self) -> str:
        """The provider idempotency key: derived once from (subject, step); the same on every run."""
        return self._core.key

    @property
    def reference(self) -> str | None:
        """The provider's reference, once recorded."""
        return self._core.row.reference

    @property
    def request(self) -> Any:
        """The request stored when the step started calling (what a replay must send)."""
        return self._core.request

    @property
    def epoch(self) -> int:
        """The fencing token this run holds."""
        return self._core.row.epoch

    @property
    def replaying(self) -> bool:
        """True when :meth:`effect` will replay an in-doubt call with the same key."""
        return self._core.replay


class Step(_StepView):
    """A fenced step in a sync handler."""

    def effect(self, fn: Callable[[], Any], request: Any = None,
               reference: Callable[[Any], Any] | None = None) -> str:
        """Call ``fn`` at most once per fence (outside any transaction) and record its reference.

        Returns the stored reference without calling when one is already recorded.
        ``request`` (default: the step's params) is stored before the call; ``reference``
        extracts the reference from ``fn``'s return value (default: the value itself).
        """
        core = self._core
        stored = _stored(core, core.begin_effect, request)
        if stored is not None:
            return stored
        value = fn()
        if _awaitable(value):
            _close(value)
            raise TypeError("effect(fn): fn returned an awaitable in a sync step; use `async with`")
        return _stored(core, core.finish_effect, value, reference)

    def complete(self, db: Any, result: Any = None) -> AbstractContextManager[Any]:
        """One transaction on ``db``: the fence's completion plus the writes made in the block.

        ``db``: a SQLAlchemy Engine, Connection or Session, or a DB-API connection.
        Yields what to write through (a Connection for an Engine, else ``db`` itself).
        """
        core = self._core
        return _Completing(core, core.store.completion(db, core.subject, core.step, *core.completion_args(result),
                                                       **core.completion_states()))


class AsyncStep(_StepView):
    """A fenced step in an async handler."""

    def __init__(self, core: Core, astore: Any = None) -> None:
        super().__init__(core)
        self._astore = astore  # the store's AsyncFence on this loop, or None: store calls in a thread

    async def effect(self, fn: Callable[[], Any], request: Any = None,
                     reference: Callable[[Any], Any] | None = None) -> str:
        """Async :meth:`Step.effect`; ``fn`` may be sync or return an awaitable."""
        core, a = self._core, self._astore
        if inspect.iscoroutinefunction(fn):  # calling and the record on the loop where the store can
            try:
                stored = await (core.abegin_effect(a, request) if a is not None
                                else HOP.run(core.begin_effect, request))
            except DBAPIError as exc:
                raise _failed(core, exc) from exc
            if stored is not None:
                return stored
            value = await fn()
        else:
            # A sync fn runs in a thread anyway: calling, the call and the record share that one hop (the sync
            # statements cost less CPU than the async ones; a stored reference needs no hop at all).
            stored = core.plan_effect(request)[0] if a is not None else None
            if stored is not None:
                return stored
            stored, value = await HOP.run(_sync_effect, core, fn, request, reference)
            if stored is not None:
                return stored
            if not _awaitable(value):
                return str(value)  # recorded in the thread: value is the reference
            value = await value
        try:
            if a is not None:
                return await core.afinish_effect(a, value, reference)
            return await HOP.run(core.finish_effect, value, reference)
        except DBAPIError as exc:
            raise _failed(core, exc) from exc

    def complete(self, db: Any, result: Any = None) -> AbstractAsyncContextManager[Any]:
        """Async :meth:`Step.complete` for AsyncEngine, AsyncConnection or AsyncSession.

        A sync SQLAlchemy ``db`` (Engine, Connection, Session) also works: the fence's own
        statements and the commit run in a thread; a DB-API or Django connection (often bound
        to its thread) runs them on the loop's thread.
        """
        core = self._core
        return _Completing(core, core.store.acompletion(db, core.subject, core.step, *core.completion_args(result),
                                                        **core.completion_states()))


class _Completing:
    """``with`` / ``async with step.complete(db)``: the store's completion, then the step is completed (a class:
    no generator on every fenced job)."""

    __slots__ = ("core", "inner")

    def __init__(self, core: Core, inner: Any) -> None:
        self.core, self.inner = core, inner

    def __enter__(self) -> Any:
        try:
            return self.inner.__enter__()
        except DBAPIError as exc:
            raise _failed(self.core, exc) from exc

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        try:
            suppressed = bool(self.inner.__exit__(et, exc, tb))
        except DBAPIError as err:
            if err is exc:  # the block's own error, passed through
                raise
            raise _failed(self.core, err) from err
        if et is None or suppressed:
            self.core.completed = True
        return suppressed

    async def __aenter__(self) -> Any:
        try:
            return await self.inner.__aenter__()
        except DBAPIError as exc:
            raise _failed(self.core, exc) from exc

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        try:
            suppressed = bool(await self.inner.__aexit__(et, exc, tb))
        except DBAPIError as err:
            if err is exc:
                raise
            raise _failed(self.core, err) from err
        if et is None or suppressed:
            self.core.completed = True
        return suppressed


def _async_store(store: Any) -> Any:
    """The store's async twin on the running loop (SQL store with an async driver), else None."""
    find = getattr(store, "async_store", None)
    return None if find is None else find()


def _sync_effect(core: Core, fn: Callable[[], Any], request: Any,
                 reference: Callable[[Any], Any] | None) -> tuple[str | None, Any]:
    """In a thread: commit calling, call ``fn``, record its reference. Returns (stored reference, None) when one
    was recorded before, (None, awaitable) when ``fn`` returned one (the loop awaits it), else (None, reference)."""
    stored = _stored(core, core.begin_effect, request)
    if stored is not None:
        return stored, None
    value = fn()
    if _awaitable(value):
        return None, value
    return None, _stored(core, core.finish_effect, value, reference)


def _stored(core: Core, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, one of the fence's own database steps: a database that fails it raises FenceStoreError
    (the handler's ``fn`` and the caller's block are never inside: their errors stay theirs)."""
    try:
        return fn(*args)
    except DBAPIError as exc:
        raise _failed(core, exc) from exc


def _failed(core: Core, exc: DBAPIError) -> FenceStoreError:
    return store_error(exc, f"fence {core.subject!r}/{core.step!r}")


async def _bounded_hook(core: Core) -> Any:
    """The reconcile hook off the loop (the heartbeat keeps renewing the lease), stopped waiting for at its bound."""
    hook, bound = core.opts.reconcile, core.hook_bound()
    if hook is None:
        return None
    try:
        async with asyncio.timeout(bound):
            return await call_off_loop(hook, core.key, core.request)
    except TimeoutError:
        raise ReconcileTimeout(f"fence {core.subject!r}/{core.step!r}: the reconcile hook did not answer within "
                               f"reconcile_timeout_s={bound:g}s; the step stays calling") from None


def _awaitable(value: Any) -> bool:
    # A str (the usual reference) is never awaitable: inspect.isawaitable ends in an ABC check.
    return type(value) is not str and inspect.isawaitable(value)


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()  # no "coroutine was never awaited" warning on top of our error

