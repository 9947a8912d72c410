"""What the fence tests share: a backend (a store and an application table next to it) and the provider fake."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import sqlalchemy as sa

from ringfence import faults
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


def at_point(point: str, action: Callable[[str], None]) -> AbstractContextManager[None]:
    """While the block runs, ``action(point)`` the first time fault point ``point`` is reached."""
    fired: list[str] = []

    def hook(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            action(name)

    return faults.inject(hook)


def _simulated_kill(name: str) -> None:
    raise faults.SimulatedKill(name)


def kill_at(point: str) -> AbstractContextManager[None]:
    """A fault hook that 'SIGKILLs' (raises SimulatedKill) the first time ``point`` is reached."""
    return at_point(point, _simulated_kill)
