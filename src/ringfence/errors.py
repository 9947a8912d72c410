"""Every error ringfence raises.

::

    RingfenceError
    ├── ConfigError            a setting breaks an invariant; the app or worker refuses to start
    │   └── FenceTablesMissing the fence database has no fence tables (`ringfence fence init` not run)
    ├── EnvironmentMismatch    the namespace belongs to another environment (staging vs production)
    ├── PayloadError           a payload cannot be encoded or decoded (names the task and field)
    │   ├── PayloadTooNew      written by a newer release than this worker: delayed, not failed
    │   └── BadRecord          a stored job record breaks the wire format (names the field and its type)
    ├── DuplicateJob           a unique enqueue found the key held by a queued or running job
    ├── BrokerError            Redis did something the broker did not expect; also from ctx.redis_fence and
    │                          ctx.fence's owner check (Redis down: CannotConnect); redis-py's error is the __cause__
    │   ├── RedisFull          Redis is at maxmemory: writes that add data (enqueue) are refused
    │   ├── NotReplicated      a durable write reached fewer replicas than asked within its timeout
    │   ├── NotPermitted       the Redis user may not run a command the call needs (ACL): refused before any write
    │   ├── PartlyEnqueued     enqueue_many: a call failed after earlier ones queued some of the jobs (.ids)
    │   └── CannotConnect      Redis cannot be reached or refused the login (or its URL is malformed)
    │       └── BadRedisUrl    (also a ConfigError) an unknown scheme or a malformed cluster/Sentinel URL
    ├── ResultError            app.result(job_id) has no result to return
    │   ├── JobFailed          the job went to dead-letter (names the job, the reason and the error)
    │   ├── ResultTimeout      (also a TimeoutError) no result within the timeout
    │   └── UnknownJob         (also a LookupError) no job and no stored result with this id
    ├── JobError               raised by handlers to steer retries
    │   ├── Permanent          do not retry: dead-letter at once
    │   └── RetryLater         retry after a delay without burning an attempt
    └── FenceError
        ├── FenceConflict      same fence key, different parameters
        ├── FencedOut          a write from a run that lost ownership (stale epoch)
        ├── FenceBusy          another live run owns the key
        ├── InDoubt            the effect may have happened and cannot be resolved automatically
        ├── SettleOnly         a settling run (attempts used up by orphaned runs) may not start an effect
        ├── ReconcileTimeout   the reconcile hook did not answer within its bound
        └── FenceStoreError    the fence database failed (down, or refused a statement): the driver's error is
                               the __cause__; a job that raises it is retried like any failed attempt. Raised by
                               ctx.fence and by every operator call: FenceStore's get, list_steps, resolve,
                               prune, owned, park, fence_out, db_now, create_all; FailedJobs' calls;
                               ringfence.fence.create_all; jobs.cancel_job (the CLI exits 3). A missing fence
                               table is FenceTablesMissing instead.

This module imports nothing of ours.
"""

from __future__ import annotations


class RingfenceError(Exception):
    """Base of every ringfence error."""


class ConfigError(RingfenceError):
    """One or more settings break an invariant. The message lists every violation."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class EnvironmentMismatch(ConfigError):
    """The namespace in Redis was claimed by another environment name."""


class FenceTablesMissing(ConfigError):
    """``fence_url`` names a database without the fence tables: the message names it and the command that
    creates them."""


class PayloadError(RingfenceError):
    """A payload cannot be encoded to JSON or decoded for its task."""


class PayloadTooNew(PayloadError):
    """The payload's version is newer than this worker reads (rolling deploy): the job waits, it is not failed."""


class BadRecord(PayloadError):
    """A record read from Redis cannot be decoded: the message names the field and the value's type."""


class DuplicateJob(RingfenceError):
    """A job with the same unique key is queued or running (raised only when asked; else its id is returned)."""

    def __init__(self, message: str, existing_id: str) -> None:
        self.existing_id = existing_id
        super().__init__(message)


