"""A fake payment provider that counts real effects the way a real one makes them (``ringfence.testing``).

::

    from ringfence.testing import FakeProvider

    psp = FakeProvider()                                  # in memory; FakeProvider(path) for a SQLite file
    ref = psp.charge(500, idempotency_key=step.key, order=42)
    psp.effects          # charges made: one per distinct key (a repeated key answers the first charge)
    psp.calls            # the key of every call, in order (a replay with the same key is a call, not a charge)
    psp.lookup(key)      # the charge made with ``key``, or None: what a reconcile hook asks

- ``honours_keys=False`` plays a provider that ignores idempotency keys (a new charge on every call) but keeps
  each call's key as metadata, so :meth:`FakeProvider.lookup` still finds the charge;
- ``fault="lost"`` (or ``psp.fault = "lost"``) plays "answered, then crashed": the charge is made, then the
  call raises :class:`LostAnswer` instead of returning, as when the connection dies after the provider
  committed; ``fault="5xx"`` refuses the call (:class:`ProviderUnavailable`) and charges nothing.

The storage is SQLite: ``":memory:"`` by default, or a file that a SIGKILLed process's charge survives and
that several processes (workers, the demo's HTTP provider) share. Several providers may share one file under
different ``name``\\ s; charge ids (``ch_<n>``) are unique across them.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any, NamedTuple

__all__ = ["Charge", "FakeProvider", "LostAnswer", "ProviderError", "ProviderUnavailable"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT, provider TEXT NOT NULL, order_id, amount INTEGER NOT NULL,
    idem_key TEXT, caller TEXT NOT NULL, ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS charges_key ON charges (provider, idem_key);
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, provider TEXT NOT NULL, order_id, idem_key TEXT,
    caller TEXT NOT NULL, fault TEXT NOT NULL, charged INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lookups (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, provider TEXT NOT NULL, idem_key TEXT NOT NULL,
    found INTEGER NOT NULL);
"""
REFUSED = "5xx"  # the one fault that charges nothing; every other named fault charges, then loses the answer


class ProviderError(ConnectionError):
    """The call failed on the way back (a worker retries a ``ConnectionError``)."""


class ProviderUnavailable(ProviderError):
    """The provider refused the call (a 5xx answer): nothing was charged."""


class LostAnswer(ProviderError):
    """The provider charged, but its answer never arrived. ``reference``: the charge that was made."""

    def __init__(self, reference: str, fault: str) -> None:
        super().__init__(f"the provider charged ({reference}) but its answer was lost ({fault})")
        self.reference, self.fault = reference, fault


class Charge(NamedTuple):
    """One real effect at the provider."""

    id: str
    order: Any
    amount: int
    key: str | None


class FakeProvider:
    """A payment provider in a SQLite ledger (``":memory:"`` or a file): idempotency keys, faults, lookups."""

    def __init__(self, path: str = ":memory:", *, name: str = "", honours_keys: bool = True,
                 fault: str = "") -> None:
        self.path, self.name, self.honours_keys, self.fault = path, name, honours_keys, fault
        self._db = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
        if path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")  # several processes read and write it
            self._db.execute("PRAGMA synchronous=OFF")  # a SIGKILLed caller loses nothing: the OS keeps the pages
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def charge(self, amount: int, idempotency_key: str | None = None, *, order: Any = None,
               dedup: bool | None = None, caller: str = "", fault: str | None = None) -> str:
        """Charge ``amount``; returns the charge id (``ch_<n>``).

        A key seen before answers the first charge and charges nothing, unless the provider ignores keys
        (``honours_keys=False``, or ``dedup=False`` for this call). ``fault`` (default: the provider's
        ``fault``): ``"5xx"`` raises :class:`ProviderUnavailable` with nothing charged; any other non-empty
        name charges, then raises :class:`LostAnswer`. Every call is logged with its ``caller`` and fault.
        """
        fault = self.fault if fault is None else fault
        honour = self.honours_keys if dedup is None else dedup
        now = time.time()
        with self._lock, self._db:  # one transaction: the key check and the insert are one decision
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT INTO calls (ts, provider, order_id, idem_key, caller, fault, charged) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (now, self.name, order, idempotency_key, caller, fault, fault != REFUSED))
            if fault == REFUSED:
                ref = ""
            else:
                ref = (self._find(idempotency_key) if honour else None) or self._insert(
                    amount, idempotency_key, order, caller, now)
        if fault == REFUSED:
            raise ProviderUnavailable("the provider answered 503: nothing was charged")
        if fault:
            raise LostAnswer(ref, fault)
        return ref

    def _find(self, key: str | None) -> str | None:
        if key is None:
            return None
        row = self._db.execute("SELECT id FROM charges WHERE provider = ? AND idem_key = ? ORDER BY id LIMIT 1",
                               (self.name, key)).fetchone()
        return None if row is None else f"ch_{row[0]}"

    def _insert(self, amount: int, key: str | None, order: Any, caller: str, now: float) -> str:
        cur = self._db.execute("INSERT INTO charges (provider, order_id, amount, idem_key, caller, ts) "
                               "VALUES (?, ?, ?, ?, ?, ?)", (self.name, order, amount, key, caller, now))
        return f"ch_{cur.lastrowid}"

    def lookup(self, key: str, request: Any = None) -> str | None:
        """The (first) charge made with ``key``, or None: the provider's search a reconcile hook uses."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            found = self._find(key)
            self._db.execute("INSERT INTO lookups (ts, provider, idem_key, found) VALUES (?, ?, ?, ?)",
                             (time.time(), self.name, key, found is not None))
        return found

    # -- what a test counts -------------------------------------------------------------------------------
    @property
    def calls(self) -> list[str | None]:
        """The key of every call, in order (refused ones included)."""
        return [r[0] for r in self._read("SELECT idem_key FROM calls WHERE provider = ? ORDER BY id")]

    @property
    def charges(self) -> dict[str, str | None]:
        """Charge id -> the key it was made with: one entry per real effect."""
        return {f"ch_{r[0]}": r[1] for r in self._read("SELECT id, idem_key FROM charges WHERE provider = ? "
                                                         "ORDER BY id")}

    @property
    def effects(self) -> int:
        """How many charges were made (a replay with a known key is none)."""
        return int(self._read("SELECT count(*) FROM charges WHERE provider = ?")[0][0])

    def records(self) -> list[Charge]:
        """Every charge, in order."""
        return [Charge(f"ch_{r[0]}", r[1], r[2], r[3])
                for r in self._read("SELECT id, order_id, amount, idem_key FROM charges WHERE provider = ? "
                                    "ORDER BY id")]

    def stats(self) -> dict[str, int]:
        """``{"charges": n, "double_charged_orders": m}`` (orders charged more than once)."""
        doubled = self._read("SELECT count(*) FROM (SELECT order_id FROM charges WHERE provider = ? "
                             "GROUP BY order_id HAVING count(*) > 1)")[0][0]
        return {"charges": self.effects, "double_charged_orders": int(doubled)}

    def _read(self, sql: str) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, (self.name,)).fetchall()

    def close(self) -> None:
        self._db.close()
