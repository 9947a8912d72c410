"""Property test of the broker: any sequence of transitions, with a simulated clock, keeps every job in exactly
one state, never loses one, and lets only the current lease holder move an active job.

Deterministic: a fresh namespace per example, job ids and lease tokens from a counter, time from the simulated
clock; nothing a rule draws from depends on randomness or on the wall clock (hypothesis replays examples)."""

from __future__ import annotations

import uuid

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ringfence.models import JobSpec
from ringfence.redis.broker import Broker
from support import REDIS_URL, SimClock

SPEC = JobSpec(task="t", args={}, enqueued_ms=1).encode()


class BrokerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = SimClock()
        self.ns = f"prop{uuid.uuid4().hex[:8]}"
        self.b = Broker(REDIS_URL, self.ns, clock=self.clock)
        self.k = self.b.keys.queue("q")
        self.r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.live: set[str] = set()          # enqueued and neither acked nor deleted
        self.tokens: dict[str, str] = {}     # active job -> the token we fetched it with
        self.stale: dict[str, str] = {}      # job -> a token that lost its lease
        self.acked: set[str] = set()
        self.seq = 0

    def teardown(self) -> None:
        keys = list(self.r.scan_iter(f"{self.ns}:*"))
        if keys:
            self.r.delete(*keys)

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _token(self) -> str:
        return f"w.{self._next()}"

    @rule(n=st.integers(1, 4), delay=st.sampled_from([0, 0, 500, 5000]))
    def enqueue(self, n: int, delay: int) -> None:
        # Ids from a counter, never random: the rules draw from sorted(ids), and hypothesis replays an example
        # (shrinking, the flakiness check) expecting the same choices to mean the same jobs.
        ids = [f"j{self._next()}" for _ in range(n)]
        at = self.clock.ms + delay if delay else 0
        assert all(self.b.run(self.b.enqueue("q", [(i, SPEC, at) for i in ids])))
        self.live.update(ids)

    @rule(count=st.integers(1, 3), lease=st.sampled_from([1000, 3000]))
    def fetch(self, count: int, lease: int) -> None:
        token = self._token()
        got = self.b.run(self.b.fetch("q", count, self.clock.ms + lease, token))
        for job_id, _, attempt in got:
            assert job_id in self.live and job_id not in self.tokens
            assert attempt >= 1
            self.tokens[job_id] = token

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), action=st.sampled_from(["ack", "retry", "dead", "requeue"]))
    def settle(self, data: st.DataObject, action: str) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[job_id]
        b = self.b
        if action == "ack":
            lost = b.run(b.ack("q", [(job_id, token)]))
            ok = not lost
        elif action == "retry":
            ok = b.run(b.retry("q", job_id, token, self.clock.ms + 200, {"attempt": 1}))
        elif action == "dead":
            ok = b.run(b.dead("q", job_id, token, {"attempt": 1}, {"reason": "x"}))
        else:
            ok = b.run(b.requeue("q", job_id, token, 0, "requeued_on_shutdown"))
        assert ok, f"{action} by the lease holder was refused"
        del self.tokens[job_id]
        self.stale[job_id] = token
        if action == "ack":
            self.live.discard(job_id)
            self.acked.add(job_id)

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def stale_holder_is_refused(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.stale)))
        token = self.stale[job_id]
        if self.tokens.get(job_id) == token:
            return
        b = self.b
        assert b.run(b.ack("q", [(job_id, token)])) == [job_id]
        assert not b.run(b.retry("q", job_id, token, 0, {}))
        assert not b.run(b.requeue("q", job_id, token, 0, "x"))

    @rule(ms=st.sampled_from([100, 1000, 2500, 6000]))
    def advance(self, ms: int) -> None:
        self.clock.ms += ms

    @rule()
    def recover(self) -> None:
        for job_id in self.b.run(self.b.recover("q")):
            self.stale[job_id] = self.tokens.pop(job_id)

    @rule()
    def promote(self) -> None:
        self.b.run(self.b.promote("q"))

    @rule()
    def replay_all_dead(self) -> None:
        dead = self.r.zrange(self.k.dead, 0, -1)
        if dead:
            assert sorted(self.b.run(self.b.replay("q", dead))) == sorted(dead)

    @invariant()
    def every_job_in_exactly_one_state(self) -> None:
        r, k = self.r, self.k
        pending = r.lrange(k.pending, 0, -1)
        places = {
            "pending": set(pending), "scheduled": set(r.zrange(k.scheduled, 0, -1)),
            "retry": set(r.zrange(k.retry, 0, -1)), "active": set(r.zrange(k.active, 0, -1)),
            "dead": set(r.zrange(k.dead, 0, -1)),
        }
        assert len(pending) == len(places["pending"]), "a job is twice in pending"
        seen: dict[str, str] = {}
        for name, ids in places.items():
            for job_id in ids:
                assert job_id not in seen, f"{job_id} is both {seen[job_id]} and {name}"
                seen[job_id] = name
        assert set(seen) == self.live, "a job was lost or an acked one came back"
        assert not (set(seen) & self.acked)
        assert places["active"] == set(self.tokens) == set(r.hkeys(k.lease))
        assert set(r.hkeys(k.jobs)) == self.live - places["dead"]
        assert set(r.hkeys(k.dead_jobs)) == places["dead"]


TestBrokerStates = BrokerMachine.TestCase
TestBrokerStates.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
