"""The queues a worker fetches from when some are partitioned (app.queue(name, partitions=N)): each partition is
a queue of its own, served with its queue's weight shared among the partitions, in an order that moves on one
partition per fetch round so none waits behind the others."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from ringfence.redis.keys import logical_queue, partition_name
from ringfence.worker.outcomes import weighted_order


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
    partitioned queue's partitions in turn from a start that moves by one every round."""

    def __init__(self, queues: list[tuple[str, int]]) -> None:
        self.groups: dict[str, list[str]] = {}
        weights: dict[str, int] = {}
        for name, weight in queues:
            queue = logical_queue(name)
            self.groups.setdefault(queue, []).append(name)
            weights.setdefault(queue, weight)
        self.weighted = list(weights.items())
        self._round = itertools.count()

    def next(self, strict: bool) -> list[str]:
        start = next(self._round)
        out: list[str] = []
        for queue in weighted_order(self.weighted, strict):
            names = self.groups[queue]
            at = start % len(names)
            out += names[at:] + names[:at]
        return out
