"""``make chaos``, small: 200 orders through real workers while the driver breaks things (bench/chaos), on a single
Redis, a Sentinel set and a Redis Cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench.chaos.config import KINDS as ALL_KINDS
from bench.chaos.stack import faketime_available

from support import REQUIRE, ROOT, database_url, service_missing

pytestmark = pytest.mark.slow

# Every fault kind, at rates that fit the time bound on a loaded 2-core machine. The skewed worker needs
# libfaketime (.ci/run installs it): without it, on a laptop the run goes on without "skew"; in CI it fails.
KINDS = tuple(k for k in ALL_KINDS if k != "skew" or faketime_available())


TOPOLOGY = {  # the Redis each run uses: the extra arguments, the Redis faults that must have happened
    "single": ((), ("redis-restart",)),
    "sentinel": (("--redis", "sentinel", "--durable", "--failover-every-s", "10"), ("failover",)),
    "cluster": (("--redis", "cluster", "--durable", "--failover-every-s", "12"), ("failover", "reshard")),
}


@pytest.mark.parametrize("topology", list(TOPOLOGY))
def test_small_chaos_run_passes_every_check(tmp_path: Path, topology: str) -> None:
    database_url("postgresql", tmp_path)  # skips (or fails in CI) when PostgreSQL does not answer
    if REQUIRE and "skew" not in KINDS:
        service_missing("libfaketime", "not installed (apt-get install faketime): the skew kind cannot run")
    extra, redis_faults = TOPOLOGY[topology]
    argv = [sys.executable, "-m", "bench.chaos", "--json", "--orders", "200", "--workers", "3",
            "--concurrency", "4", "--db", "postgresql", "--max-seconds", "75", "--chaos-seconds", "40",
            "--faults", ",".join(KINDS), "--kill-every-s", "3", "--term-every-s", "8",
            "--redis-restart-every-s", "6", "--oom-every-s", "5", "--oom-hold-s", "2", "--db-kill-every-s", "3",
            "--points-p", "0.003", "--p-5xx", "0.05", "--p-hang", "0.03",
            "--p-drop", "0.05", *extra]
    out = subprocess.run(argv, capture_output=True, timeout=110, cwd=ROOT)
    report = json.loads(out.stdout)
    failed = [c for c in report["checks"] if not c["ok"]]
    if out.returncode != 0 or failed:  # in full: pytest would cut a long assertion message
        pytest.fail(json.dumps({"failed": failed, "samples": report["samples"], "stderr": out.stderr.decode()[-2000:]},
                               indent=1), pytrace=False)

    faults = {f["kind"]: f for f in report["faults"]}
    assert set(faults) == set(KINDS)
    for kind in ("kill", "duplicates", *redis_faults, "oom", "db-kill"):  # the chaos did happen
        assert faults[kind]["injected"] > 0, (kind, faults, report["injection_errors"])
    assert sum(faults[f"provider-{k}"]["injected"] for k in ("5xx", "hang", "drop")) > 0, faults
    total = report["total"]
    # a doomed order's job may be dead before any call (charged 0 times, the check above says it is named)
    assert total["orders"] == 200 and total["charged_once"] + total["charged_0"] == 200 and total["charged_2plus"] == 0
    jobs = report["jobs"]
    assert jobs["enqueued"] == jobs["acked"] + jobs["dead"] > 200  # the duplicates too; none lost
