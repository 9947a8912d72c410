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
    PayloadError,
    PayloadTooNew,
    Permanent,
    RedisFull,
    RetryLater,
    RingfenceError,
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
    "PayloadError",
    "PayloadTooNew",
    "Permanent",
    "RedisClients",
    "RedisFull",
    "RetryLater",
    "RetryPolicy",
    "RingfenceError",
    "Task",
    "WorkerSettings",
]
