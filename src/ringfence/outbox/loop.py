"""The relay as a worker background loop (``WorkerSettings(relay_outbox_s=1.0)``): every worker may run one,
the relay lease lets one send at a time; the others look every ``interval_s`` whether the lease is free."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringfence.offloop import HOP
from ringfence.outbox.relay import Relay
from ringfence.worker.loop import Loop

if TYPE_CHECKING:
    from ringfence.app import App


class RelayLoop(Loop):
    name = "outbox-relay"

    def __init__(self, app: App, interval_s: float, *, owner: str | None = None) -> None:
        super().__init__(interval_s)
        self.relay = Relay(app, owner=owner, lease_s=max(10.0, 4 * interval_s))

    async def tick(self) -> None:
        await HOP.run(self._drain)

    def _drain(self) -> None:
        """While this worker leads: batches until one comes back short."""
        while not self._stop.is_set() and self.relay.lead() and self.relay.step() == self.relay.batch:
            pass

    async def stop(self) -> None:
        await super().stop()
        await HOP.run(self.relay.release)