class BrokerError(RingfenceError):
    """Redis did something the broker did not expect."""


class RedisFull(BrokerError):
    """Redis reached ``maxmemory``: what adds data (enqueue) is refused; what moves or shrinks it (leases, acks,
    retries, dead-letter, recovery) still runs, so workers drain the queues."""


class NotReplicated(BrokerError):
    """A durable enqueue (``durable=True``/``min_replicas``) reached fewer replicas than asked in time: the job
    is queued on the master, but a failover before it replicates loses it."""


class NotPermitted(BrokerError):
    """The Redis user may not run a command (or touch a key or channel) the call needs (ACL). An enqueue is refused
    whole, before any write: nothing of it is stored."""


class PartlyEnqueued(BrokerError):
    """``enqueue_many`` sends its jobs in bounded calls, and one failed after earlier ones went: ``ids`` are the
    jobs that were queued, ``positions`` their places among the payloads; the others were not queued (the
    original error is the ``__cause__``)."""

    def __init__(self, message: str, ids: list[str], positions: list[int]) -> None:
        self.ids = ids
        self.positions = positions
        super().__init__(message)


class CannotConnect(BrokerError):
    """Redis cannot be reached, refused the login, or its URL is malformed (the CLI exits 3)."""


class ResultError(RingfenceError):
    """``app.result(job_id)`` cannot return the job's result."""

    def __init__(self, message: str, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(message)


class JobFailed(ResultError):
    """The job went to dead-letter: ``reason`` (max_attempts, permanent, bad_result, ...) and ``error`` say why."""

    def __init__(self, message: str, job_id: str, reason: str, error: str) -> None:
        self.reason = reason
        self.error = error
        super().__init__(message, job_id)


class ResultTimeout(ResultError, TimeoutError):
    """The job has not finished within the timeout; it may still (wait again, or look at ``ringfence job show``)."""


class UnknownJob(ResultError, LookupError):
    """No job and no stored result with this id: a wrong id, a result past its TTL, or a job that left its queue
    without a result (cancelled, purged, or its task does not store results)."""


class JobError(RingfenceError):
    """Raised by a handler to steer what happens to the job."""


class Permanent(JobError):
    """The job cannot succeed by retrying: it goes to dead-letter at once."""


class RetryLater(JobError):
    """Run the job again after ``delay_s`` without counting this attempt."""

    def __init__(self, message: str = "retry later", delay_s: float = 1.0) -> None:
        self.delay_s = delay_s
        super().__init__(message)


class FenceError(RingfenceError):
    """A fence refused a transition."""


class FenceConflict(FenceError, Permanent):
    """The fence key exists with different parameters: a second effect would be silent."""


class FencedOut(FenceError):
    """A write from a run whose epoch is no longer current (it lost ownership)."""


class FenceBusy(FenceError):
    """Another live run owns the fence key."""


class InDoubt(FenceError):
    """The effect may have happened; it cannot be replayed or reconciled automatically."""


class SettleOnly(FenceError):
    """A settling run (attempts used up by orphaned runs) may only settle in-doubt steps, not start an effect."""


class ReconcileTimeout(FenceError):
    """A ``reconcile`` hook did not answer within its ``reconcile_timeout_s``; the step stays as it was."""


class FenceStoreError(FenceError):
    """The fence database failed one of a fence's own statements or an operator's call (``FenceStore``,
    ``FailedJobs``): it cannot be reached, or it refused the statement (a permission denied). The message names
    the call and the driver's words; the driver's error (SQLAlchemy's) is the ``__cause__``. In a worker the job
    is retried as after any other error; the step keeps its row, and the rerun's rules apply."""


class BadRedisUrl(CannotConnect, ConfigError):
    """The Redis URL cannot name a Redis (unknown scheme, no Sentinel service): a ConfigError, and for the CLI's
    exit codes a CannotConnect (exit 3), as a malformed URL always was."""
