"""The ack batcher (worker/acks.py) at shutdown: an ack in flight when the worker stops is sent to the end, not
cancelled. Before: ``stop()`` found nothing left to flush and cancelled the flusher in the middle of its call,
so the job's lease stayed (seen once in test_wake_push under load: a job run once, its lease still there)."""

from __future__ import annotations

import asyncio
from typing import Any

from ringfence.redis.connection import ConnectionSettings, Health
from ringfence.worker.acks import Acks


class _SlowBroker:
    """Answers each ack call once ``release`` is set."""

    def __init__(self) -> None:
        self.sent = asyncio.Event()
        self.release = asyncio.Event()
        self.done: list[Any] = []
        self.health = Health("slow")  # what Acks reads of a broker besides its calls
        self.connection = ConnectionSettings()

    def ack(self, queue: str, pairs: list[tuple[str, str]]) -> tuple[str, list[tuple[str, str]]]:
        return queue, list(pairs)

    async def arun(self, call: Any) -> list[str]:
        self.sent.set()
        await self.release.wait()
        self.done.append(call)
        return []


async def test_stop_lets_the_ack_in_flight_finish() -> None:
    broker = _SlowBroker()
    acks = Acks(broker, batch=1)  # type: ignore[arg-type]
    acks.start()
    acks.add("q", "j1", "t1")
    await asyncio.wait_for(broker.sent.wait(), 5)  # the flusher's call is in flight
    stopping = asyncio.create_task(acks.stop(3.0))
    await asyncio.sleep(0.05)
    broker.release.set()
    await asyncio.wait_for(stopping, 5)
    assert broker.done == [("q", [("j1", "t1")])]
