"""The test kit (``ringfence.testing.plugin``, entry point ``pytest11``) as a user meets it: tests/kitproject is a
small user project whose App names Redis at 127.0.0.1:6379; its own pytest suite runs in a subprocess inside a
network namespace where only a downed loopback exists, so no Redis, PostgreSQL or MariaDB server is reachable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support import ROOT

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "kitproject"
PROBE = ("import socket\n"
         "for port in (6379, 5432, 3306):\n"
         "    try:\n"
         "        socket.create_connection(('127.0.0.1', port), timeout=2).close(); print(port, 'reachable')\n"
         "    except OSError:\n"
         "        print(port, 'unreachable')\n")


def isolated() -> list[str]:
    """A command prefix that runs without network (root: ``unshare -n``)."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("no network namespace here (unshare -n needs root)")
    return [unshare, "-n"]


def run_user_suite(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str | None]]:
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFENCE_", "PYTEST_"))}
    env.update(PYTHONPATH=str(project), REDIS_URL="redis://127.0.0.1:6379/0",
               RINGFENCE_REDIS_URL="redis://127.0.0.1:6379/0", HOME=str(tmp_path))
    script = (f"{sys.executable} -c \"$PROBE\" > probe.txt && "
              f"{sys.executable} -m pytest -q -p no:cacheprovider --junitxml=results.xml tests")
    out = subprocess.run([*isolated(), "sh", "-c", script], cwd=project, env={**env, "PROBE": PROBE},
                         capture_output=True, text=True, timeout=300)
    probe = (project / "probe.txt").read_text()
    assert probe.split("\n")[:3] == ["6379 unreachable", "5432 unreachable", "3306 unreachable"], probe
    results: dict[str, str | None] = {}
    for case in ET.parse(project / "results.xml").iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        results[case.get("name", "")] = None if failure is None and error is None else (
            (failure if failure is not None else error).get("message", "")  # type: ignore[union-attr]
        )
    return out, results


def test_a_users_suite_runs_with_no_server_reachable(tmp_path: Path) -> None:
    out, results = run_user_suite(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr  # one test of the suite is meant to fail
    passed = sorted(name for name, failure in results.items() if failure is None)
    assert passed == sorted([
        "test_a_charge_enqueued_twice_charges_once",
        "test_retries_run_with_their_backoff_in_simulated_time",
        "test_a_delayed_job_runs_once_its_time_comes",
        "test_cron_ticks_run_as_the_clock_moves",
        "test_a_bad_payload_is_refused_at_enqueue",
        "test_an_expected_dead_job_is_returned",
    ]), out.stdout
    message = results["test_fails_on_an_unexpected_dead_job"]
    assert message is not None and "1 job(s) reached dead-letter, 0 expected" in message, out.stdout
