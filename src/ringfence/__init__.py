"""ringfence: a Redis job queue for Python where the second run is empty.

Importing this package starts nothing.
"""

from ringfence.app import App
from ringfence.errors import (
    ConfigError,
    FenceBusy,
    FenceConflict,
    FencedOut,
    FenceError,
    InDoubt,
    LeaseLost,
    PayloadError,
    Permanent,
    RetryLater,
    RingfenceError,
)
from ringfence.models import DeadJob
from ringfence.settings import RetryPolicy, WorkerSettings
from ringfence.tasks import JobContext, Task

__all__ = [
    "App",
    "ConfigError",
    "DeadJob",
    "FenceBusy",
    "FenceConflict",
    "FenceError",
    "FencedOut",
    "InDoubt",
    "JobContext",
    "LeaseLost",
    "PayloadError",
    "Permanent",
    "RetryLater",
    "RetryPolicy",
    "RingfenceError",
    "Task",
    "WorkerSettings",
]
