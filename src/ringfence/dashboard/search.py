"""A state page's filters (task, error text, age, a payload field ``customer_id=42``) applied server-side, in
pages read from Redis until a page of matches is found, the state ends, or the time budget is spent; the
result says how many jobs were read and where "next" goes on.

The pending page reads the pending list, then the jobs in their concurrency keys' lists
(``queries.key_waiting``), each marked with its key."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringfence import jobs, queries
from ringfence.dashboard.page import BadInput
from ringfence.redis.admin import KEY_WAIT

if TYPE_CHECKING:
    from ringfence.app import App

PAGE = 50            # jobs shown per page
CHUNK = 250          # jobs read per round trip while filtering
BUDGET_S = 0.15      # time a filtered page may spend reading before it answers with what it has
_MISSING = object()
_KEYED = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}")


@dataclass(frozen=True)
class At:
    """Where a page starts: ``offset`` in the state's list or set, or, on the pending page past the pending list,
    ``keyed`` = (i, j): the j-th job of the i-th concurrency key (``queries.key_waiting``)."""

    offset: int = 0
    keyed: tuple[int, int] | None = None

    @classmethod
    def parse(cls, offset: int, keyed: str | None) -> At:
        if not keyed:
            return cls(offset)
        if not _KEYED.fullmatch(keyed):
            raise BadInput(f"keyed must be two whole numbers as 3.17, got {keyed[:40]!r}")
        i, _, j = keyed.partition(".")
        return cls(offset, (int(i), int(j)))

    def query(self) -> str:
        """The page's address fields (``offset=..``, then ``keyed=i.j`` past the pending list)."""
        return f"offset={self.offset}" + (f"&keyed={self.keyed[0]}.{self.keyed[1]}" if self.keyed else "")


@dataclass
class Scan:
    jobs: list[Any]
    next_at: At | None  # None: the end of the state
    scanned: int
    elapsed_ms: float
    budget_spent: bool


def payload_field(raw: str, redact_words: tuple[str, ...]) -> tuple[list[str], str] | None:
    """``name=value`` (``a.b=value`` for a nested field) as (path, value); "" is no filter. A redacted field
    cannot be searched: a match would tell its value."""
    raw = raw.strip()
    if not raw:
        return None
    name, eq, value = raw.partition("=")
    path = [p.strip() for p in name.split(".")]
    if not eq or not all(path):
        raise BadInput(f"payload must be field=value (customer_id=42), got {raw[:60]!r}")
    hidden = [p for p in path if any(w.lower() in p.lower() for w in redact_words if w)]
    if hidden:
        raise BadInput(f"payload field {hidden[0][:40]!r} is redacted: it cannot be searched")
    return path, value.strip()


def _value(args: Any, path: list[str]) -> Any:
    for p in path:
        if not isinstance(args, dict) or p not in args:
            return _MISSING
        args = args[p]
    return args


def field_matches(args: Any, wanted: tuple[list[str], str]) -> bool:
    """The field's value written as the query writes it: 42, true, null, or the text itself."""
    value = _value(args, wanted[0])
    if value is _MISSING:
        return False
    return (value if isinstance(value, str) else json.dumps(value)) == wanted[1]


def matches(j: Any, flt: dict[str, Any], now: float, state: str) -> bool:
    if flt["task"] and j.task != flt["task"]:
        return False
    if flt["error"] and flt["error"].lower() not in j.error.lower():
        return False
    if flt.get("field") and not field_matches(j.args, flt["field"]):
        return False
    born = j.died_ms if state == "dead" else j.enqueued_ms
    return not (flt["min_age_s"] and born and (now - born) / 1000 < flt["min_age_s"])


def scan(app: App, queue: str, state: str, at: At, flt: dict[str, Any]) -> Scan:
    """One page of matches from ``at``. Unfiltered: one page read. Filtered: chunks of CHUNK jobs until PAGE
    matches, the end, or BUDGET_S."""
    start = time.monotonic()
    filtered = any(v for k, v in flt.items())
    size = CHUNK if filtered else PAGE
    out: list[Any] = []
    now, scanned = app.broker.clock(), 0
    while True:
        page = read(app, queue, state, at, size)
        scanned += len(page)
        for i, (j, after) in enumerate(page):
            if matches(j, flt, now, state):
                out.append(j)
                if len(out) == PAGE and i + 1 < len(page):  # a full page: "next" resumes after this job
                    return _done(out, after, scanned - len(page) + i + 1, start, False)
        if len(page) < size:
            return _done(out, None, scanned, start, False)
        at = page[-1][1]
        if not filtered or len(out) >= PAGE:
            return _done(out, at, scanned, start, False)
        if time.monotonic() - start >= BUDGET_S:
            return _done(out, at, scanned, start, True)


def read(app: App, queue: str, state: str, at: At, size: int) -> list[tuple[Any, At]]:
    """Up to ``size`` jobs of the state from ``at``, each with where the job after it is. Pending: the pending
    list, then the concurrency keys' lists; a job there reads state ``KEY_WAIT`` + its key."""
    out: list[tuple[Any, At]] = []
    if at.keyed is None:
        page = jobs.browse(app, queue, state, at.offset, size)
        out = [(j, At(at.offset + n + 1)) for n, j in enumerate(page)]
        if state != "pending" or len(page) == size:
            return out
        at = At(at.offset + len(page), (0, 0))
    assert at.keyed is not None
    waiting = queries.key_waiting(app.broker, queue, at.keyed, size - len(out))
    views = jobs.views_of(app, queue, "pending", [(w.job_id, w.spec) for w in waiting])
    for w, view in zip(waiting, views, strict=True):
        if w.key:  # plain jobs of a queue holding keyed ones wait under key '': pending
            view.state = KEY_WAIT + w.key
        out.append((view, At(at.offset, w.after)))
    return out


def _done(out: list[Any], nxt: At | None, scanned: int, start: float, spent: bool) -> Scan:
    return Scan(out, nxt, scanned, round((time.monotonic() - start) * 1000, 1), spent)
