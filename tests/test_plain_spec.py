"""``admit.plain_spec``: the record a plain enqueue writes (also with a concurrency key's ck and cl), read without
``JobSpec.decode``'s field walk, gives the very spec the decode gives; any other record is left to the decode
(None)."""

from __future__ import annotations

import random

import orjson
import pytest

from ringfence.errors import BadRecord
from ringfence.models import JobSpec
from ringfence.worker.admit import plain_spec

VALUES = ["job.x", "", 0, 1, 7, -3, 1.5, 1764589000123.456, True, False, None, {}, {"a": 1}, [], [1], "1"]
KEYS = ["t", "v", "e", "a", "m", "to", "x", "zz", "ck", "cl"]


def test_plain_records_read_as_the_decode_reads_them() -> None:
    rng = random.Random(8)
    records = [JobSpec.plain("peers.job", {"n": n}, 1764589000000 + n / 7, n % 3 + 1) for n in range(50)]
    records += [JobSpec(task="t", args={}, enqueued_ms=5, version=2, max_attempts=3).encode(),
                JobSpec(task="t", args={}, enqueued_ms=5, extra={"k": 1}).encode()]
    for _ in range(3000):
        keys = rng.sample(KEYS, rng.randint(2, 6))
        if rng.random() < 0.5:
            keys = list(dict.fromkeys(["t", "v", "e", "a", *keys]))[: rng.choice([4, 4, 5])]
        records.append(orjson.dumps({k: rng.choice(VALUES) for k in keys}))
    records += [b"[1, 2]", b'"spec"', b'{"t":"a","t":"b","v":1,"e":1,"a":{}}']
    taken = 0
    for raw in records:
        fast = plain_spec(raw)
        try:
            full = JobSpec.decode(raw)
        except BadRecord:
            assert fast is None, raw
            continue
        if fast is not None:
            taken += 1
            assert fast == full and type(fast.enqueued_ms) is type(full.enqueued_ms), raw
    assert taken > 50  # the plain ones, and generated ones of the same shape


def test_keyed_records_read_as_the_decode_reads_them() -> None:
    rng = random.Random(9)
    records = [JobSpec(task="t", args={"account": n}, enqueued_ms=5 + n / 3, version=n % 2 + 1,
                       extra={"ck": f"account:{n}", "cl": n % 4 + 1}).encode() for n in range(50)]
    for _ in range(3000):  # the shape of a keyed record, any values
        keys = ["t", "v", "e", "ck", "cl", "a"]
        if rng.random() < 0.3:
            keys[rng.randrange(6)] = rng.choice(KEYS)
        records.append(orjson.dumps({k: rng.choice(VALUES) for k in keys}))
    taken = 0
    for raw in records:
        fast = plain_spec(raw)
        try:
            full = JobSpec.decode(raw)
        except BadRecord:
            assert fast is None, raw
            continue
        if fast is not None:
            taken += 1
            assert fast == full and type(fast.enqueued_ms) is type(full.enqueued_ms), raw
            assert list(fast.extra) == list(full.extra) == ["ck", "cl"], raw
    assert taken >= 50  # every record a keyed enqueue writes takes the shortcut


def test_a_record_that_is_not_json_is_the_decodes_to_report() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        plain_spec(b"{not json")
