"""The processes the peer benchmark starts: a private redis-server, worker groups, a producer.

Every process is started in a session (process group) of its own and recorded in ``STARTED``; ``kill_all``
(called in ``finally`` and on SIGINT/SIGTERM) SIGKILLs every group still alive, so nothing outlives the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

STARTED: list[subprocess.Popen[bytes]] = []


def _start(argv: Sequence[str], log_path: str, env: dict[str, str] | None = None, cwd: str | None = None,
           stdin: int | None = None, stdout: int | None = None) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=stdin, stdout=stdout or log, stderr=log,
                                start_new_session=True)
    STARTED.append(proc)
    return proc


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM to the process group, then SIGKILL to it after ``grace_s``; reaps the leader."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGCONT)  # a stopped group cannot act on SIGTERM
        signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    signal_group(proc, signal.SIGKILL)  # children that outlived their leader, too
    if proc.poll() is None:
        proc.wait()
    if proc in STARTED:
        STARTED.remove(proc)


def kill_all() -> None:
    for proc in list(STARTED):
        signal_group(proc, signal.SIGCONT)
        signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        STARTED.remove(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private redis-server on a free loopback port and a temporary directory, no persistence."""

    def __init__(self, log_dir: str) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="peers-redis-")
        binary = shutil.which("redis-server") or "redis-server"
        self.proc = _start([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--dir", self.dir, "--protected-mode", "yes"],
                           os.path.join(log_dir, f"redis-{self.port}.log"))
        import redis  # the harness venv's

        self.client = redis.Redis(port=self.port, socket_timeout=30)
        self.metrics = redis.Redis(port=self.port, db=15, socket_timeout=30)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("private redis-server did not start") from None
                time.sleep(0.05)

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def wipe(self) -> None:
        """Empty this private server (it holds nothing but what this run wrote)."""
        self.client.flushall()

    def close(self) -> None:
        self.client.close()
        self.metrics.close()
        stop(self.proc, 5)
        shutil.rmtree(self.dir, ignore_errors=True)


class Workers:
    """``argvs`` started together (each in its own process group), stopped together."""

    def __init__(self, argvs: Sequence[Sequence[str]], env: dict[str, str], cwd: str, log_path: str) -> None:
        self.procs = [_start(argv, log_path, env=env, cwd=cwd) for argv in argvs]

    def send(self, sig: int) -> None:
        for p in self.procs:
            signal_group(p, sig)

    def dead(self) -> bool:
        return any(p.poll() is not None for p in self.procs)

    def stop(self, grace_s: float = 5.0) -> None:
        for p in self.procs:
            if p.poll() is None:  # SIGTERM to the leader only, as a service manager stops a worker
                signal_group(p, signal.SIGCONT)
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            stop(p, 0)


class Producer:
    """The adapter's producer (``produce.py``) in the library's venv: one JSON command per line on stdin,
    one JSON answer per line on stdout."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: str, log_path: str) -> None:
        self.proc = _start(argv, log_path, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def call(self, timeout_s: float, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError(f"producer: no answer to {command['op']} within {timeout_s:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"producer exited during {command['op']} (exit {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"producer: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        stop(self.proc, 2)
