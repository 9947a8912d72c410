"""``make chaos``, small: 100 orders through real workers while the driver breaks things (bench/chaos)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import ROOT, database_url

pytestmark = pytest.mark.slow

# The fault kinds robust on a loaded 2-core machine within the time bound; the full run has them all.
KINDS = ("kill", "term", "points", "duplicates", "redis-restart", "db-kill",
         "provider-5xx", "provider-hang", "provider-drop")


def test_small_chaos_run_passes_every_check(tmp_path) -> None:
    database_url("postgresql", tmp_path)  # skips (or fails in CI) when PostgreSQL does not answer
    argv = [sys.executable, "-m", "bench.chaos", "--json", "--orders", "100", "--workers", "3",
            "--concurrency", "4", "--db", "postgresql", "--max-seconds", "75", "--chaos-seconds", "40",
            "--faults", ",".join(KINDS), "--kill-every-s", "3", "--term-every-s", "8",
            "--redis-restart-every-s", "6", "--db-kill-every-s", "3", "--points-p", "0.003",
            "--p-5xx", "0.05", "--p-hang", "0.03", "--p-drop", "0.05"]
    out = subprocess.run(argv, capture_output=True, timeout=110, cwd=ROOT)
    report = json.loads(out.stdout)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert out.returncode == 0 and not failed, (failed, report["samples"], out.stderr.decode()[-2000:])

    faults = {f["kind"]: f for f in report["faults"]}
    assert set(faults) == set(KINDS)
    assert faults["kill"]["injected"] > 0 and faults["duplicates"]["injected"] > 0, faults
    assert faults["redis-restart"]["injected"] > 0 and faults["db-kill"]["injected"] > 0, faults
    assert sum(faults[f"provider-{k}"]["injected"] for k in ("5xx", "hang", "drop")) > 0, faults
    total = report["total"]
    assert total["orders"] == 100 and total["charged_once"] == 100 and total["completed"] + total["in_doubt"] == 100
    jobs = report["jobs"]
    assert jobs["enqueued"] == jobs["acked"] + jobs["dead"] > 100  # the duplicates too
