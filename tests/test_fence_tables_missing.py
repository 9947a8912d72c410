"""A fence URL whose database has no fence tables (``fence_url`` set, as the outbox needs, ``ringfence fence init``
not run): one line everywhere — ``fence list|show``, the doctor, the worker's alert — naming the database
(without its password) and the command that creates the tables. SQLite fence databases get their tables on
first use, so there only the store's own read shows the line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from empty_databases import empty_database
from ringfence.errors import FenceTablesMissing
from ringfence.fence.store import FenceStore
from support import wait_until

SERVERS = ["postgresql", "mariadb"]

ALERT_APP = """
from ringfence import App
from ringfence.alerts import AlertRules
from ringfence.doctor import Thresholds

app = App()
app.alert_rules = AlertRules(thresholds=Thresholds(sample_s=0.0), interval_s=0.2, lease_s=5.0)
"""


def ringfence(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")}
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], env={**clean, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(params=SERVERS)
def no_tables(request, tmp_path):
    with empty_database(request.param, tmp_path) as url:
        yield request.param, url


def test_fence_list_and_show_say_which_database_and_the_command(no_tables, redis_url, namespace, tmp_path) -> None:
    _, url = no_tables
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": url}
    for command in (["fence", "list"], ["fence", "show", "order:1", "charge"], ["fence", "prune"],
                    ["fence", "resolve", "order:1", "charge", "--not-done"]):
        out = ringfence(*command, env=env, cwd=tmp_path)
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert out.stderr == (f"error: no fence table ringfence_fences in {url}: create the tables with "
                              f"`ringfence fence init` (or put `ringfence fence ddl --dialect "
                              f"{url.partition('+')[0]}` in a migration)\n"), out.stderr
    assert ringfence("fence", "init", env=env, cwd=tmp_path).returncode == 0
    done = ringfence("fence", "list", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0 and orjson.loads(done.stdout) == [], done.stderr


def test_the_doctor_warns_once_with_the_line_and_why(no_tables, redis_url, namespace, tmp_path) -> None:
    _, url = no_tables
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": url}
    out = ringfence("doctor", "--sample-s", "0", "--json", env=env, cwd=tmp_path)
    findings = {f["check"]: f for f in orjson.loads(out.stdout)["findings"]}
    assert out.returncode == 1, out.stdout  # a warning: the namespace itself is healthy
    doubt, gone = findings["in_doubt"], findings["owner_gone"]
    assert doubt["status"] == "warning" and doubt["subject"] == "fence_database"
    assert doubt["symptom"].startswith(f"no fence table ringfence_fences in {url}: create the tables with "
                                       "`ringfence fence init`")
    assert "never created" in doubt["hypothesis"] and "ringfence fence init" in doubt["remedy"]
    assert gone["status"] == "skipped" and gone["symptom"] == doubt["symptom"]
    assert "SELECT" not in out.stdout.upper() and "\n" not in doubt["symptom"]


def test_the_worker_alerts_once_in_one_line(no_tables, redis_url, namespace, tmp_path) -> None:
    _, url = no_tables
    (tmp_path / "alertapp.py").write_text(ALERT_APP)
    log = tmp_path / "worker.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
           "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": url,
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "alertapp:app"],
                                env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "ALERT firing" in log.read_text() or proc.poll() is not None, timeout=30)
        time.sleep(2.0)  # ten more evaluations: still one incident, announced once
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    text = log.read_text()
    alerts = [line for line in text.splitlines() if "ALERT" in line]
    assert len(alerts) == 1, text
    assert alerts[0].endswith(f"ALERT firing [in_doubt:fence_database] no fence table ringfence_fences in {url}: "
                              "create the tables with `ringfence fence init` (or put `ringfence fence ddl "
                              f"--dialect {url.partition('+')[0]}` in a migration)"), text
    assert "UndefinedTable" not in text and "ProgrammingError" not in text and "Traceback" not in text
    assert proc.returncode == 0, text


def test_sqlite_the_store_read_names_the_file_and_the_command(tmp_path, redis_url, namespace) -> None:
    url = f"sqlite:///{tmp_path}/fences.db"
    store = FenceStore(url)
    try:
        with pytest.raises(FenceTablesMissing) as raised:
            store.list_steps()
        assert str(raised.value) == (f"no fence table ringfence_fences in {url}: create the tables with `ringfence "
                                     "fence init` (or put `ringfence fence ddl --dialect sqlite` in a migration)")
        with pytest.raises(FenceTablesMissing):
            store.get("order:1", "charge")
    finally:
        store.engine.dispose()
    # Through the app, a SQLite fence database gets its tables on first use: the CLI finds an empty table.
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": url}
    out = ringfence("fence", "list", "--json", env=env, cwd=tmp_path)
    assert out.returncode == 0 and orjson.loads(out.stdout) == [], out.stderr
