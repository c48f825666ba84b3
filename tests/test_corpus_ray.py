"""A corpus made on a local two-node Ray cluster: the in-process engine's bytes, whatever
dies on the way (a worker mid-task, the driver with SIGKILL)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import IN_CI, child_env

from sphyr_jax.data import corpus as cp
from sphyr_jax.data.generate_v2 import QUICK_V2_OPTIONS

# Ray reads its authentication mode when imported: it is imported once the cluster's is set.
HAVE_RAY = importlib.util.find_spec("ray") is not None
if IN_CI and not HAVE_RAY:
    raise ImportError("ray (the [cluster] extra) is part of the test install")
pytestmark = pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (the [cluster] extra)")

SPEC = cp.CorpusSpec(12, grid_size=6, seed=7, options=QUICK_V2_OPTIONS, format="parquet",
                     batch_size=4, window=4, optima_samples=2, file_samples=4)


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != cp.MANIFEST}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The corpus made in this process, one task at a time."""
    folder = tmp_path_factory.mktemp("local")
    cp.build_corpus(SPEC, folder)
    return _files(folder)


@pytest.fixture(scope="module")
def cluster():
    from ray_cluster import HEAD_IP, LocalCluster

    nodes = LocalCluster(child_env()).start()
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS",
                                             "RAY_USAGE_STATS_ENABLED")}
    try:
        ray = nodes.connect()
        from sphyr_jax.data.engines import RayEngine

        engine = RayEngine(nodes.address, node_ip_address=HEAD_IP)
        nodes.wait_for_nodes(ray)
        yield nodes, engine, ray
        engine.close()
    finally:
        nodes.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_two_nodes_write_the_local_bytes_when_a_worker_is_killed(cluster, reference, tmp_path):
    nodes, engine, ray = cluster
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.2",
                                                                             "127.0.0.3"}
    killed: list[int] = []
    stop = threading.Event()

    def kill_one_worker():
        while not stop.is_set() and not killed:
            busy = nodes.task_workers()
            if busy:
                os.kill(busy[0], signal.SIGKILL)  # a worker of the cluster started above
                killed.append(busy[0])
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_one_worker, daemon=True)
    watcher.start()
    try:
        summary = cp.build_corpus(SPEC, tmp_path / "ray", engine=engine)
    finally:
        stop.set()
        watcher.join()
    assert killed, "no task was seen running"
    assert summary["kept"] == 12
    assert _files(tmp_path / "ray") == reference


DRIVER = textwrap.dedent("""
    import sys
    from sphyr_jax.runtime import enable_x64
    enable_x64()
    from sphyr_jax.data import corpus as cp
    from sphyr_jax.data.engines import RayEngine
    from sphyr_jax.data.generate_v2 import QUICK_V2_OPTIONS
    spec = cp.CorpusSpec(12, grid_size=6, seed=7, options=QUICK_V2_OPTIONS, format="parquet",
                         batch_size=4, window=4, optima_samples=2, file_samples=4)
    engine = RayEngine(sys.argv[2], node_ip_address="127.0.0.2", in_flight=1)
    cp.build_corpus(spec, sys.argv[1], engine=engine)
""")


def test_a_driver_killed_with_sigkill_and_run_again_writes_the_same_bytes(cluster, reference,
                                                                          tmp_path):
    nodes, engine, _ = cluster
    out = tmp_path / "driven"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(out), nodes.address],
                              env=nodes.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    manifest = out / cp.MANIFEST
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        if manifest.is_file() and json.loads(manifest.read_text())["files_done"] >= 1:
            break
        time.sleep(0.05)
    assert driver.poll() is None, driver.stdout.read().decode()[-3000:]
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    state = json.loads(manifest.read_text())
    assert 1 <= state["files_done"] < 3 and not state["complete"]
    summary = cp.build_corpus(SPEC, out, engine=engine)
    assert summary["tasks"]["optima"] < 6  # the finished file's optima are not redone
    assert _files(out) == reference
