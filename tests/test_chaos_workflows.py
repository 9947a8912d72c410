"""``python -m bench.chaos_workflows``, small: workflows (three fenced charges, then a chord of ten members and a
fenced callback) through two real workers SIGKILLed at random and at the step-ack fault points, and a Redis
SIGKILLed and restarted from its AOF: every workflow done, every charge once, every step's job enqueued once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import DATABASES, ROOT, database_url

pytestmark = pytest.mark.slow


def test_workflows_under_worker_kills_and_a_redis_restart_finish_once(tmp_path: Path) -> None:
    database_url("postgresql", tmp_path)  # skips (or fails in CI) when PostgreSQL does not answer
    argv = [sys.executable, "-m", "bench.chaos_workflows", "--json", "--workflows", "20", "--kill-every", "2",
            "--step-faults", "0.01", "--chaos", "12", "--fence-url", str(DATABASES["postgresql"]), "--timeout", "50"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["worker_kills"] >= 1 and out["redis_restarts"] == 1, out
    assert out["done"] == 20 and out["stuck"] == out["unfinished"] == out["failed"] == 0, out
    assert out["callbacks_once"] == 20 and out["charged_twice"] == 0 and out["charges"] == 80, out
    assert out["steps_enqueued"] == out["steps_expected"] == 20 * 14, out
    assert out["ok"], out
