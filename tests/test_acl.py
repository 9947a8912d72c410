"""The least-privilege ACL user of docs/deployment.md, on a private redis-server: a worker runs jobs and the CLI
reads, with keys and channels limited to the namespace and no dangerous command."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from ringfence import App
from support import wait_until
from test_topology import _noop, cli, runs, stop, worker
from topology import HAVE_REDIS, Servers, free_port

pytestmark = pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server")

#: As printed in docs/deployment.md (``ns`` there is the namespace).
ACL = "on >s3cret resetkeys ~{ns}:* resetchannels &{ns}:* -@all +@read +@write +@scripting +@pubsub " \
      "+@connection +@transaction +time +info -@dangerous +info"


def test_a_namespace_limited_acl_user_runs_jobs_and_reads(tmp_path: Path, redis_url: str) -> None:
    ns = f"t{uuid.uuid4().hex[:8]}"
    servers = Servers(tmp_path)
    port = free_port()
    servers.start(port)
    admin = redis.Redis(port=port)
    admin.execute_command("ACL", "SETUSER", "ringfence", *ACL.format(ns=ns).split())
    url = f"redis://ringfence:s3cret@127.0.0.1:{port}/0"
    limited = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.get("other:key")  # outside the namespace
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.execute_command("KEYS", "*")
    app = App(url, ns, environment="test")
    noop = app.task(name="noop")(_noop)
    ids = {noop.enqueue(n=i) for i in range(20)}
    rdb = redis.Redis.from_url(redis_url)
    w = worker(url, ns, redis_url, "--queues", "default")
    try:
        wait_until(lambda: runs(rdb, ns) >= ids or w.poll() is not None, timeout=30)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
        wait_until(lambda: app.broker.servers(), timeout=10)
        for args in (["info"], ["servers"], ["doctor"], ["dead", "list"]):
            done = cli(url, ns, redis_url, *args)
            assert done.returncode in (0, 1), (args, done.stdout, done.stderr)
            assert "NOPERM" not in done.stdout + done.stderr and "Traceback" not in done.stderr
    finally:
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        servers.stop()
    assert w.returncode == 0, out
    assert "NOPERM" not in out and "Traceback" not in out
