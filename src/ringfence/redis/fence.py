"""A fence kept in Redis: cheap, fast, and lossy. Never for money.

Same protocol as the SQL fence (``Fences(RedisFenceStore(r), owner)``), with two
differences a caller must accept:

- the key can vanish (TTL, eviction, a restart without persistence): the step then
  runs again. Use it for effects whose repetition is harmless but wasteful (a cache
  rebuild, a thumbnail), never for charges, emails a customer sees twice, or webhooks;
- ``step.complete(db)`` cannot share a transaction with your database: it checks the
  epoch, runs your block (your own transaction), then marks the fence completed.

Each transition is one Lua script (atomic, one round trip); times are Redis's ``TIME``.
The scripts stay inline because they are private to this store. Redis failing a call raises ringfence's
``CannotConnect`` (down, timed out, login refused), ``NotPermitted`` (ACL) or ``BrokerError``, redis-py's error
as the ``__cause__``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import Any, cast

import redis

from ..errors import FencedOut, FenceError
from ..faults import fault_point
from ..fence.model import COMPLETABLE, FenceRow, FenceState, Owner, provider_key
from ..offloop import in_thread
from .connect import broker_error
from .keys import fence_key

_CAPTURE = """
-- KEYS[1]  the fence hash
-- ARGV[1]  owner_job_id        ARGV[2] owner_token     ARGV[3] lease_ms
-- ARGV[4]  params_hash         ARGV[5] provider_key    ARGV[6] retention_s ('' = keep)
-- ARGV[7]  ttl_ms of the in-progress key (0 = none)
-- returns  1 when created (epoch 1, claimed), 0 when the key exists
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'state', 'claimed', 'epoch', 1, 'owner_job_id', ARGV[1],
  'owner_token', ARGV[2], 'lease_until', string.format('%.0f', now + tonumber(ARGV[3])),
  'params_hash', ARGV[4], 'provider_key', ARGV[5], 'retention_s', ARGV[6],
  'created_at', string.format('%.0f', now), 'updated_at', string.format('%.0f', now))
if tonumber(ARGV[7]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[7]) end
return 1
"""

_CAS = """
-- KEYS[1]  the fence hash
-- ARGV[1]  expected epoch ('' = any)      ARGV[2] allowed states, comma separated ('' = any)
-- ARGV[3]  1 = bump the epoch             ARGV[4] 1 = only if the lease is over (Redis clock)
-- ARGV[5]  lease: '' keep, '-' clear, else ms from now
-- ARGV[6]  expiry: '' keep, 'persist', else ms
-- ARGV[7…] field, value pairs; value '\\0now' = Redis time in ms, '\\0nil' = delete the field
-- returns  1 when applied, 0 when the key, epoch, state or lease condition failed
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local f = redis.call('HMGET', KEYS[1], 'epoch', 'state', 'lease_until')
if ARGV[1] ~= '' and f[1] ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' and not string.find(',' .. ARGV[2] .. ',', ',' .. f[2] .. ',', 1, true) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] == '1' and f[3] and tonumber(f[3]) > now then return 0 end
if ARGV[3] == '1' then redis.call('HINCRBY', KEYS[1], 'epoch', 1) end
if ARGV[5] == '-' then redis.call('HDEL', KEYS[1], 'lease_until')
elseif ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'lease_until', string.format('%.0f', now + tonumber(ARGV[5]))) end
for i = 7, #ARGV, 2 do
  local v = ARGV[i + 1]
  if v == '\\0nil' then redis.call('HDEL', KEYS[1], ARGV[i])
  else
    if v == '\\0now' then v = string.format('%.0f', now) end
    redis.call('HSET', KEYS[1], ARGV[i], v)
  end
