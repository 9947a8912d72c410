"""The fence's statements, built once per store with bound parameters (SQLAlchemy compiles each once too).

Building a Core statement per call cost more client CPU than the database work of a fenced job. Names:
``w_*`` bind the WHERE clause, ``v_*`` the variable values written; a SET value that is the same on every
call (the state a transition writes) is a literal, so it still shows up under its column name
(``state``) among the compiled parameters.

On PostgreSQL the capture is one statement that inserts the row or, when the key exists, returns it
(:attr:`Statements.pg_capture`): a rerun of a completed step costs one round trip.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Double, Table, TextClause, bindparam, case, insert, or_, select, text, update

from .model import COMPLETABLE, FenceState
from .schema import db_now, db_now_plus


def _where(t: Table, states: int = 0) -> list[Any]:
    cond: list[Any] = [t.c.subject == bindparam("w_subject"), t.c.step == bindparam("w_step"),
                       t.c.epoch == bindparam("w_epoch")]
    if states:
        cond.append(or_(*(t.c.state == bindparam(f"w_state{i}") for i in range(states))))
    return cond


class Statements:
    """Every statement of the fence protocol's happy path, for one table."""

    def __init__(self, t: Table) -> None:
        lease = db_now_plus(bindparam("v_lease_s", type_=Double))
        live = case((t.c.lease_until > db_now(), 1), else_=0).label("lease_live")
        self.select = select(*t.c, live)
        self.get = self.select.where(t.c.subject == bindparam("w_subject"), t.c.step == bindparam("w_step"))
        row = dict(
            subject=bindparam("v_subject"), step=bindparam("v_step"), epoch=1,
            owner_job_id=bindparam("v_owner_job_id"), owner_token=bindparam("v_owner_token"), lease_until=lease,
            params_hash=bindparam("v_params_hash"), provider_key=bindparam("v_provider_key"),
            retention_s=bindparam("v_retention_s", type_=Double), created_at=db_now(), updated_at=db_now())
        self.insert = insert(t).values(state=FenceState.CLAIMED.value, **row)
        # Capture and mark calling in one INSERT (a step whose in-doubt rule is a replay with the same key).
        self.insert_calling = insert(t).values(state=FenceState.CALLING.value, request=bindparam("v_request"),
                                               calling_at=db_now(), **row)
        self.calling = update(t).where(*_where(t, 1)).values(
            state=FenceState.CALLING.value, request=bindparam("v_request"), calling_at=db_now(), lease_until=lease,
            updated_at=db_now())
        self.record = update(t).where(*_where(t, 1)).values(
            state=FenceState.EFFECTED.value, reference=bindparam("v_reference"), updated_at=db_now())
        self.reset_claimed = update(t).where(*_where(t, 1)).values(
            state=FenceState.CLAIMED.value, calling_at=None, updated_at=db_now())
        # A step captured as calling whose block failed before its effect: back to claimed, lease over.
        self.unmark = update(t).where(*_where(t, 1)).values(
            state=FenceState.CLAIMED.value, calling_at=None, request=None, lease_until=db_now(), updated_at=db_now())
        self.set_request = update(t).where(*_where(t, 1)).values(request=bindparam("v_request"), updated_at=db_now())
        self.park = update(t).where(*_where(t, 1)).values(
            state=FenceState.IN_DOUBT.value, lease_until=None, updated_at=db_now())
        self.renew = update(t).where(*_where(t)).values(lease_until=lease, updated_at=db_now())
        self.release = update(t).where(*_where(t)).values(lease_until=db_now(), updated_at=db_now())
        self.complete = update(t).where(*_where(t, len(COMPLETABLE))).values(
            state=FenceState.COMPLETED.value, result=bindparam("v_result"), completed_at=db_now(),
            updated_at=db_now(), lease_until=None)
        self.pg_capture = _pg_capture(t, calling=False)
        self.pg_capture_calling = _pg_capture(t, calling=True)
        self.maria_capture = _maria_capture(t, calling=False)
        self.maria_capture_calling = _maria_capture(t, calling=True)


