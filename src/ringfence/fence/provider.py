"""A table of provider records (callbacks, webhooks, an export loaded by the app) in the fence database, declared
in code for one fence step: the only table the dashboard's reconcile page reads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ringfence.errors import ConfigError

if TYPE_CHECKING:
    from ringfence.fence.store import FenceStore

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@dataclass(frozen=True)
class ProviderTable:
    """The provider's records of one step: ``table``, the column holding the fence
    subject (``subject_prefix`` is put in front of its value, e.g. ``"order:"``), and optionally the columns of
    the provider's reference and of the idempotency key it was sent with."""

    table: str
    subject_column: str
    reference_column: str | None = None
    key_column: str | None = None
    subject_prefix: str = ""

    def problems(self) -> list[str]:
        out = [] if isinstance(self.table, str) and _IDENT.fullmatch(self.table) else [
            f"table {self.table!r} must be a plain SQL name (letters, digits, _)"]
        for name in ("subject_column", "reference_column", "key_column"):
            value = getattr(self, name)
            if (value is not None or name == "subject_column") and not (
                    isinstance(value, str) and _IDENT.fullmatch(value)):
                out.append(f"{name} {value!r} must be a plain SQL column name (letters, digits, _)")
        if not isinstance(self.subject_prefix, str):
            out.append(f"subject_prefix {self.subject_prefix!r} must be a str")
        return out

    def rows(self, store: FenceStore) -> Iterator[tuple[str, str | None, str | None]]:
        """(subject, reference, key) per row; a table or column that is not there is one ConfigError line."""
        from ringfence.fence.reads import table_records

        columns = [self.subject_column, self.reference_column, self.key_column]
        self._check(store, [c for c in columns if c])
        for subject, reference, key in table_records(store, self.table, columns):
            yield (f"{self.subject_prefix}{subject}", None if reference is None else str(reference),
                   None if key is None else str(key))

    def _check(self, store: FenceStore, columns: list[str]) -> None:
        """Names only what was declared: never the table's other columns."""
        from sqlalchemy import inspect

        found = inspect(store.engine)
        if not found.has_table(self.table):
            raise ConfigError(f"the provider table {self.table!r} is not in the fence database")
        have = {c["name"] for c in found.get_columns(self.table)}
        missing = [c for c in columns if c not in have]
        if missing:
            raise ConfigError(f"the provider table {self.table!r} has no column {', '.join(missing)}")
