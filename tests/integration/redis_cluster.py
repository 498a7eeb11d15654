"""A real three-primary Redis Cluster on loopback, for the tests that run the service on one.

Started from the same ``redis-server`` binary ``scripts/services.py`` provides (``make test``
runs it first), each node in cluster mode in its own directory on a free port; slots are
split in three with ``CLUSTER ADDSLOTSRANGE`` and the nodes introduced with ``CLUSTER MEET``.
Stopped (and its directory removed) by ``stop``.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis as SyncRedis

SLOTS = 16384


def cluster_ports(n: int) -> list[int]:
    """``n`` ports free a moment ago, each with its cluster bus port (+10000) free too: Redis
    refuses cluster mode above 55535, so the kernel's ephemeral range will not do."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(20000, 45000)
        if p in ports or p + 10000 in ports or any(abs(p - q) == 10000 for q in ports):
            continue
        if all(_free(x) for x in (p, p + 10000)):
            ports.append(p)
    return ports


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def redis_server() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if found is None:
        raise RuntimeError("redis-server is not installed: run `make services-up` (scripts/services.py installs it)")
    return found


@dataclass
class RedisClusterNodes:
    base_dir: Path
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Any one node: the client discovers the others."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def node(self, port: int) -> SyncRedis:
        return SyncRedis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self, n: int = 3, timeout_s: float = 30.0) -> None:
        server = redis_server()
        self.ports = cluster_ports(n)
        for port in self.ports:
            d = self.base_dir / str(port)
            d.mkdir(parents=True, exist_ok=True)
            self.procs.append(
                subprocess.Popen(
                    [
                        server,
                        "--bind",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--dir",
                        str(d),
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                        "--appendonly",
                        "no",
                        "--save",
                        "",
                        "--daemonize",
                        "no",
                        "--logfile",
                        str(d / "redis.log"),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + timeout_s
        for port in self.ports:
            self._until(lambda p=port: self._answers(p), deadline, f"node {port} to answer PING")
        per = SLOTS // n
        for i, port in enumerate(self.ports):
            last = SLOTS - 1 if i == n - 1 else (i + 1) * per - 1
            self.node(port).execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)
        for port in self.ports[1:]:
            self.node(port).execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
        for port in self.ports:
            self._until(lambda p=port: self._ok(p, n), deadline, f"node {port} to see a healthy {n}-node cluster")

    def _answers(self, port: int) -> bool:
        try:
            return bool(self.node(port).ping())
        except OSError:
            return False
        except Exception:  # redis ConnectionError while it starts
            return False

    def _ok(self, port: int, n: int) -> bool:
        raw = self.node(port).execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        info = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == n

    def _until(self, cond: object, deadline: float, what: str) -> None:
        assert callable(cond)
        while not cond():
            if time.monotonic() > deadline:
                logs = "\n".join((self.base_dir / str(p) / "redis.log").read_text()[-2000:] for p in self.ports)
                raise RuntimeError(f"Redis Cluster: timed out waiting for {what}\n{logs}")
            time.sleep(0.05)

    def node_id(self, port: int) -> str:
        raw = self.node(port).execute_command("CLUSTER", "MYID")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def owner(self, slot: int) -> int:
        """The port of the primary serving ``slot``."""
        per = SLOTS // len(self.ports)
        return self.ports[min(slot // per, len(self.ports) - 1)]

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        shutil.rmtree(self.base_dir, ignore_errors=True)