def where(subject: str, step: str, epoch: int, *states: FenceState) -> dict[str, Any]:
    """The WHERE parameters of an epoch-conditional statement."""
    out: dict[str, Any] = {"w_subject": subject, "w_step": step, "w_epoch": epoch}
    if states:
        out.update(_state_params(states))
    return out


@cache
def _state_params(states: tuple[FenceState, ...]) -> dict[str, str]:
    # Once per tuple of states: an enum member's ``.value`` is two Python calls (3.11), on every statement.
    return {f"w_state{i}": s.value for i, s in enumerate(states)}


def _pg_capture(t: Table, *, calling: bool) -> TextClause:
    """INSERT the claimed row, or read the existing one, in one statement (PostgreSQL).

    ``fresh`` is 1 when this statement inserted the row (its columns then read NULL: the statement's
    snapshot predates its own insert; the caller knows what it wrote). When neither branch yields a row
    (another run inserted the key after this statement's snapshot was taken), the caller tries again.

    A claim's commit does not wait for its WAL to reach the disk (``synchronous_commit`` off for this
    statement's transaction alone): it is visible to every other run at once, and it is on disk before any
    effect starts, because the ``calling`` commit, which waits, flushes the WAL up to itself, the claim
    included. A database crash in between may lose the claim: no effect has started, the run's next write
    finds no row and fails, and a rerun captures anew. A step captured ``calling`` commits durably.
    """
    cols = ", ".join(f"f.{c.name}" for c in t.c)
    state, extra_cols, extra_vals = ("'calling'", ", request, calling_at", ", :v_request, now()") if calling else (
        "'claimed'", "", "")
    one = "SELECT 1" if calling else "SELECT set_config('synchronous_commit', 'off', true)"
    sql = (
        f"WITH ins AS (INSERT INTO {t.name} (subject, step, state, epoch, owner_job_id, owner_token, lease_until, "
        f"params_hash, provider_key, retention_s, created_at, updated_at{extra_cols}) VALUES (:v_subject, :v_step, "
        f"{state}, 1, :v_owner_job_id, :v_owner_token, "
        "now() + make_interval(secs => CAST(:v_lease_s AS double precision)), "
        f":v_params_hash, :v_provider_key, CAST(:v_retention_s AS double precision), now(), now(){extra_vals}) "
        "ON CONFLICT (subject, step) DO NOTHING RETURNING id) "
        f"SELECT (SELECT count(*) FROM ins) AS fresh, {cols}, "
        "CASE WHEN f.lease_until > now() THEN 1 ELSE 0 END AS lease_live "
        f"FROM ({one}) AS one LEFT JOIN {t.name} AS f ON f.subject = :v_subject AND f.step = :v_step")
    return text(sql)



def _maria_capture(t: Table, *, calling: bool) -> TextClause:
    """INSERT the row, or read the existing one, in one statement (MariaDB >= 10.5: ``INSERT … RETURNING``).

    ``ON DUPLICATE KEY UPDATE id = id`` changes nothing on an existing row and makes the statement return it.
    ``fresh`` is 1 when this statement inserted the row: its ``created_at`` is this statement's ``NOW(6)`` and
    its owner token ours (a token is one attempt's, so a row of another run never matches both)."""
    cols = ", ".join(c.name for c in t.c)
    state, extra_cols, extra_vals = ("'calling'", ", request, calling_at", ", :v_request, NOW(6)") if calling else (
        "'claimed'", "", "")
    sql = (
        f"INSERT INTO {t.name} (subject, step, state, epoch, owner_job_id, owner_token, lease_until, params_hash, "
        f"provider_key, retention_s, created_at, updated_at{extra_cols}) VALUES (:v_subject, :v_step, {state}, 1, "
        ":v_owner_job_id, :v_owner_token, NOW(6) + INTERVAL CAST(:v_lease_s * 1000000 AS SIGNED) MICROSECOND, "
        f":v_params_hash, :v_provider_key, :v_retention_s, NOW(6), NOW(6){extra_vals}) "
        f"ON DUPLICATE KEY UPDATE id = id RETURNING {cols}, "
        "CASE WHEN lease_until > NOW(6) THEN 1 ELSE 0 END AS lease_live, "
        "CASE WHEN created_at = NOW(6) AND owner_token = :v_owner_token THEN 1 ELSE 0 END AS fresh")
    return text(sql)
