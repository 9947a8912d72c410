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
    def __init__(self, directory: Path, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 2000,
                 full_coverage: bool = True) -> None:
        super().__init__(directory)
        self.ports = [free_port() for _ in range(masters * (1 + replicas))]
        for p in self.ports:
            self.start(p, "--cluster-enabled", "yes", "--cluster-config-file", str(directory / f"nodes-{p}.conf"),
                       "--cluster-node-timeout", str(node_timeout_ms),
                       "--cluster-require-full-coverage", "yes" if full_coverage else "no")
        try:
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                            "--cluster-replicas", str(replicas), "--cluster-yes"], check=True, capture_output=True,
                           timeout=30)
            _wait(self._settled, 30, "the cluster")
        except BaseException:
            self.stop()
            raise

    def _settled(self) -> bool:
        """Every node agrees the cluster is ok and sees every replica linked (a failover needs them in sync)."""
        for p in self.procs:
            r = redis.Redis(port=p, decode_responses=True)
            if r.cluster("info")["cluster_state"] != "ok":
                return False
            role = r.info("replication")
            if role["role"] == "slave" and role.get("master_link_status") != "up":
                return False
        return True

    def masters(self) -> dict[int, int | None]:
        """Each live master's port -> the port of one of its replicas (None: it has none), as the cluster says."""
        for p in self.procs:
            try:
                nodes = redis.Redis(port=p, decode_responses=True).execute_command("CLUSTER", "NODES")
            except (redis.RedisError, OSError):
                continue
            rows = [line.split() for line in str(nodes).splitlines() if line]
            by_id = {r[0]: int(r[1].split("@")[0].rsplit(":", 1)[1]) for r in rows}
            out: dict[int, int | None] = {by_id[r[0]]: None for r in rows if "master" in r[2] and "fail" not in r[2]}
            for r in rows:
                if "slave" in r[2] and "fail" not in r[2] and by_id.get(r[3]) in out:
                    out[by_id[r[3]]] = int(r[1].split("@")[0].rsplit(":", 1)[1])
            return out
        return {}

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


def node_ids(ports: list[int]) -> dict[int, str]:
    return {p: redis.Redis(port=p).execute_command("CLUSTER", "MYID").decode() for p in ports}


def owner_of(ports: list[int], slot: int) -> int:
    """The port of the master that serves ``slot`` (asked of each, so a node that redirects does not count)."""
    for p in ports:
        for start, end, master, *_ in redis.Redis(port=p).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(master[1])
    raise AssertionError(f"slot {slot} is not served")


def open_migration(ports: list[int], slot: int, to_port: int) -> int:
    """Mark ``slot`` MIGRATING on its owner and IMPORTING on ``to_port`` (keys not moved yet); the owner's port."""
    src, ids = owner_of(ports, slot), node_ids(ports)
    redis.Redis(port=to_port).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    redis.Redis(port=src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
    return src


def move_keys(src: int, to_port: int, slot: int, limit: int = 1000) -> int:
    """MIGRATE up to ``limit`` keys of ``slot`` from ``src`` to ``to_port``; how many moved."""
    keys = redis.Redis(port=src).execute_command("CLUSTER", "GETKEYSINSLOT", slot, limit)
    if keys:
        redis.Redis(port=src).execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
    return len(keys)


def close_migration(ports: list[int], slot: int, to_port: int) -> None:
    """Give ``slot`` to ``to_port`` on every master (its keys moved)."""
    owner = node_ids(ports)[to_port]
    for p in [to_port, *[q for q in ports if q != to_port]]:
        redis.Redis(port=p).execute_command("CLUSTER", "SETSLOT", slot, "NODE", owner)


def move_slot(ports: list[int], slot: int, to_port: int) -> None:
    """Reshard one slot: its keys and its ownership, as ``redis-cli --cluster reshard`` does for each slot."""
    src = open_migration(ports, slot, to_port)
    while move_keys(src, to_port, slot):
        pass
    close_migration(ports, slot, to_port)
