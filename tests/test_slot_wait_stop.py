"""The processor waits for free slots on its own event, which the worker's stop request sets too (no watcher
Tasks per wait): a stop ends that wait."""

from __future__ import annotations

import asyncio

from ringfence.worker.fetcher import Stopping


async def test_a_stop_ends_a_wait_on_an_event_it_wakes() -> None:
    stopping = Stopping()
    slot = asyncio.Event()
    stopping.wakes.append(slot)
    waiter = asyncio.create_task(slot.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    stopping.set()
    await asyncio.wait_for(waiter, 1)
    assert stopping.is_set() and slot.is_set()