end
redis.call('HSET', KEYS[1], 'updated_at', string.format('%.0f', now))
if ARGV[6] == 'persist' then redis.call('PERSIST', KEYS[1])
elseif ARGV[6] ~= '' then redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
return 1
"""

_READ = """
-- KEYS[1]  the fence hash
-- returns  {now_ms, {field, value, …}} (an empty list when the key is gone)
local t = redis.call('TIME')
return {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), redis.call('HGETALL', KEYS[1])}
"""

NOW, NIL = "\0now", "\0nil"


class RedisFenceStore:
    """Fences in Redis hashes (``{prefix}:fence:{len(subject)}:{subject}:{step}``). See the module docstring.

    ``ttl_s`` bounds how long an unfinished fence stays (``None``: no TTL); a completed
    one keeps its step's ``retention_s`` (``None``: persisted). ``url`` names Redis in errors (a URL given as
    ``client`` is used when it is None).
    """

    def __init__(self, client: redis.Redis | str, *, prefix: str = "ringfence",
                 ttl_s: float | None = 86400.0, url: str | None = None) -> None:
        self.redis = redis.Redis.from_url(client) if isinstance(client, str) else client
        self.url = url if url is not None or not isinstance(client, str) else client
        self.prefix, self.ttl_s = prefix, ttl_s
        self._capture = self.redis.register_script(_CAPTURE)
        self._cas_script = self.redis.register_script(_CAS)
        self._read = self.redis.register_script(_READ)

    def key(self, subject: str, step: str) -> str:
        """The Redis key of a fence (redis/keys.py: ``fence_key``)."""
        return fence_key(self.prefix, subject, step)

    def _run(self, script: Any, subject: str, step: str, args: list[Any] | None = None) -> Any:
        """``script`` on the fence's key; redis-py's errors raised as ringfence's."""
        try:
            return script(keys=[self.key(subject, step)], args=args)
        except redis.RedisError as exc:
            raise broker_error(f"redis fence {subject!r}/{step!r}", exc, self.url) from exc

    def _get(self, subject: str, step: str) -> tuple[int, FenceRow | None]:
        now, flat = self._run(self._read, subject, step)
        if not flat:
            return int(now), None
        h = {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}
        lease = int(h["lease_until"]) if h.get("lease_until") else None
        return int(now), FenceRow(
            subject=subject, step=step, state=FenceState(h["state"]), epoch=int(h["epoch"]),
            owner_job_id=h.get("owner_job_id"), owner_token=h.get("owner_token"),
            params_hash=h["params_hash"], provider_key=h["provider_key"], request=h.get("request"),
            reference=h.get("reference"), result=h.get("result"),
            retention_s=float(h["retention_s"]) if h.get("retention_s") else None,
            lease_live=lease is not None and lease > int(now), lease_until=_dt(lease),
            created_at=_dt(h.get("created_at")), updated_at=_dt(h.get("updated_at")),
            calling_at=_dt(h.get("calling_at")), completed_at=_dt(h.get("completed_at")))

    def get(self, subject: str, step: str) -> FenceRow | None:
        """The fence, or None (never captured, expired or evicted)."""
        return self._get(subject, step)[1]

    def _cas(self, subject: str, step: str, epoch: int | None, *, states: tuple[FenceState, ...] = (),
             bump: bool = False, lease_over: bool = False, lease_ms: str = "", expire: str = "",
             **fields: str) -> bool:
        argv: list[Any] = ["" if epoch is None else str(epoch), ",".join(s.value for s in states),
                           "1" if bump else "0", "1" if lease_over else "0", lease_ms, expire]
        for name, value in fields.items():
            argv += [name, value]
        return bool(self._run(self._cas_script, subject, step, argv))

    def _must(self, ok: bool, subject: str, step: str, epoch: int) -> None:
        if not ok:
            raise FencedOut(f"redis fence {subject!r}/{step!r}: epoch {epoch} is no longer current")

    def capture(self, subject: str, step: str, owner: Owner, phash: str,
                retention_s: float | None) -> FenceRow | None:
        ttl = 0 if self.ttl_s is None else int(self.ttl_s * 1000)
        created = self._run(self._capture, subject, step, [
            owner.job_id, owner.token, int(owner.lease_s * 1000), phash, provider_key(subject, step),
            "" if retention_s is None else repr(retention_s), ttl])
        return self.get(subject, step) if created else None

    def take_over(self, row: FenceRow, owner: Owner, *, lease_must_be_over: bool) -> FenceRow | None:
        ok = self._cas(row.subject, row.step, row.epoch, bump=True, lease_over=lease_must_be_over,
                       states=(FenceState.CLAIMED, FenceState.CALLING, FenceState.EFFECTED),
                       lease_ms=str(int(owner.lease_s * 1000)),
                       owner_job_id=owner.job_id, owner_token=owner.token)
        return self.get(row.subject, row.step) if ok else None

    def mark_calling(self, subject: str, step: str, epoch: int, request: str | None, lease_s: float) -> None:
        self._must(self._cas(subject, step, epoch, states=(FenceState.CLAIMED,),
                             lease_ms=str(int(lease_s * 1000)), state=FenceState.CALLING.value,
                             request=NIL if request is None else request, calling_at=NOW),
                   subject, step, epoch)

    def renew(self, subject: str, step: str, epoch: int, lease_s: float) -> None:
        self._must(self._cas(subject, step, epoch, lease_ms=str(int(lease_s * 1000))), subject, step, epoch)

    def record(self, subject: str, step: str, epoch: int, reference: str) -> None:
        self._must(self._cas(subject, step, epoch, states=(FenceState.CALLING,),
                             state=FenceState.EFFECTED.value, reference=reference), subject, step, epoch)

    def reset_claimed(self, subject: str, step: str, epoch: int) -> None:
        self._must(self._cas(subject, step, epoch, states=(FenceState.CALLING,),
                             state=FenceState.CLAIMED.value, calling_at=NIL), subject, step, epoch)

    def park(self, subject: str, step: str, epoch: int) -> None:
        self._must(self._cas(subject, step, epoch, states=(FenceState.CALLING,), lease_ms="-",
                             expire="persist", state=FenceState.IN_DOUBT.value), subject, step, epoch)

    def release(self, subject: str, step: str, epoch: int) -> None:
        self._cas(subject, step, epoch, lease_ms="0")

    def in_window(self, subject: str, step: str, epoch: int, window_s: float) -> bool:
        now, row = self._get(subject, step)
        if row is None or row.epoch != epoch or row.calling_at is None:
            return False
        return row.calling_at.timestamp() * 1000 + window_s * 1000 > now

    def complete(self, subject: str, step: str, epoch: int, result: str | None) -> None:
        row = self.get(subject, step)
        expire = "persist" if row is None or row.retention_s is None else str(int(row.retention_s * 1000))
        self._must(self._cas(subject, step, epoch, states=COMPLETABLE, lease_ms="-", expire=expire,
                             state=FenceState.COMPLETED.value, result=NIL if result is None else result,
                             completed_at=NOW), subject, step, epoch)

    def _check(self, subject: str, step: str, epoch: int) -> None:
        row = self.get(subject, step)
        self._must(row is not None and row.epoch == epoch and row.state in COMPLETABLE, subject, step, epoch)

    @contextmanager
    def completion(self, db: Any, subject: str, step: str, epoch: int, result: str | None) -> Iterator[Any]:
        """Check the epoch, run the caller's block (its own transaction on ``db``), then complete."""
        self._check(subject, step, epoch)
        yield db
        fault_point("before_commit")
        self.complete(subject, step, epoch, result)

    @asynccontextmanager
    async def acompletion(self, db: Any, subject: str, step: str, epoch: int,
                          result: str | None) -> AsyncIterator[Any]:
        """Async twin of :meth:`completion`: the Redis calls run in a thread, the block on the loop."""
        async with in_thread(self.completion(db, subject, step, epoch, result)) as conn:
            yield conn

    def resolve(self, subject: str, step: str, *, happened: bool, reference: str | None = None) -> FenceRow:
        """Settle an in_doubt fence by hand (see ``FenceStore.resolve``)."""
        if happened and not reference:
            raise ValueError("resolve(happened=True) needs the provider's reference")
        fields = ({"state": FenceState.EFFECTED.value, "reference": reference or ""} if happened
                  else {"state": FenceState.CLAIMED.value, "calling_at": NIL})
        if not self._cas(subject, step, None, states=(FenceState.IN_DOUBT,), bump=True, lease_ms="-",
                         owner_job_id=NIL, owner_token=NIL, **cast("dict[str, Any]", fields)):
            raise FenceError(f"redis fence {subject!r}/{step!r} is not in_doubt; nothing to resolve")
        row = self.get(subject, step)
        assert row is not None
        return row


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _dt(ms: int | str | None) -> datetime | None:
    return None if ms is None or ms == "" else datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
