"""What the fence tests share: a backend (a store and an application table next to it) and the provider fake."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from ringfence.fence import FenceStore, Owner
from ringfence.testing import FakeProvider

OwnerFactory = Callable[..., Owner]


@dataclass
class Backend:
    name: str
    url: str
    store: FenceStore
    orders: sa.Table  # an application table next to the fences, for completion tests

    @property
    def engine(self) -> sa.Engine:
        return self.store.engine


Provider = FakeProvider  # the fence tests' name for the one fake provider (ringfence.testing)

