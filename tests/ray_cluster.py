"""A two-node Ray cluster on loopback addresses, started and stopped by a test.

The head listens on 127.0.0.2 and the second node on 127.0.0.3 (Ray rewrites
127.0.0.1 into the machine's routable address, any other loopback address is
kept), every port is chosen free (so other clusters on the machine never
collide), token authentication with a token of this cluster's own keeps other
drivers out, and each node is a ``ray start --block`` child process stopped by
SIGTERM to that process alone (never ``ray stop``, which stops every Ray
process on the machine).  The nodes (and so the workers) get the environment
given, e.g. this checkout on the path and the suite's compilation cache
(:func:`tests.conftest.child_env`).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HEAD_IP = "127.0.0.2"
NODE_IP = "127.0.0.3"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_ports() -> list[str]:
    names = ("dashboard-port", "node-manager-port", "object-manager-port",
             "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
             "runtime-env-agent-port", "metrics-export-port")
    return [f"--{name}={_free_port()}" for name in names]


class LocalCluster:
    """A head and a second node (see the module docstring).

    Args:
        env: the nodes' environment (the authentication variables are added).
        cpus_per_node: CPUs each node offers (one task each).

    Attributes:
        address: the head's ``HOST:PORT``.
        env: the environment of the nodes (and of any driver process).
        node_pids: the ``ray start --block`` processes.
    """

    def __init__(self, env: dict, cpus_per_node: int = 1):
        self.cpus = cpus_per_node
        self.tmp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # short: socket paths
        self.ray = str(pathlib.Path(sys.executable).with_name("ray"))
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
                    "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_IMPORT_WARNING": "1"}
        self.env.pop("RAY_ADDRESS", None)
        self.address = f"{HEAD_IP}:{_free_port()}"
        self.nodes: list[subprocess.Popen] = []

    @property
    def node_pids(self) -> list[int]:
        return [p.pid for p in self.nodes]

    def _start(self, args: list[str], log: str) -> subprocess.Popen:
        with open(os.path.join(self.tmp, log), "w") as out:
            process = subprocess.Popen(
                [self.ray, "start", "--block", "--disable-usage-stats", f"--num-cpus={self.cpus}",
                 "--num-gpus=0", "--object-store-memory=200000000", *_node_ports(), *args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.nodes.append(process)
        return process

    def start(self, timeout: float = 120.0) -> LocalCluster:
        port = self.address.rsplit(":", 1)[1]
        head = self._start(["--head", f"--port={port}", f"--node-ip-address={HEAD_IP}",
                            "--include-dashboard=false", f"--temp-dir={self.tmp}/r"],
                           "head.log")
        deadline = time.monotonic() + timeout
        while subprocess.run([self.ray, "status", f"--address={self.address}"], env=self.env,
                             capture_output=True).returncode != 0:
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not start:\n{self.log('head.log')}")
            time.sleep(0.5)
        self._start([f"--address={self.address}", f"--node-ip-address={NODE_IP}"], "node.log")
        return self

    def wait_for_nodes(self, ray_module, count: int = 2, timeout: float = 120.0) -> None:
        """Block until ``count`` nodes are alive (needs a connected driver)."""
        deadline = time.monotonic() + timeout
        while sum(n["Alive"] for n in ray_module.nodes()) < count:
            if any(p.poll() is not None for p in self.nodes) or time.monotonic() > deadline:
                raise RuntimeError(f"the second node did not join:\n{self.log('node.log')}")
            time.sleep(0.2)

    def connect(self):
        """Connect this process (the driver) to the cluster; returns the ``ray`` module.

        Ray reads its authentication mode when imported, so the cluster's is set
        in this process's environment first (and ``RAY_ADDRESS``, which would win
        over the address given, removed); where an earlier test of the process
        imported Ray already, Ray's own reset makes it read the mode again.
        """
        imported = "ray" in sys.modules
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED"):
            os.environ[key] = self.env[key]
        os.environ.pop("RAY_ADDRESS", None)
        import ray

        if imported:  # an earlier test of this process imported Ray: it re-reads the mode
            from ray._private.authentication_test_utils import reset_auth_token_state

            reset_auth_token_state()
        return ray

    def log(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return pathlib.Path(self.tmp, name).read_text()[-4000:]
        return ""

    def task_workers(self, title: str = "ray::_run_task") -> list[int]:
        """Worker processes of this cluster running a task (by the process title Ray sets)."""
        import psutil

        found = []
        for pid in self.node_pids:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if " ".join(child.cmdline()).startswith(title):
                            found.append(child.pid)
        return found

    def stop(self) -> None:
        for process in reversed(self.nodes):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)  # that process alone: it stops its children
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)  # its own session, started above
                    process.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
