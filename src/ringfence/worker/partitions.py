"""The queues a worker fetches from when some are partitioned (app.queue(name, partitions=N)): each partition is
a queue of its own, served with its queue's weight shared among the partitions, in an order that moves on one
partition per fetch round so none waits behind the others. The queue's own list (where producers not told of the
partitions enqueue) is fetched once the partitions were all found empty, at least every PLAIN_EVERY_S, and in
every round while it holds jobs. Partitions of an earlier declaration (another N) that still hold jobs are found
in the namespace's queue set and fetched in turn with the current ones while they do."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping

from ringfence.redis.broker import Broker
from ringfence.redis.call import as_texts
from ringfence.redis.connection import REFUSED, UNAVAILABLE
from ringfence.redis.keys import logical_queue, partition_name
from ringfence.worker.outcomes import weighted_order

log = logging.getLogger("ringfence.worker")

#: A busy worker fetches a partitioned queue's own list at least this often: fetching it every round made its
#: master serve more commands than the partitions' (tests/test_partitions_cluster.py).
PLAIN_EVERY_S = 0.5
#: How often a worker looks for partitions of another N that hold jobs (one SMEMBERS, then LLEN and EXISTS per
#: partition not its own).
LEFTOVER_EVERY_S = 2.0


def expand(queues: list[tuple[str, int]], partitions: Mapping[str, int]) -> list[tuple[str, int]]:
    """``queues`` with each partitioned one replaced by its partitions, each at the queue's weight, and the
    queue itself last: a producer that was not told of the partitions enqueues there, and its jobs must run."""
    out: list[tuple[str, int]] = []
    for queue, weight in queues:
        n = partitions.get(queue, 1)
        out += [(partition_name(queue, i, n), weight) for i in range(n)] if n > 1 else []
        out.append((queue, weight))
    return out


class FetchOrder:
    """The order of one fetch round over physical queues: the queues by weight (or strictly as given), each
    partitioned queue's partitions in turn from a start that moves by one every round. A partitioned queue's own
    list comes first when due (PLAIN_EVERY_S after it was last found empty), in the turn while it holds jobs, else
    after every other queue: it is then fetched only by a round that found all the others empty, which marks the
    worker idle in it, so a job enqueued there wakes it."""

    def __init__(self, queues: list[tuple[str, int]], clock: Callable[[], float] = time.monotonic) -> None:
        self.served = {name for name, _ in queues}
        self.groups: dict[str, list[str]] = {}  # queue -> its partitions in turn (a plain queue: itself)
        weights: dict[str, int] = {}
        for name, weight in queues:
            queue = logical_queue(name)
            self.groups.setdefault(queue, [])
            if name != queue:
                self.groups[queue].append(name)
            weights.setdefault(queue, weight)
        #: partitioned queue -> when its own list is due (clock): at once, it may hold jobs from before
        self.plain = {queue: 0.0 for queue, names in self.groups.items() if names and queue in self.served}
        for queue, names in self.groups.items():
            if not names:
                names.append(queue)
        self.held: set[str] = set()  # partitioned queues whose own list held jobs at its last fetch
        self.leftovers: dict[str, list[str]] = {}  # partitioned queue -> partitions of another N holding jobs
        self.weighted = list(weights.items())
        self._round = itertools.count()
        self._clock = clock
        self._look_at = 0.0

    def next(self, strict: bool) -> list[str]:
        start = next(self._round)
        now = self._clock()
        out: list[str] = []
        last: list[str] = []
        for queue in weighted_order(self.weighted, strict):
            names = self.groups[queue]
            due = self.plain.get(queue)
            if due is not None:
                names = names + self.leftovers.get(queue, [])
                if queue in self.held:
                    names.append(queue)
                elif due <= now:
                    out.append(queue)
                else:
                    last.append(queue)
            at = start % len(names)
            out += names[at:] + names[:at]
        return out + last

    def fetched(self, queue: str, empty: bool) -> None:
        """A fetch from ``queue`` left it ``empty`` (or not)."""
        if queue not in self.plain:
            return
        if empty:
            self.held.discard(queue)
            self.plain[queue] = self._clock() + PLAIN_EVERY_S
        else:
            self.held.add(queue)

    async def look(self, broker: Broker) -> None:
        """Every LEFTOVER_EVERY_S: the partitions of the served partitioned queues that are not this worker's (an
        earlier declaration with another N, named in the namespace's queue set by the producers and workers that
        used them) and hold jobs, ready or waiting for their concurrency key, become ``leftovers``."""
        now = self._clock()
        if not self.plain or now < self._look_at:
            return
        self._look_at = now + LEFTOVER_EVERY_S
        try:
            names = as_texts(await broker.aio.smembers(broker.keys.queues))
        except (*UNAVAILABLE, *REFUSED) as exc:
            log.debug("partitions of another N not looked for: %s", exc)
            return
        others = sorted(n for n in names if n not in self.served and logical_queue(n) in self.plain)
        holding = await asyncio.gather(*(_holds_jobs(broker, q) for q in others), return_exceptions=True)
        before = {q for qs in self.leftovers.values() for q in qs}
        found: dict[str, list[str]] = {}
        for name, held in zip(others, holding, strict=True):
            # a partition whose node did not answer stays as it was
            if held is True or (isinstance(held, BaseException) and name in before):
                found.setdefault(logical_queue(name), []).append(name)
        new = sorted({q for qs in found.values() for q in qs} - before)
        if new:
            log.info("fetching also from %s: partitions of an earlier declaration that hold jobs", ", ".join(new))
        self.leftovers = found


async def _holds_jobs(broker: Broker, queue: str) -> bool:
    pending, prefix = broker.keys.queue(queue).pending, broker.keys.keyed(queue)
    async with broker.aio.pipeline(transaction=False) as p:
        p.llen(pending)
        p.exists(prefix + "ring", prefix + "parked")
        ready, keyed = await p.execute()
    return bool(ready or keyed)
