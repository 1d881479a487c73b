"""Real redis-server processes for tests: standalone, Sentinel and a 3-node Cluster on free ports."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or "redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below 65536."""
    for _ in range(200):
        port = random.randint(20000, 55000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _wait_for_ping(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(64).startswith((b"+PONG", b"-NOAUTH")):  # up (asking for a password)
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"redis on port {port} did not answer PING")


class RedisServer:
    """One redis-server process that a test can stop and start again on the same port."""

    def __init__(self, workdir: Path, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.workdir), *self.extra]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_ping(self.port)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would end it: no shutdown save."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


class SentinelServer(RedisServer):
    """A sentinel watching `master` under the service name `gateway`."""

    def __init__(self, workdir: Path, master: RedisServer) -> None:
        super().__init__(workdir)
        self.master = master

    def start(self) -> SentinelServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor gateway 127.0.0.1 {self.master.port} 1\n"
        )
        self.process = subprocess.Popen([REDIS_SERVER, str(conf), "--sentinel"], stdout=subprocess.DEVNULL)
        _wait_for_ping(self.port)
        return self


def start_cluster(workdir: Path, nodes: int = 3) -> list[RedisServer]:
    servers = [
        RedisServer(
            workdir / f"node{i}",
            port=free_cluster_port(),
            extra=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
        )
        for i in range(nodes)
    ]
    for server in servers:
        server.start()
    addresses = [f"127.0.0.1:{s.port}" for s in servers]
    subprocess.run(
        ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        info = subprocess.run(
            ["redis-cli", "-p", str(servers[0].port), "cluster", "info"], capture_output=True, text=True, timeout=5
        ).stdout
        if "cluster_state:ok" in info:
            return servers
        time.sleep(0.1)
    raise RuntimeError("redis cluster did not become ready")
