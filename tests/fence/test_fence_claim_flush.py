"""A claim commits on PostgreSQL without waiting for its WAL flush; the ``calling`` commit, which waits, makes it
durable before any effect (statements.py, ``_pg_capture``). The crash that would break this is PostgreSQL's own:
here a private server is stopped with ``pg_ctl stop -m immediate`` (no checkpoint, no flush: what a power cut
leaves) and started again from its WAL.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import sqlalchemy as sa
from fence_helpers import OwnerFactory, Provider

from ringfence.errors import FencedOut
from ringfence.fence import Fences, FenceState, FenceStore, Owner
from ringfence.redis.embedded import free_port
from support import at_point, service_missing


class PrivatePostgres:
    """A PostgreSQL cluster of its own on a free loopback port (initdb, pg_ctl), run as ``postgres`` under root."""

    def __init__(self, root: Path) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        found = bins[-1] if bins else shutil.which("initdb")
        if found is None:
            service_missing("PostgreSQL's initdb", "not under /usr/lib/postgresql/*/bin nor on PATH")
        self.bin = os.path.dirname(str(found))
        self.root, self.data, self.port = root, root / "data", free_port()
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []  # initdb refuses root
        if self.as_owner:
            shutil.chown(root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "root", "--no-sync")
        self.url = f"postgresql+psycopg://root@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self.as_owner, os.path.join(self.bin, tool), *args], capture_output=True,
                              timeout=60)
        if done.returncode:
            raise RuntimeError(f"{tool} {' '.join(args)}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def crash(self) -> None:
        """Stop at once: no checkpoint and no WAL flush (the server replays its WAL at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():  # not when a failed test left it crashed
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    root = Path(tempfile.mkdtemp(prefix="rf-pg-"))  # not under pytest's tmp: its parents are root's alone (0700)
    try:
        server = PrivatePostgres(root)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def store(pg: PrivatePostgres) -> Iterator[FenceStore]:
    """A store built from the URL, as ``App(fence_url=...)`` builds it, on a table of its own."""
    store = FenceStore(pg.url, table_name=f"rf_fences_{uuid.uuid4().hex[:10]}")
    store.create_all()
    try:
        yield store
    finally:
        store.engine.dispose()


def test_a_claim_commits_with_synchronous_commit_off_for_itself_alone(store: FenceStore) -> None:
    values = {"v_subject": "order:1", "v_step": "charge", "v_owner_job_id": "job-1", "v_owner_token": "t",
              "v_lease_s": 30.0, "v_params_hash": "h", "v_provider_key": "k", "v_retention_s": None}
    with store.engine.connect() as conn:
        with conn.begin():
            assert conn.execute(store.stmts.pg_capture, values).mappings().one()["fresh"] == 1
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"  # what its commit runs with
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"  # the session's, untouched
        conn.rollback()
        with conn.begin():  # a provider_dedup step is captured calling: its commit waits
            conn.execute(store.stmts.pg_capture_calling, {**values, "v_subject": "order:2", "v_request": "{}"})
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"


def crash_at(pg: PrivatePostgres, point: str) -> AbstractContextManager[None]:
    """A fault hook that crashes and restarts the database the first time ``point`` is reached; the run goes on."""

    def crash(_name: str) -> None:
        pg.crash()
        pg.start()

    return at_point(point, crash)


def charge(store: FenceStore, owner: Owner, subject: str, provider: Provider) -> None:
    with Fences(store, owner).open(subject, "charge", params={"amount": 500}) as step:
        if step.done:
            return
        step.effect(lambda: provider.charge(500, idempotency_key=step.key))
        with step.complete(store.engine):
            pass


def test_a_crash_right_after_calling_keeps_the_claim(pg: PrivatePostgres, store: FenceStore, provider: Provider,
                                                     make_owner: OwnerFactory) -> None:
    """The claim's WAL is on disk once calling has committed: the run goes on after the crash as the step's owner
    (a lost claim would fail its record after the effect, and a rerun would charge again)."""
    owner = make_owner()
    with crash_at(pg, "after_calling"):
        charge(store, owner, "order:9", provider)
    row = store.get("order:9", "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 1
    assert row.owner_token == owner.token and row.reference and provider.calls == [row.provider_key]
    assert provider.effects == 1 and len(provider.calls) == 1


def test_a_crash_right_after_a_claim_still_gives_one_effect(pg: PrivatePostgres, store: FenceStore,
                                                            provider: Provider, make_owner: OwnerFactory) -> None:
    """The claim may be lost with the crash, or replayed from the WAL; either way the run that made it, then its
    redelivery, charge once."""
    rounds, kept = 4, 0
    for n in range(rounds):
        subject = f"order:{n}"
        try:
            with crash_at(pg, "after_capture"):
                charge(store, make_owner(), subject, provider)
            kept += 1  # the claim was replayed: the first run went on as its owner
        except FencedOut:
            pass  # the claim was lost: the run's calling found no row and stopped before its effect
        charge(store, make_owner(), subject, provider)  # the redelivery (the first owner gone)
        row = store.get(subject, "charge")
        assert row is not None and row.state is FenceState.COMPLETED
    assert provider.effects == rounds and len(provider.calls) == rounds
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.table)).scalar() == rounds
    print(f"claims kept through the crash: {kept} of {rounds}")
