"""Where the tasks of a long generation run: this process, or a Ray cluster.

A task is a plain function of picklable arguments (a *shard function*, e.g.
:func:`sphyr_jax.data.corpus.solve_task`); an engine runs many of them and
hands back each result.  Both engines run the same functions, so what a run
writes never depends on the engine: a driver submits tasks, waits for any to
finish and consumes the results in its own (index) order.

* :class:`LocalEngine` runs tasks in this process, on a small thread pool
  (``workers`` threads; JAX releases the interpreter while it computes).
* :class:`RayEngine` runs them as Ray tasks (the ``[cluster]`` extra): each
  takes one CPU, and a task whose worker process dies is run again by Ray
  (``max_retries``).  Start a cluster with ``ray start --head`` on one machine
  and ``ray start --address=HEAD:PORT`` on the others, then connect with
  ``RayEngine("auto")`` (or the head's address) from any of them.

Every worker computes with ``float64`` and one JAX device per task, and keeps
its compiled programs in JAX's persistent compilation cache
(:func:`sphyr_jax.runtime.enable_compilation_cache`), so a fresh worker loads
them instead of compiling.
"""

from __future__ import annotations

import abc
import concurrent.futures
import os
from collections.abc import Callable, Sequence
from typing import Any

from sphyr_jax.errors import UserInputError

ENGINES = ("local", "ray")


class Engine(abc.ABC):
    """Runs shard functions; results come back through the handles :meth:`submit` gives."""

    slots: int
    """Tasks worth keeping in flight (the engine's parallelism)."""

    @abc.abstractmethod
    def submit(self, fn: Callable, *args) -> Any:
        """Start ``fn(*args)``; returns a handle."""

    @abc.abstractmethod
    def wait(self, handles: Sequence) -> list:
        """Block until at least one of ``handles`` is finished; returns the finished ones."""

    @abc.abstractmethod
    def result(self, handle) -> Any:
        """The value of a finished task (its exception is raised here)."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the engine's resources."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalEngine(Engine):
    """Tasks run in this process, ``workers`` at a time.

    Args:
        workers: threads running tasks (1: one task at a time).
    """

    def __init__(self, workers: int = 1):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self.slots = workers
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                           thread_name_prefix="sphyr-task")

    def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        return self._pool.submit(fn, *args)

    def wait(self, handles: Sequence) -> list:
        done, _ = concurrent.futures.wait(list(handles),
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        return [h for h in handles if h in done]

    def result(self, handle: concurrent.futures.Future) -> Any:
        return handle.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


_WORKER_READY = False


def prepare_worker() -> None:
    """What a worker process needs before its first task: float64 and the compilation cache.

    Idempotent; a worker started by Ray runs it before each task.
    """
    global _WORKER_READY
    if _WORKER_READY:
        return
    from sphyr_jax.runtime import enable_compilation_cache, enable_x64

    enable_x64()
    enable_compilation_cache(None)  # $SPHYR_JAX_COMPILATION_CACHE, else the user's cache
    _WORKER_READY = True


def _run_task(fn: Callable, *args) -> Any:
    prepare_worker()
    return fn(*args)


class RayEngine(Engine):
    """Tasks run on a Ray cluster, one CPU each, retried when their worker dies.

    Args:
        address: the cluster: ``"auto"`` (the one started on this machine),
            ``"HOST:PORT"`` of its head, or None for a throw-away cluster in
            this process (``ray.init()``).
        max_retries: runs of a task whose worker process died, beyond the first.
        in_flight: tasks kept in flight (default: twice the cluster's CPUs).
        node_ip_address: this machine's address on the cluster's network,
            when Ray cannot tell it (e.g. a cluster on a loopback address
            other than 127.0.0.1).
        env_vars: environment of the worker processes (e.g. ``PYTHONPATH``);
            default: the nodes' own.

    Raises:
        UserInputError: ray is not installed, or the cluster cannot be reached.
    """

    def __init__(self, address: str | None = "auto", *, max_retries: int = 3,
                 in_flight: int | None = None, node_ip_address: str | None = None,
                 env_vars: dict | None = None):
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise UserInputError("--engine=ray needs Ray: pip install 'sphyr-jax[cluster]'"
                                 ) from exc
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            kwargs: dict = {"address": address, "logging_level": "ERROR",
                            "log_to_driver": False}
            if node_ip_address:
                kwargs["_node_ip_address"] = node_ip_address
            if env_vars:
                kwargs["runtime_env"] = {"env_vars": dict(env_vars)}
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserInputError(f"cannot reach the Ray cluster at {address!r}: {exc}"
                                     ) from exc
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = in_flight or max(2, 2 * cpus)
        self._remote = ray.remote(num_cpus=1, max_retries=max_retries)(_run_task)

    def submit(self, fn: Callable, *args):
        return self._remote.remote(fn, *args)

    def wait(self, handles: Sequence) -> list:
        ready, _ = self._ray.wait(list(handles), num_returns=1)
        return ready

    def result(self, handle) -> Any:
        return self._ray.get(handle)

    def close(self) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


def make_engine(name: str = "local", *, ray_address: str | None = "auto",
                workers: int | None = None) -> Engine:
    """An engine by name: ``"local"`` (``workers`` threads, default 1) or ``"ray"``.

    Raises:
        UserInputError: an unknown name, or Ray cannot be used.
    """
    if name == "local":
        return LocalEngine(workers or 1)
    if name == "ray":
        return RayEngine(ray_address or "auto",
                         env_vars=_worker_env() if ray_address is None else None)
    raise UserInputError(f"unknown engine {name!r}; engines: {', '.join(ENGINES)}")


def _worker_env() -> dict:
    """The environment a throw-away cluster's workers need to import this sphyr_jax."""
    import sphyr_jax

    root = os.path.dirname(os.path.dirname(os.path.abspath(sphyr_jax.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}
