"""Private Redis set-ups beyond a single server, as real ``redis-server`` processes on free loopback ports (never the
shared Redis): a Redis Cluster and a Sentinel set (1 master, 1 replica, 3 sentinels). The tests (tests/topology.py),
the chaos run (bench/chaos/topology.py) and the cluster benchmarks all start theirs here."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

SENTINEL_CONF = """sentinel monitor {name} 127.0.0.1 {master} 2
sentinel down-after-milliseconds {name} 1000
sentinel failover-timeout {name} 4000
sentinel parallel-syncs {name} 1
"""


_handed_out: set[int] = set()
_pick = random.SystemRandom()  # not the seeded module state: test processes side by side must not draw alike


def free_port() -> int:
    """A free port not handed out before in this process, whose cluster bus port (+10000) is free too; both below
    Linux's ephemeral range (32768 and up), so an outgoing connection cannot take one before its server binds."""
    while True:
        port = _pick.randint(10000, 22000)
        if port not in _handed_out and all(_free(p) for p in (port, port + 10000)):
            _handed_out.add(port)
            return port


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout:g}s")


class Servers:
    """redis-server processes, each with its own directory (``redis-<port>``: its log, AOF and configs) and its own
    process group, stopped (SIGKILL) by ``stop``. A server's ``args`` come after the defaults (no RDB, no AOF), so
    they override them."""

    def __init__(self, directory: Path | str) -> None:
        self.dir = Path(directory)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def home(self, port: int) -> Path:
        """The directory of the server on ``port`` (its dump.rdb, AOF, log and configs)."""
        return self.dir / f"redis-{port}"

    def start(self, port: int, *args: str, config: str | None = None) -> None:
        d = self.home(port)
        d.mkdir(parents=True, exist_ok=True)
        cmd = ["redis-server"]
        if config is not None:
            path = d / "server.conf"
            if not path.exists():  # a sentinel rewrites its own config: a restart keeps what it learnt
                path.write_text(config)
            cmd.append(str(path))
        cmd += ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(d), "--logfile", str(d / "log"), *args]
        self.procs[port] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True)
        try:
            wait_for(lambda: redis.Redis(port=port, socket_timeout=1).ping(), 20, f"redis-server on {port}")
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
    """``masters`` masters with ``replicas`` replicas each; ``node_args`` go to every node (and to ``start_node``)."""

    def __init__(self, directory: Path | str, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 2000,
                 full_coverage: bool = True, node_args: tuple[str, ...] = ()) -> None:
        super().__init__(directory)
        self.node_args = (*node_args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-node-timeout", str(node_timeout_ms),
                          "--cluster-require-full-coverage", "yes" if full_coverage else "no")
        self.ports = [free_port() for _ in range(masters * (1 + replicas))]
        try:
            for p in self.ports:
                self.start_node(p)
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                            "--cluster-replicas", str(replicas), "--cluster-yes"], check=True, capture_output=True,
                           timeout=60)
            wait_for(self.settled, 60, "the cluster")
        except BaseException:
            self.stop()
            raise

    def start_node(self, port: int) -> None:
        """Start (or restart: it keeps its nodes.conf, so it rejoins) the node on ``port``."""
        self.start(port, *self.node_args)

    def settled(self) -> bool:
        """Every node agrees the cluster is ok and sees every replica linked (a failover needs them in sync)."""
        for p in self.procs:
            r = redis.Redis(port=p, decode_responses=True, socket_timeout=2)
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
                nodes = redis.Redis(port=p, decode_responses=True).execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER", "NODES")
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


class SentinelSet(Servers):
    """A master, its replica and 3 sentinels monitoring it as ``name``; ``node_args`` go to the master and replica."""

    def __init__(self, directory: Path | str, name: str = "mymaster", node_args: tuple[str, ...] = ()) -> None:
        super().__init__(directory)
        self.name, self.node_args = name, node_args
        self.master, self.replica = free_port(), free_port()
        self.sentinels = [free_port() for _ in range(3)]
        self.start(self.master, *node_args)
        self.start(self.replica, *node_args, "--replicaof", "127.0.0.1", str(self.master))
        for s in self.sentinels:
            self.start(s, "--sentinel", config=SENTINEL_CONF.format(name=name, master=self.master))
        try:
            wait_for(self._agreed, 30, "the sentinels")
        except BaseException:
            self.stop()
            raise

    def ask(self, *args: object) -> object:
        """A command's answer from the first sentinel that answers."""
        for s in self.sentinels:
            try:
                return redis.Redis(port=s, decode_responses=True, socket_timeout=2).execute_command(  # type: ignore[no-untyped-call]
                    *args)
            except (redis.RedisError, OSError):
                continue
        raise redis.ConnectionError("no sentinel answers")

    def _agreed(self) -> bool:
        for s in self.sentinels:
            r = redis.Redis(port=s, decode_responses=True, socket_timeout=2)
            master = r.execute_command("SENTINEL", "MASTER", self.name)  # type: ignore[no-untyped-call]
            fields = dict(zip(master[::2], master[1::2], strict=True)) if isinstance(master, list) else master
            if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 1:
                return False
        link = redis.Redis(port=self.replica, socket_timeout=2).info("replication")
        return bool(link.get("master_link_status") == "up")

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinels) + "/" + self.name

    def master_port(self) -> int:
        addr = self.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
        assert isinstance(addr, list)
        return int(addr[1])


@contextmanager
def single_and_cluster(directory: Path, replicas: int = 0) -> Iterator[list[tuple[str, str, bool]]]:
    """A single Redis (with ``replicas`` replicas) and a 3-master cluster (``replicas`` each), stopped on exit: the
    name, URL and is-a-cluster of each, for a benchmark that compares them."""
    single, cluster = Servers(directory / "single"), None
    try:
        port = free_port()
        single.start(port)
        for _ in range(replicas):
            single.start(free_port(), "--replicaof", "127.0.0.1", str(port))
        cluster = Cluster(directory / "cluster", replicas=replicas)
        yield [("single Redis", f"redis://127.0.0.1:{port}/0", False), ("3-master cluster", cluster.url, True)]
    finally:
        single.stop()
        if cluster is not None:
            cluster.stop()


def stop_workers(procs: Iterable[subprocess.Popen[bytes]], wait_s: float = 30) -> None:
    """SIGTERM each process still running, wait for all to exit (each a SIGKILL after ``wait_s``)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
