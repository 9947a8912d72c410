"""Fakes at our own seams: payment providers that count calls and honour idempotency keys."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ringfence.fence import FenceStore, Owner

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


class Provider:
    """In-memory provider. ``charge`` with a known key returns the first charge (like Stripe)."""

    def __init__(self) -> None:
        self.calls: list[str | None] = []  # the key of every call, in order
        self.charges: dict[str, str] = {}  # charge id -> key (None keys never dedup)
        self._by_key: dict[str, str] = {}
        self._lock = threading.Lock()

    def charge(self, amount: int, idempotency_key: str | None = None, dedup: bool = True) -> str:
        """A charge. ``dedup=False`` plays a provider that ignores keys (it only remembers them)."""
        with self._lock:
            self.calls.append(idempotency_key)
            if dedup and idempotency_key is not None and idempotency_key in self._by_key:
                return self._by_key[idempotency_key]
            charge_id = f"ch_{uuid.uuid4().hex[:10]}"
            self.charges[charge_id] = idempotency_key or ""
            if idempotency_key is not None:
                self._by_key[idempotency_key] = charge_id
            return charge_id

    def lookup(self, key: str, request: Any = None) -> str | None:
        """What a reconcile hook asks the provider: the charge made with this key, if any."""
        return self._by_key.get(key)

    @property
    def effects(self) -> int:
        return len(self.charges)


class FileProvider:
    """The same provider backed by a SQLite file, so a killed process's charge survives it."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, id TEXT NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS calls (n INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT)")

    def charge(self, amount: int, idempotency_key: str) -> str:
        self.db.execute("INSERT INTO calls (key) VALUES (?)", (idempotency_key,))
        self.db.execute("INSERT OR IGNORE INTO charges VALUES (?, ?)",
                        (idempotency_key, f"ch_{uuid.uuid4().hex[:10]}"))
        row = self.db.execute("SELECT id FROM charges WHERE key = ?", (idempotency_key,)).fetchone()
        return str(row[0])

    def counts(self) -> tuple[int, int]:
        """(calls, charges)."""
        calls = self.db.execute("SELECT count(*) FROM calls").fetchone()[0]
        charges = self.db.execute("SELECT count(*) FROM charges").fetchone()[0]
        return int(calls), int(charges)
