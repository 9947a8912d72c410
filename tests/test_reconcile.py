"""Reconciliation finds planted doubles, unfenced effects, missing references and stale in-doubt rows."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
from click.testing import CliRunner
from sqlalchemy import Column, MetaData, String, Table

from ringfence.cli import main as cli
from ringfence.fence import FenceStore
from ringfence.fence.model import Owner
from ringfence.reconcile import Effect, reconcile
from support import database_url


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    s = FenceStore(database_url(request.param, tmp_path), table_name=f"rf_{uuid.uuid4().hex[:8]}")
    s.create_all()
    yield s
    s.drop_all()


def charged(store: FenceStore, subject: str, reference: str | None) -> None:
    """A fence that went through the whole protocol: captured, calling, effected, completed."""
    assert store.capture(subject, "charge", Owner("job", "tok", 30.0), "h", None) is not None
    store.mark_calling(subject, "charge", 1, None, 30.0)
    if reference is not None:
        store.record(subject, "charge", 1, reference)
    else:
        store.reset_claimed(subject, "charge", 1)  # completed with no reference: the effect's id was dropped
    store.complete(subject, "charge", 1, None)


def in_doubt(store: FenceStore, subject: str) -> None:
    store.capture(subject, "charge", Owner("job", "tok", 30.0), "h", None)
    store.mark_calling(subject, "charge", 1, None, 30.0)
    store.park(subject, "charge", 1)


def test_clean_ledger(store) -> None:
    charged(store, "order:1", "ch_1")
    charged(store, "order:2", "ch_2")
    report = reconcile(store, "charge", [Effect("order:1", "ch_1"), Effect("order:2", "ch_2")])
    assert report.exit_code == 0 and (report.fences, report.effects) == (2, 2)


def test_planted_double_charge_and_unfenced_effect(store) -> None:
    charged(store, "order:1", "ch_1")
    charged(store, "order:2", "ch_2")
    key = store.get("order:1", "charge").provider_key
    effects = [
        Effect("order:1", "ch_1", key),
        Effect("order:1", "ch_1b"),              # a second charge of order 1
        Effect("order:2", "ch_2"),
        Effect("order:2", "ch_2"),               # the same charge exported twice: not a double
        Effect("order:3", "ch_3"),               # charged through a path with no fence
        Effect("order:2", "ch_2c", "other-key"),  # sent with a key the fence never made
    ]
    report = reconcile(store, "charge", effects)
    doubles = {d["subject"]: d for d in report.double_effects}
    assert doubles["order:1"]["references"] == ["ch_1", "ch_1b"]
    assert doubles["order:2"]["references"] == ["ch_2", "ch_2c"]
    assert {(u["subject"], u["reference"]) for u in report.unfenced} == {("order:3", "ch_3"), ("order:2", "ch_2c")}
    assert report.exit_code == 1


def test_completed_without_reference_and_stale_in_doubt(store) -> None:
    charged(store, "order:5", None)
    in_doubt(store, "order:6")
    report = reconcile(store, "charge", None, in_doubt_older_than_s=0)
    assert [r["subject"] for r in report.without_reference] == ["order:5"]
    assert [r["subject"] for r in report.stale_in_doubt] == ["order:6"]
    assert reconcile(store, "charge", None, in_doubt_older_than_s=3600).stale_in_doubt == []


def test_an_in_doubt_step_stamped_by_a_clock_ahead_is_reported_at_once(store) -> None:
    """On SQLite each writing process's clock is the database's: a worker whose clock runs 10 s ahead stamps its
    park in the future. Reported at once (age 0), not hidden until the reader's clock passes the stamp."""
    from sqlalchemy import update

    from ringfence.fence.schema import db_now_plus

    in_doubt(store, "order:7")
    with store.engine.begin() as conn:
        conn.execute(update(store.table).where(store.table.c.subject == "order:7").values(updated_at=db_now_plus(10)))
    report = reconcile(store, "charge", None, in_doubt_older_than_s=0)
    assert [r["subject"] for r in report.stale_in_doubt] == ["order:7"]


def test_owner_gone_from_a_store_alone_is_a_step_whose_fence_lease_is_over(store) -> None:
    """Without the broker, "owner gone" is the fence's own lease (database clock): a calling step left by a
    dead run is reported, one whose lease still runs is not, completed ones never."""
    for subject, lease_s in (("order:1", 0.05), ("order:2", 600.0)):
        store.capture(subject, "charge", Owner("job", "tok", lease_s), "h", None)
        store.mark_calling(subject, "charge", 1, None, lease_s)
    charged(store, "order:3", "ch_3")
    time.sleep(0.2)
    report = reconcile(store, "charge", None)
    assert [(g["subject"], g["state"], g["owner_job_id"]) for g in report.owner_gone] == [("order:1", "calling", "job")]
    assert report.exit_code == 1


def test_missing_at_provider_is_informational(store) -> None:
    charged(store, "order:1", "ch_1")
    charged(store, "order:2", "ch_2")
    report = reconcile(store, "charge", [Effect("order:1", "ch_1")])
    assert report.missing_at_provider == [{"subject": "order:2", "reference": "ch_2"}]
    assert report.exit_code == 0


def test_cli_with_a_csv_export(tmp_path, redis_url, namespace) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    store = FenceStore(url)
    store.create_all()
    charged(store, "order:1", "ch_1")
    csv = tmp_path / "charges.csv"
    csv.write_text("subject,reference\n1,ch_1\n1,ch_9\n4,ch_4\n")
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": url}
    res = CliRunner().invoke(cli, ["reconcile", "--step", "charge", "--effects", str(csv),
                                   "--subject-template", "order:{}", "--json"], env=env)
    assert res.exit_code == 1, res.output
    doc = orjson.loads(res.output)
    assert [d["subject"] for d in doc["double_effects"]] == ["order:1"]
    assert [u["subject"] for u in doc["unfenced"]] == ["order:4"]


def test_cli_with_a_table_of_provider_callbacks(tmp_path, redis_url, namespace) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    store = FenceStore(url)
    store.create_all()
    charged(store, "order:1", "ch_1")
    callbacks = Table("psp_callbacks", MetaData(), Column("order_ref", String), Column("charge_id", String))
    callbacks.create(store.engine)
    with store.engine.begin() as conn:
        conn.execute(callbacks.insert(), [{"order_ref": "order:1", "charge_id": "ch_1"},
                                          {"order_ref": "order:8", "charge_id": "ch_8"}])
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": url}
    args = ["reconcile", "--step", "charge", "--effects-table", "psp_callbacks", "--subject-column", "order_ref",
            "--reference-column", "charge_id", "--json"]
    res = CliRunner().invoke(cli, args, env=env)
    assert res.exit_code == 1, res.output
    assert [u["subject"] for u in orjson.loads(res.output)["unfenced"]] == ["order:8"]
