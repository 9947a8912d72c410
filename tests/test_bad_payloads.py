"""Bad payloads and enqueue options: refused at enqueue with one line naming the field or option, nothing stored.

A corpus of hand-made cases plus hypothesis-generated values; every refusal is checked against Redis (no job
key was written), every acceptance against what the handler received.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ringfence import App, ConfigError, JobContext, PayloadError
from ringfence.queries import DeadFilter, dead_jobs
from ringfence.redis.keys import split_entry
from test_worker import run_until


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 1


@dataclasses.dataclass
class Point:
    x: int


class Stamped(BaseModel):
    order_id: int
    at: datetime           # declared: a payload model converts it (ISO string stored)
    ratio: float = 1.0


def _app(make_app: Any) -> tuple[App, Any, Any]:
    app = make_app()

    @app.task(name="charge")
    def charge(ctx, order_id: int, amount: float = 1.0, note: str = "", tags: list[str] | None = None) -> None: ...

    @app.task(name="stamped", payload=Stamped)
    def stamped(ctx, p: Stamped) -> None: ...

    return app, charge, stamped


def _stored_jobs(rdb: Any, namespace: str) -> list[bytes]:
    """Every job id stored in any queue of the namespace (the ``P:jobs`` hashes, and inline ``P:pending`` entries)."""
    inline = [split_entry(e) for key in rdb.scan_iter(f"{namespace}:*:pending") for e in rdb.lrange(key, 0, -1)]
    return ([job for key in rdb.scan_iter(f"{namespace}:*:jobs") for job in rdb.hkeys(key)]
            + [i.encode() for i, spec in inline if spec is not None])


# Each: (fields, text the one-line error must contain)
BAD_FIELDS = [
    ({"order_id": "abc"}, "field order_id"),
    ({"order_id": "5"}, "field order_id"),          # strict: no coercion of strings to numbers
    ({"order_id": 5.0}, "field order_id"),          # nor of floats to ints
    ({"order_id": True}, "field order_id"),         # nor of booleans
    ({"order_id": 1, "amount": math.nan}, "payload.amount=nan"),
    ({"order_id": 1, "amount": math.inf}, "payload.amount=inf"),
    ({"order_id": 1, "amount": -math.inf}, "payload.amount=-inf"),
    ({"order_id": 1, "amount": "1.5"}, "field amount"),
    ({"order_id": 1, "note": datetime.now(UTC)}, "payload.note holds a datetime"),
    ({"order_id": 1, "note": date(2024, 1, 1)}, "payload.note holds a date"),
    ({"order_id": 1, "note": uuid.uuid4()}, "payload.note holds a UUID"),
    ({"order_id": 1, "note": Color.RED}, "payload.note holds a Color"),
    ({"order_id": Level.HIGH}, "payload.order_id holds a Level"),
    ({"order_id": 1, "note": Point(1)}, "payload.note holds a Point"),
    ({"order_id": 1, "note": Decimal("1.5")}, "payload.note holds a Decimal"),
    ({"order_id": 1, "note": b"bytes"}, "payload.note holds a bytes"),
    ({"order_id": 1, "tags": {"a", "b"}}, "payload.tags holds a set"),
    ({"order_id": 1, "tags": ["a", uuid.UUID(int=0)]}, "payload.tags[1] holds a UUID"),
    ({"order_id": 1, "tags": [1]}, "field tags.0"),
    ({"order_id": 2**64}, "payload.order_id=18446744073709551616 is outside JSON's 64-bit range"),
    ({"order_id": 1, "extra": 1}, "unknown field(s) extra"),
    ({"amount": 1.0}, "missing required field(s) order_id"),
]


@pytest.mark.parametrize(("fields", "expected"), BAD_FIELDS, ids=[e for _, e in BAD_FIELDS])
def test_bad_plain_payload_is_refused_naming_the_field(make_app, rdb, namespace, fields, expected) -> None:
    _, charge, _ = _app(make_app)
    with pytest.raises(PayloadError) as err:
        charge.enqueue(**fields)
    message = str(err.value)
    assert expected in message and "charge" in message and "\n" not in message
    assert _stored_jobs(rdb, namespace) == []


def test_model_payload_declares_its_richer_types_but_refuses_non_finite_numbers(make_app, rdb, namespace) -> None:
    _, _, stamped = _app(make_app)
    at = datetime(2024, 5, 1, 12, tzinfo=UTC)
    stamped.enqueue(order_id=1, at=at)  # the model declares `at: datetime`: converted to JSON by the model
    for bad in (math.nan, math.inf):
        with pytest.raises(PayloadError, match=r"payload\.ratio=(nan|inf): NaN and Infinity are not JSON"):
            stamped.enqueue(Stamped(order_id=1, at=at, ratio=bad))
    assert len(_stored_jobs(rdb, namespace)) == 1


async def test_handler_receives_the_checked_values(make_app) -> None:
    app = make_app()
    got: list[tuple[Any, ...]] = []

    @app.task
    def h(ctx, amount: float, pair: tuple[int, int], when: datetime) -> None:
        got.append((amount, pair, when))

    h.enqueue(amount=2, pair=[1, 2], when="2024-05-01T12:00:00Z")  # JSON forms of the annotated types
    await run_until(app, lambda: got)
    assert got == [(2.0, (1, 2), datetime(2024, 5, 1, 12, tzinfo=UTC))]
    assert isinstance(got[0][0], float)


async def test_a_stored_payload_of_the_wrong_type_dead_letters_once_naming_the_field(make_app) -> None:
    producer = make_app()

    @producer.task(name="shipped")
    def old(ctx, order_id: str) -> None: ...

    old.enqueue(order_id="abc")
    worker_app = make_app()
    ran: list[int] = []

    @worker_app.task(name="shipped")
    def new(ctx, order_id: int) -> None:
        ran.append(order_id)

    await run_until(worker_app, lambda: dead_jobs(worker_app.broker, DeadFilter()))
    [job] = dead_jobs(worker_app.broker, DeadFilter())
    assert job.reason == "bad_payload" and "field order_id" in job.error and job.attempts == 1
    assert ran == []


@pytest.mark.parametrize("handler", [
    lambda order_id: None,
    lambda *, ctx: None,
    lambda *args: None,
])
def test_a_handler_without_the_context_first_is_refused_at_registration(make_app, handler) -> None:
    with pytest.raises(ConfigError, match="first parameter receives the job context") as err:
        make_app().task(name="t")(handler)
    assert "\n" not in str(err.value)


def test_the_context_is_found_by_name_or_annotation(make_app) -> None:
    app = make_app()

    def by_annotation(job: JobContext, n: int) -> None: ...

    def by_string_annotation(job: JobContext, n: int) -> None: ...

    by_string_annotation.__annotations__["job"] = "JobContext"
    app.task(name="a")(by_annotation)
    app.task(name="b")(by_string_annotation)
    app.task(name="c")(lambda context, n: None)
    app.task(name="d")(lambda _ctx: None)


# -- options -------------------------------------------------------------------------------------------------

BAD_OPTIONS = [
    ("delay_s", math.nan), ("delay_s", math.inf), ("delay_s", -1), ("delay_s", "10"), ("delay_s", True),
    ("expiry_s", math.nan), ("expiry_s", -math.inf), ("expiry_s", 0), ("expiry_s", -5), ("expiry_s", "1h"),
    ("unique_for", math.nan), ("unique_for", math.inf), ("unique_for", -1), ("unique_for", 0), ("unique_for", []),
    ("timeout_s", math.nan), ("timeout_s", -1), ("max_attempts", "3"), ("max_attempts", 2.5),
    ("run_at", "2024-01-01"),
]


@pytest.mark.parametrize(("option", "value"), BAD_OPTIONS, ids=[f"{o}={v!r}" for o, v in BAD_OPTIONS])
def test_bad_enqueue_option_is_refused_naming_option_and_value(make_app, rdb, namespace, option, value) -> None:
    _, charge, _ = _app(make_app)
    with pytest.raises(ConfigError) as err:
        charge.with_options(**{option: value}).enqueue(order_id=1)
    message = str(err.value)
    assert f"{option}={value!r}" in message and "\n" not in message
    assert _stored_jobs(rdb, namespace) == []


@pytest.mark.parametrize(("option", "value"), [("unique_for", math.nan), ("expiry_s", math.inf),
                                               ("timeout_s", math.nan), ("unique_for", -3)])
def test_bad_task_option_is_refused_at_registration(make_app, option, value) -> None:
    with pytest.raises(ConfigError, match=f"{option}={value!r}"):
        make_app().task(name="t", **{option: value})(lambda ctx: None)


def test_enqueue_by_an_unknown_task_name_is_refused(make_app, rdb, namespace) -> None:
    app, _, _ = _app(make_app)
    assert app.enqueue("charge", order_id=1)
    _, other_charge, _ = _app(make_app)
    for task in ("chrage", other_charge):
        with pytest.raises(ConfigError, match="is not registered in this app; known: charge, stamped"):
            app.enqueue_many(task, [{"order_id": 1}])
    with pytest.raises(ConfigError, match="'nope' is not registered"):
        app.enqueue("nope", order_id=1)
    assert len(_stored_jobs(rdb, namespace)) == 1


# -- generated corpus ----------------------------------------------------------------------------------------

def _non_json() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not math.isfinite(f)),
        st.datetimes(), st.dates(), st.uuids(), st.decimals(allow_nan=False), st.binary(max_size=4),
        st.sampled_from([Color.RED, Level.HIGH, Point(1), object()]),
        st.sets(st.integers(), min_size=1, max_size=3), st.integers(min_value=2**64, max_value=2**80),
    )


def _nest(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``leaf`` somewhere inside JSON lists and dicts."""
    return st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, min_size=1, max_size=3).map(
        lambda xs: [1, *xs]), st.dictionaries(st.text(min_size=1, max_size=5), inner, min_size=1, max_size=3)),
        max_leaves=4)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
                     | st.floats(allow_nan=False, allow_infinity=False),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3), max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_nest(_non_json()))
