"""Relay lag as the operator's tools read it (``ringfence info``, the doctor, ``/metrics``): rows waiting in
the outbox, the age of the oldest, rows parked, and which relay holds the lease."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ringfence.outbox.store import OutboxStore
from ringfence.redis import outbox as redis_outbox

if TYPE_CHECKING:
    from ringfence.app import App


def outbox_lag(app: App) -> dict[str, Any] | None:
    """``{"waiting", "oldest_s", "parked", "relay"}``, or None when the app has no database or no outbox table
    there."""
    if not app.fence_url:  # app.fence_store would create ./ringfence.db: never from a read
        return None
    store = OutboxStore(app.fence_store.engine, app.namespace)
    if not store.exists():
        return None
    store.check()
    return {**store.lag().to_dict(), "relay": redis_outbox.lease_holder(app.broker)}
