"""The chaos run's Redis topologies beyond a single server: a Sentinel set (1 master, 1 replica, 3 sentinels) as
private ``redis-server`` processes on loopback ports, with the master kill the run injects (SIGKILL, a replica
promoted, the old master back as a replica). Every server keeps an AOF (``appendfsync always``)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import redis

from ringfence.redis.embedded import free_port

AOF = ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")
SENTINEL_CONF = """sentinel monitor chaos 127.0.0.1 {master} 2
sentinel down-after-milliseconds chaos 1000
sentinel failover-timeout chaos 4000
sentinel parallel-syncs chaos 1
"""


def wait_for(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not happen within {timeout:g}s")


class Servers:
    """redis-server processes, each in its own process group, with its own directory and log."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, port: int, *args: str, config: str | None = None) -> None:
        d = os.path.join(self.root, f"redis-{port}")
        os.makedirs(d, exist_ok=True)
        cmd = ["redis-server"]
        if config is not None:
            path = os.path.join(d, "sentinel.conf")
            if not os.path.exists(path):  # a sentinel rewrites its own config: keep what it learnt
                with open(path, "w") as f:
                    f.write(config)
            cmd.append(path)
        cmd += ["--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--logfile", os.path.join(d, "log"), *args]
        self.procs[port] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True)
        wait_for(lambda: redis.Redis(port=port, socket_timeout=1).ping(), 20, f"redis-server on {port} answering")

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)


class SentinelSet(Servers):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.master, self.replica = free_port(), free_port()
        self.sentinels = [free_port() for _ in range(3)]
        try:
            self.start(self.master, *AOF)
            self.start(self.replica, *AOF, "--replicaof", "127.0.0.1", str(self.master))
            for s in self.sentinels:
                self.start(s, "--sentinel", config=SENTINEL_CONF.format(master=self.master))
            wait_for(self._agreed, 30, "the sentinels agreeing on the master and its replica")
        except BaseException:
            self.stop()
            raise

    def _ask(self, *args: object) -> object:
        for s in self.sentinels:
            try:
                return redis.Redis(port=s, decode_responses=True, socket_timeout=2).execute_command(*args)  # type: ignore[no-untyped-call]
            except (redis.RedisError, OSError):
                continue
        raise redis.ConnectionError("no sentinel answers")

    def _agreed(self) -> bool:
        master = self._ask("SENTINEL", "MASTER", "chaos")
        fields = dict(zip(master[::2], master[1::2], strict=True)) if isinstance(master, list) else master
        assert isinstance(fields, dict)
        if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 1:
            return False
        link = redis.Redis(port=self.replica, socket_timeout=2).info("replication")
        return bool(link.get("master_link_status") == "up")

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinels) + "/chaos"

    def master_port(self) -> int:
        addr = self._ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "chaos")
        assert isinstance(addr, list)
        return int(addr[1])

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.master_port(), socket_timeout=5, socket_connect_timeout=2)

    def kill_master(self) -> str:
        """SIGKILL the master; wait until the sentinels promote the replica; start the old master again (its AOF)
        as a replica of the new one, so the next kill has a replica to promote."""
        old = self.master_port()
        t0 = time.monotonic()
        self.kill(old)
        wait_for(lambda: self.master_port() != old, 30, "the sentinels promoting the replica")
        promoted = time.monotonic() - t0
        new = self.master_port()
        self.start(old, *AOF, "--replicaof", "127.0.0.1", str(new))
        self.master, self.replica = new, old
        wait_for(lambda: redis.Redis(port=old, socket_timeout=2).info("replication").get("master_link_status")
                 == "up", 30, f"the old master {old} syncing as a replica")
        return f"master {old} SIGKILLed, {new} promoted in {promoted:.2f}s"
