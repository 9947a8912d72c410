"""The payment provider: a fake one that behaves like a real provider (a repeated idempotency key answers the
first charge and charges nothing)."""

import os

from ringfence.testing import FakeProvider

psp = FakeProvider(os.environ.get("SHOP_PSP_DB", "psp.db"))  # a SQLite ledger: workers and tests see one record


def charge(amount: int, idempotency_key: str) -> str:
    return psp.charge(amount, idempotency_key=idempotency_key)
