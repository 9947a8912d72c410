"""What code that runs against a live namespace (jobs.py, results.py) needs of an App, as a protocol: the
broker, the fence stores, the registry and the connection settings. ``App`` provides it; these modules never
import app.py, so the App can offer ``app.result(...)`` and the CLI's operations without a cycle."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ringfence.fence.failed import FailedJobs
    from ringfence.fence.store import FenceStore
    from ringfence.redis.broker import Broker
    from ringfence.redis.connection import ConnectionSettings
    from ringfence.tasks import Registry


class Runtime(Protocol):
    @property
    def namespace(self) -> str: ...
    @property
    def broker(self) -> Broker: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def redis_settings(self) -> ConnectionSettings: ...
    @property
    def failed_jobs(self) -> FailedJobs | None: ...
    def fence_store_in_use(self) -> FenceStore | None: ...