def test_generated_non_json_anywhere_is_refused(make_app, value) -> None:
    app = make_app()

    @app.task(name="any")
    def anything(ctx, data: Any) -> None: ...

    with pytest.raises(PayloadError, match=r"field payload\.data"):
        anything.codec.encode({"data": value})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_JSON)
def test_generated_json_round_trips_unchanged(make_app, value) -> None:
    app = make_app()

    @app.task(name="any")
    def anything(ctx, data: Any) -> None: ...

    stored = anything.codec.encode({"data": value})
    _, kwargs = anything.codec.decode(1, stored)
    assert kwargs == {"data": value}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.text(), st.floats(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)))
def test_generated_non_int_for_an_int_field_is_refused(make_app, value) -> None:
    _, charge, _ = _app(make_app)
    with pytest.raises(PayloadError, match="order_id"):
        charge.codec.encode({"order_id": value})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(["delay_s", "expiry_s", "unique_for", "timeout_s"]),
       value=st.one_of(st.floats().filter(lambda f: not math.isfinite(f) or f < 0), st.text(), st.booleans(),
                       st.integers(max_value=-1)))
def test_generated_bad_durations_are_refused(make_app, option, value) -> None:
    _, charge, _ = _app(make_app)
    with pytest.raises(ConfigError, match=f"option {option}="):
        charge.with_options(**{option: value})
