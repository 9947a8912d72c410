"""ringfence: a Redis job queue for Python where the second run is empty.

Importing this package starts nothing.
"""

from ringfence.app import App
from ringfence.errors import (
    ConfigError,
    DuplicateJob,
    FenceBusy,
    FenceConflict,
    FencedOut,
    FenceError,
    InDoubt,
    JobFailed,
    PayloadError,
    PayloadTooNew,
    Permanent,
    RedisFull,
    ResultTimeout,
    RetryLater,
    RingfenceError,
    UnknownJob,
)
from ringfence.models import DeadJob
from ringfence.redis.connection import ConnectionSettings, RedisClients
from ringfence.settings import BreakerPolicy, RetryPolicy, WorkerSettings
from ringfence.tasks import JobContext, Task

__all__ = [
    "App",
    "BreakerPolicy",
    "ConfigError",
    "ConnectionSettings",
    "DeadJob",
    "DuplicateJob",
    "FenceBusy",
    "FenceConflict",
    "FenceError",
    "FencedOut",
    "InDoubt",
    "JobContext",
    "JobFailed",
    "PayloadError",
    "PayloadTooNew",
    "Permanent",
    "RedisClients",
    "RedisFull",
    "ResultTimeout",
    "RetryLater",
    "RetryPolicy",
    "RingfenceError",
    "Task",
    "UnknownJob",
    "WorkerSettings",
]
