"""Every process the chaos run starts (private Redis, provider, workers), and their teardown.

Each child runs in its own session (process group): teardown kills the whole group, so nothing a
worker started outlives the run. ``Stack.close()`` is safe to call twice and runs from ``finally``
and ``atexit`` alike.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.chaos.topology import Cluster, SentinelSet
from ringfence.redis.embedded import EmbeddedRedis, free_port

REPO = Path(__file__).resolve().parents[2]
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
AOF = ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")


def faketime_available() -> bool:
    return os.path.exists(FAKETIME_LIB)


@dataclass
class WorkerProc:
    slot: int
    tag: str
    popen: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    killed: bool = False          # SIGKILLed by the driver
    termed_at: float | None = None  # SIGTERM sent by the driver (monotonic)
    exited_at: float | None = None  # when the process ended (monotonic), read by its own thread

    def __post_init__(self) -> None:
        # The driver's loop can be held for seconds (a failover waits for the promotion): an exit is timed
        # when it happens, not when the loop next looks.
        threading.Thread(target=self._reap, name=f"reap-{self.pid}", daemon=True).start()

    def _reap(self) -> None:
        self.popen.wait()
        self.exited_at = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class Stack:
    root: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="ringfence-chaos-"))
    keep_root: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    redis_port: int = 0
    redis_server: EmbeddedRedis | None = None
    sentinel: SentinelSet | None = None
    cluster: Cluster | None = None
    queue_key: str = ""  # a key of the run's queue: on a cluster, the master of its slot is "the" Redis

    # -- Redis ------------------------------------------------------------------------------------
    def start_redis(self, topology: str = "single") -> str:
        if topology == "sentinel":
            self.sentinel = SentinelSet(self.root)
            return self.sentinel.url
        if topology == "cluster":
            self.cluster = Cluster(self.root)
            return self.cluster.url
        self.redis_port = free_port()
        return self._redis_up()

    def kill_master(self) -> str:
        if self.cluster is not None:
            return self.cluster.kill_master(self.queue_key)
        assert self.sentinel is not None
        return self.sentinel.kill_master()

    def reshard(self) -> str:
        assert self.cluster is not None
        return self.cluster.reshard(self.queue_key)

    def _redis_up(self) -> str:
        self.redis_server = EmbeddedRedis(os.path.join(self.root, "redis"), port=self.redis_port, extra=AOF).start()
        return self.redis_server.url

    def restart_redis(self, hard: bool) -> float:
        """Stop the private Redis (SIGKILL when ``hard``: only the AOF keeps the data) and start it again.
        Returns the seconds it was down."""
        started = time.monotonic()
        server = self.redis_server
        if server is not None and server.process is not None:
            if hard:
                server.process.kill()
                server.process.wait()
            else:
                server.stop()
        self._redis_up()
        return time.monotonic() - started

    def redis_client(self) -> redis.Redis:
        """A client of the master (the current one, on a Sentinel set)."""
        if self.sentinel is not None:
            return self.sentinel.client()
        if self.cluster is not None:
            return self.cluster.client(self.queue_key)
        return redis.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=5, socket_connect_timeout=2)

    # -- processes --------------------------------------------------------------------------------
    def spawn(self, argv: list[str], env: dict[str, str], log_name: str, **kw: Any) -> subprocess.Popen[bytes]:
        with open(os.path.join(self.root, log_name), "ab") as log:
            proc = subprocess.Popen(argv, env=env, stderr=log, start_new_session=True, cwd=str(REPO), **kw)
        self.procs.append(proc)
        return proc

    def start_provider(self) -> str:
        argv = [sys.executable, "-m", "bench.chaos.provider", "--db", self.provider_db]
        proc = self.spawn(argv, python_env(), "provider.log", stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("port="):
            raise RuntimeError(f"the chaos provider did not start (said {line!r}); see {self.root}/provider.log")
        return f"http://127.0.0.1:{line.removeprefix('port=')}"

    @property
    def provider_db(self) -> str:
        return os.path.join(self.root, "provider.db")

    def stop(self, proc: subprocess.Popen[bytes], wait_s: float = 5.0) -> None:
        """SIGTERM the process, then SIGKILL its whole group (whatever it started dies with it)."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait_s)
        killpg(proc)
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        procs, self.procs = self.procs, []
        for proc in procs:
            killpg(proc)
        if self.redis_server is not None:
            self.redis_server.stop()
            self.redis_server = None
        if self.sentinel is not None:
            self.sentinel.stop()
            self.sentinel = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        if not self.keep_root:
            shutil.rmtree(self.root, ignore_errors=True)


def killpg(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: pgid == pid
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a child that imports ``bench.chaos`` (the repository root on its path)."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO), **extra}
