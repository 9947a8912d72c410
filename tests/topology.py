"""Private Redis Cluster (3 masters) and Sentinel (1 master, 1 replica, 3 sentinels) set-ups on free loopback
ports, as real ``redis-server`` processes; never the shared Redis."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

HAVE_REDIS = shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def free_port() -> int:
    """A free port below 55536 whose cluster bus port (+10000) is free too."""
    while True:
        port = random.randint(20000, 45000)
        if all(_free(p) for p in (port, port + 10000)):
            return port


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout:g}s")


class Servers:
    """redis-server processes started here and stopped (SIGKILL) by ``stop``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, port: int, *args: str, config: str | None = None) -> None:
        cmd = ["redis-server"]
        if config is not None:
            path = self.dir / f"{port}.conf"
            path.write_text(config)
            cmd.append(str(path))
        cmd += ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--logfile", str(self.dir / f"{port}.log"), *args]
        self.procs[port] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait(lambda: redis.Redis(port=port, socket_timeout=1).ping(), 10, f"redis-server on {port}")
        except RuntimeError:
            self.stop()
            raise

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)


class Cluster(Servers):
    def __init__(self, directory: Path, masters: int = 3) -> None:
        super().__init__(directory)
        self.ports = [free_port() for _ in range(masters)]
        for p in self.ports:
            self.start(p, "--cluster-enabled", "yes", "--cluster-config-file", str(directory / f"nodes-{p}.conf"),
                       "--cluster-node-timeout", "2000")
        try:
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                            "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=30)
            _wait(lambda: all(redis.Redis(port=p).cluster("info")["cluster_state"] == "ok" for p in self.ports),
                  20, "the cluster")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/"


SENTINEL_CONF = """sentinel monitor mymaster 127.0.0.1 {master} 2
sentinel down-after-milliseconds mymaster 1000
sentinel failover-timeout mymaster 4000
sentinel parallel-syncs mymaster 1
"""


class SentinelSet(Servers):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.master, self.replica = free_port(), free_port()
        self.sentinels = [free_port() for _ in range(3)]
        self.start(self.master)
        self.start(self.replica, "--replicaof", "127.0.0.1", str(self.master))
        for s in self.sentinels:
            self.start(s, "--sentinel", config=SENTINEL_CONF.format(master=self.master))
        try:
            _wait(self._agreed, 30, "the sentinels")
        except BaseException:
            self.stop()
            raise

    def _agreed(self) -> bool:
        for s in self.sentinels:
            r = redis.Redis(port=s, decode_responses=True)
            master = r.execute_command("SENTINEL", "MASTER", "mymaster")
            fields = dict(zip(master[::2], master[1::2], strict=True)) if isinstance(master, list) else master
            if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 1:
                return False
        link = redis.Redis(port=self.replica).info("replication")
        return bool(link.get("master_link_status") == "up")

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinels) + "/mymaster"

    def master_port(self) -> int:
        r = redis.Redis(port=self.sentinels[0], decode_responses=True)
        return int(r.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")[1])
