"""``make chaos``, small: 200 orders through real workers while the driver breaks things (bench/chaos)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench.chaos.config import KINDS as ALL_KINDS
from bench.chaos.stack import faketime_available

from support import REQUIRE, ROOT, database_url, service_missing

pytestmark = pytest.mark.slow

# Every fault kind but one, at rates that fit the time bound on a loaded 2-core machine. Left out: "doomed",
# while the open finding in docs/chaos.md ("What the run still finds": a doomed order left calling, its job dead
# without naming it, in 1 of 5 runs) and its drain time (58-85 s) make it fail some runs. The skewed worker needs
# libfaketime (.ci/run installs it): without it, on a laptop the run goes on without "skew"; in CI it fails.
KINDS = tuple(k for k in ALL_KINDS if k != "doomed" and (k != "skew" or faketime_available()))


def test_small_chaos_run_passes_every_check(tmp_path) -> None:
    database_url("postgresql", tmp_path)  # skips (or fails in CI) when PostgreSQL does not answer
    if REQUIRE and "skew" not in KINDS:
        service_missing("libfaketime", "not installed (apt-get install faketime): the skew kind cannot run")
    argv = [sys.executable, "-m", "bench.chaos", "--json", "--orders", "200", "--workers", "3",
            "--concurrency", "4", "--db", "postgresql", "--max-seconds", "75", "--chaos-seconds", "40",
            "--faults", ",".join(KINDS), "--kill-every-s", "3", "--term-every-s", "8",
            "--redis-restart-every-s", "6", "--oom-every-s", "5", "--oom-hold-s", "2", "--db-kill-every-s", "3",
            "--points-p", "0.003", "--p-5xx", "0.05", "--p-hang", "0.03",
            "--p-drop", "0.05"]
    out = subprocess.run(argv, capture_output=True, timeout=110, cwd=ROOT)
    report = json.loads(out.stdout)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert out.returncode == 0 and not failed, (failed, report["samples"], out.stderr.decode()[-2000:])

    faults = {f["kind"]: f for f in report["faults"]}
    assert set(faults) == set(KINDS)
    for kind in ("kill", "duplicates", "redis-restart", "oom", "db-kill"):  # the chaos did happen
        assert faults[kind]["injected"] > 0, (kind, faults)
    assert sum(faults[f"provider-{k}"]["injected"] for k in ("5xx", "hang", "drop")) > 0, faults
    total = report["total"]
    assert total["orders"] == 200 and total["charged_once"] == 200 and total["completed"] + total["in_doubt"] == 200
    jobs = report["jobs"]
    assert jobs["enqueued"] == jobs["acked"] + jobs["dead"] > 200  # the duplicates too
