"""Real crashes: a process SIGKILLed at a fault point, then a rerun that must not charge twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fence_helpers import Backend

from ringfence import faults
from ringfence.fence import FenceState, FenceStore
from ringfence.testing import FakeProvider

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"


def run(b: Backend, table: str, provider_db: Path, token: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
    return subprocess.run(
        [sys.executable, str(HERE / "killrun.py"), b.url, table, str(provider_db), "job-1", token, "0"],
        env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_sigkill_after_effect_then_rerun_replays_same_key(backend: Backend, tmp_path: Path) -> None:
    table = f"rf_kill_{uuid.uuid4().hex[:10]}"
    store = FenceStore(backend.engine, table_name=table)
    store.create_all()
    try:
        provider_db = tmp_path / "provider.db"
        killed = run(backend, table, provider_db, "tok-1", "after_effect")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        row = store.get("order:kill", "charge")
        assert row is not None and row.state is FenceState.CALLING and row.reference is None
        provider = FakeProvider(str(provider_db))
        assert (len(provider.calls), provider.effects) == (1, 1)  # the charge left before the kill

        rerun = run(backend, table, provider_db, "tok-2", None)  # new attempt; old owner is dead
        assert rerun.returncode == 0, rerun.stderr
        assert (len(provider.calls), provider.effects) == (2, 1)  # replayed with the same key: one charge
        done = store.get("order:kill", "charge")
        assert done is not None and done.state is FenceState.COMPLETED and done.epoch == 2
        assert done.reference == rerun.stdout.strip()
    finally:
        store.drop_all()


def test_fault_spec_parsing_and_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert faults.parse("after_effect:0.3, before_commit") == {"after_effect": 0.3, "before_commit": 1.0}
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reload()
    for point in faults.POINTS:
        faults.fault_point(point)  # nothing happens
    monkeypatch.setenv(faults.ENV, "after_effect:0")
    faults.reload()
    faults.fault_point("after_effect")  # probability 0: never fires


def test_fault_env_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setenv(faults.ENV, "after_effect")
    faults.reload()
    try:
        faults.fault_point("after_effect")
        assert kills == [(os.getpid(), signal.SIGKILL)]
        monkeypatch.delenv(faults.ENV)  # not read again: a job's six points make no environment lookup
        faults.fault_point("after_effect")
        assert len(kills) == 2
    finally:
        monkeypatch.delenv(faults.ENV, raising=False)
        faults.reload()
    faults.fault_point("after_effect")
    assert len(kills) == 2
