"""``Observers.hears_ran``: the processor skips the ``ran`` coroutine of a job no observer listens to (the
breaker observer listens to jobs of a task with a dependency only); a listening observer is still called."""

from __future__ import annotations

from typing import Any

from ringfence.app import App
from ringfence.metrics import Metrics
from ringfence.worker.observers import Observer, Observers
from ringfence.worker.observers.breakers import BreakerObserver
from ringfence.worker.observers.metrics import MetricsObserver


def test_ran_is_heard_only_where_an_observer_acts_on_it(make_app: Any) -> None:
    app: App = make_app()

    @app.task
    def plain(ctx: Any) -> None: ...

    @app.task(dependency="psp")
    def charged(ctx: Any) -> None: ...

    watchers: list[Observer] = [MetricsObserver(Metrics()), BreakerObserver(gates=None)]  # type: ignore[arg-type]
    observers = Observers(watchers)
    assert not observers.hears_ran(plain)
    assert observers.hears_ran(charged)

    class Listening(Observer):
        async def ran(self, job: Any, task: Any, verdict: Any) -> None: ...

    assert Observers([*watchers, Listening()]).hears_ran(plain)
