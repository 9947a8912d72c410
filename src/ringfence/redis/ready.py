"""``task.enqueue``'s common case on the sync client: one job, ready now, with a generated id, no unique key and
an inline-sized spec, sent as ``enqueue_ready.lua`` with its command bytes packed ahead.

``Broker.enqueue`` + ``Broker.run`` do the same for any batch; per call they build the arguments and a ``Call``,
look the script up and pack ~10 arguments. Here only the time and the job are packed per call (the command's
head, with the script's SHA and the queue's key names, is built once per queue), on the broker's kept
connections (``raw_calls.py``, whose retry rules apply). Errors are those of ``Broker.run``.
"""

from __future__ import annotations

from typing import Any, Protocol

import redis
from redis.exceptions import NoPermissionError, NoScriptError, OutOfMemoryError

from ringfence.redis.connection import UNAVAILABLE, Health, full_error, not_permitted
from ringfence.redis.keys import QueueKeys
from ringfence.redis.raw_calls import DirectCalls, pack
from ringfence.redis.scripts import script


class Owner(Protocol):
    """What of its broker a ``ReadyEnqueue`` uses (broker.py imports this module, not the other way round)."""

    @property
    def sync(self) -> redis.Redis: ...
    @property
    def health(self) -> Health: ...
    def memory_infos(self) -> list[dict[str, Any]]: ...
    def direct(self) -> DirectCalls | None: ...
    def precise_ms(self) -> float: ...


class ReadyEnqueue:
    """``send(job_id, spec, now_ms)`` queues one job inline in a queue's pending list (``Broker.ready_enqueue``);
    ``clock_ms()`` is the broker's ``precise_ms``."""

    def __init__(self, broker: Owner, k: QueueKeys, shebang: bool) -> None:
        self.broker = broker
        self.clock_ms = broker.precise_ms
        self.source, sha = script("enqueue_ready").for_server(shebang)
        # '*14' (EVALSHA, sha, numkeys, 8 keys, the wake channel, now, the job), then the first 12 arguments
        head = ("EVALSHA", sha, 8, k.pending, k.idle, k.stats, k.jobs, k.active, k.lease, k.attempts,
                k.idle_lease, k.wake)
        self._head = b"*14" + pack(head)[3:]

    def send(self, job_id: str, spec: bytes, now_ms: int) -> bool:
        """True once Redis took the job; False, sending nothing, when the broker has no kept connections (then
        ``Broker.run`` it)."""
        broker = self.broker
        direct = broker.direct()
        if direct is None:
            return False
        now = b"%d" % now_ms
        entry = job_id.encode() + spec
        packed = b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n" % (self._head, len(now), now, len(entry), entry)
        try:
            try:
                direct.send(packed)
            except NoScriptError:
                broker.sync.script_load(self.source)
                direct.send(packed)
        except OutOfMemoryError as exc:
            raise full_error("enqueue", broker.memory_infos()[0]) from exc  # a plain client: one node
        except NoPermissionError as exc:
            raise not_permitted("enqueue", exc) from exc
        except UNAVAILABLE as exc:
            broker.health.lost(exc)
            raise
        health = broker.health
        if health.down_since is not None:
            health.ok()
        return True
