"""The chaos run's Redis topologies beyond a single server, as private ``redis-server`` processes on loopback ports:
a Sentinel set (1 master, 1 replica, 3 sentinels) and a Redis Cluster (3 masters, a replica each), with the faults
the run injects on them: a master SIGKILLed (its replica promoted, the old master back as a replica) and, on the
cluster, a reshard. Every server keeps an AOF (``appendfsync always``)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.crc import key_slot

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


class Cluster(Servers):
    """A Redis Cluster of 3 masters with a replica each (node timeout 2 s), every node with its AOF."""

    def __init__(self, root: str, masters: int = 3) -> None:
        super().__init__(root)
        self.ports = [_bus_free_port() for _ in range(masters * 2)]
        try:
            for p in self.ports:
                self._node(p)
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                            "--cluster-replicas", "1", "--cluster-yes"], check=True, capture_output=True, timeout=60)
            wait_for(self._settled, 60, "the cluster settling")
        except BaseException:
            self.stop()
            raise

    def _node(self, port: int) -> None:
        self.start(port, *AOF, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                   "--cluster-node-timeout", "2000")

    def _settled(self) -> bool:
        """Every node says the cluster is ok and every replica is linked to its master."""
        for p in self.procs:
            r = redis.Redis(port=p, decode_responses=True, socket_timeout=2)
            if r.cluster("info")["cluster_state"] != "ok":
                return False
            role = r.info("replication")
            if role["role"] == "slave" and role.get("master_link_status") != "up":
                return False
        return True

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/"

    def owner(self, slot: int) -> int:
        """The port of the master serving ``slot``, as a live node says."""
        for p in self.procs:
            try:
                ranges = _cmd(p, "CLUSTER", "SLOTS")
            except (redis.RedisError, OSError):
                continue
            for start, end, master, *_ in ranges:
                if start <= slot <= end:
                    return int(master[1])
        raise redis.ConnectionError(f"no live node serves slot {slot}")

    def client(self, key: str) -> redis.Redis:
        """A client of the master that holds ``key`` (the queue's keys share one slot)."""
        return redis.Redis(port=self.owner(key_slot(key.encode())), socket_timeout=5, socket_connect_timeout=2)

    def kill_master(self, key: str) -> str:
        """SIGKILL the master of ``key``'s slot; wait until its replica serves the slot; start the old node again
        (it rejoins as a replica of the promoted one)."""
        slot = key_slot(key.encode())
        old = self.owner(slot)
        t0 = time.monotonic()
        self.kill(old)
        wait_for(lambda: self.owner(slot) != old and self._ok(), 60, f"a replica taking slot {slot} over")
        promoted = time.monotonic() - t0
        self._node(old)
        wait_for(self._settled, 60, f"node {old} rejoining as a replica")
        return f"master {old} SIGKILLed, {self.owner(slot)} promoted in {promoted:.2f}s"

    def _ok(self) -> bool:
        return all(redis.Redis(port=p, decode_responses=True, socket_timeout=2).cluster("info")["cluster_state"]
                   == "ok" for p in self.procs)

    def reshard(self, key: str, slots: int = 100) -> str:
        """``redis-cli --cluster reshard`` of ``slots`` slots of ``key``'s master to another master, then ``key``'s
        own slot moved the same way (MIGRATING/IMPORTING, MIGRATE of its keys, SETSLOT NODE)."""
        slot = key_slot(key.encode())
        src = self.owner(slot)
        ids = {p: _cmd(p, "CLUSTER", "MYID").decode() for p in self.procs}
        masters = {self.owner(s) for s in (0, 8000, 16383)} | {src}
        dst = next(p for p in sorted(masters) if p != src)
        t0 = time.monotonic()
        subprocess.run(["redis-cli", "--cluster", "reshard", f"127.0.0.1:{src}", "--cluster-from", ids[src],
                        "--cluster-to", ids[dst], "--cluster-slots", str(slots), "--cluster-yes"], check=True,
                       capture_output=True, timeout=120)
        if self.owner(slot) == src:
            _move_slot(src, dst, slot, ids, [p for p in sorted(masters)])
        return f"{slots} slots and slot {slot} moved from {src} to {dst} in {time.monotonic() - t0:.2f}s"


def _bus_free_port() -> int:
    """A free port whose cluster bus port (+10000) is a valid free port too."""
    while True:
        port = free_port()
        if port < 55536 and _free(port + 10000):
            return port


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cmd(port: int, *args: object) -> Any:
    return redis.Redis(port=port, socket_timeout=10).execute_command(*args)  # type: ignore[no-untyped-call]


def _move_slot(src: int, dst: int, slot: int, ids: dict[int, str], masters: list[int]) -> None:
    """Reshard one slot as ``redis-cli --cluster reshard`` does for each: open, migrate the keys, give it away."""
    _cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    _cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
    while keys := _cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, 100):
        _cmd(src, "MIGRATE", "127.0.0.1", dst, "", 0, 10000, "KEYS", *keys)
    for p in [dst, *[m for m in masters if m != dst]]:
        _cmd(p, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst])
