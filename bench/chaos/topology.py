"""The chaos run's Redis topologies beyond a single server (bench/servers.py's set-ups, every server with an AOF,
``appendfsync always``): a Sentinel set (1 master, 1 replica, 3 sentinels) and a Redis Cluster (3 masters, a replica
each), with the faults the run injects on them: a master SIGKILLed (its replica promoted, the old master back as a
replica) and, on the cluster, a reshard."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import redis
from redis.crc import key_slot

from bench import servers
from bench.servers import wait_for

AOF = ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")


class SentinelSet(servers.SentinelSet):
    def __init__(self, root: str) -> None:
        super().__init__(root, name="chaos", node_args=AOF)

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


class Cluster(servers.Cluster):
    """A Redis Cluster of 3 masters with a replica each (node timeout 2 s), every node with its AOF."""

    def __init__(self, root: str, masters: int = 3) -> None:
        super().__init__(root, masters=masters, replicas=1, node_args=AOF)

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
        self.start_node(old)
        wait_for(self.settled, 60, f"node {old} rejoining as a replica")
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
