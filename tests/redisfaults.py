"""Helpers of the Redis fault tests: worker processes of tests/faultapp.py, run records in files."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from support import ROOT


class FaultWorker:
    """A worker process of faultapp.py; its output goes to a file so a test can count its log lines."""

    def __init__(self, url: str, namespace: str, directory: Path, queues: str, *, prefix: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, name: str = "worker", alerts: bool = False) -> None:
        self.log_path = directory / f"{name}.log"
        full_env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": namespace,
                    "FAULT_DIR": str(directory), "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}"
                    f"{os.environ.get('PYTHONPATH', '')}", **(env or {})}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "ringfence.cli", "worker", "--app", "faultapp:app", "--queues",
                 queues, "--concurrency", "10", "--alerts" if alerts else "--no-alerts",
                 "--summary-s", "0"],  # the tests count log lines: no periodic summary among them
                env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)


def runs(directory: Path, kind: str = "started") -> Counter[str]:
    """Job id -> how many runs left a ``kind`` mark."""
    return Counter(p.name.split(".")[0] for p in directory.glob(f"*.{kind}"))


def ran_once_at_once(directory: Path, job: str, since: float, stats: dict[bytes, bytes], lines: list[str]) -> float:
    """A job whose fetch reply was lost ran once, as attempt 1, within 3 s of ``since`` (not at its lease's end as
    attempt 2), handed back and not orphaned. Returns how long after ``since`` it started."""
    runs = sorted((int(p.name.split(".")[1]), float(p.read_text())) for p in directory.glob(f"{job}.*.started"))
    assert len(runs) == 1, runs
    attempt, started = runs[0]
    assert attempt == 1 and started - since < 3.0, (attempt, started - since, lines)
    assert stats.get(b"handed_back") == b"1", (stats, lines)  # a lost fetch leased it (else inconclusive)
    assert b"orphaned" not in stats and stats.get(b"processed") == b"1", stats
    assert any("whose reply was lost given back" in line for line in lines), lines
    return started - since


class HalfOpenProxy:
    """A TCP proxy to Redis. ``freeze()`` makes every connection open at that moment half-open: bytes are
    dropped both ways, nothing is closed, so a client waits for an answer that never comes (a NAT or firewall
    that forgot the connection). Connections opened later pass normally. ``drop_reply_with(marker)``: the next
    bytes from Redis that contain ``marker`` are dropped and their connection closed (Redis ran the command, its
    client reads no reply)."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pairs: list[dict[str, Any]] = []
        self.closed = False
        self.marker: bytes | None = None
        self.dropped_at: float | None = None  # time.time() of the dropped reply
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            pair: dict[str, Any] = {"frozen": False, "socks": (client, server)}
            self.pairs.append(pair)
            threading.Thread(target=self._pump, args=(client, server, pair), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, pair), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: dict[str, Any]) -> None:
        replies = src is pair["socks"][1]
        try:
            while data := src.recv(65536):
                marker = self.marker
                if replies and marker is not None and marker in data:
                    self.marker, self.dropped_at = None, time.time()
                    for s in pair["socks"]:  # close() alone sends no FIN while the other pump waits in recv
                        with contextlib.suppress(OSError):
                            s.shutdown(socket.SHUT_RDWR)
                    break
                if not pair["frozen"]:
                    dst.sendall(data)
        except OSError:
            pass
        for s in pair["socks"]:
            with contextlib.suppress(OSError):
                s.close()

    def drop_reply_with(self, marker: bytes) -> None:
        self.marker = marker

    def freeze(self) -> int:
        """Black-hole every open connection; returns how many."""
        for pair in self.pairs:
            pair["frozen"] = True
        return len(self.pairs)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        for pair in self.pairs:
            for s in pair["socks"]:
                with contextlib.suppress(OSError):
                    s.close()
