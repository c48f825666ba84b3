"""Data parallelism over local devices with ``jax.sharding``.

Batched work (SIMP run pools, swap polishes, structural analyses) has a leading
batch axis of independent samples.  :func:`batch_call` runs a batch-first
function under ``shard_map`` on a 1-D mesh over the local devices, padding the
batch to a multiple of the device count inside and removing the padding
afterwards, so callers never see the device count.  With one device it is a
plain ``jit``.

On a CPU, JAX exposes one device unless told otherwise; the app (and the
benchmarks) set ``--xla_force_host_platform_device_count`` to the number of
cores before JAX starts, see :func:`configure_host_devices`.  Multi-host runs
call ``jax.distributed.initialize()`` first; each process then shards over its
own local devices.
"""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from sphyr_jax.runtime import bounded_cache

BATCH_AXIS = "batch"


def configure_host_devices(count: int | None = None) -> None:
    """Ask XLA for ``count`` CPU devices (default: one per core).

    Must run before JAX initialises its backends; does nothing if the flag is
    already present in ``XLA_FLAGS``.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return
    count = count or os.cpu_count() or 1
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def device_count(num_devices: int | None = None) -> int:
    """Devices a batch is spread over: all local ones unless limited."""
    available = jax.local_device_count()
    if num_devices is None or num_devices <= 0:
        return available
    return max(1, min(int(num_devices), available))


@bounded_cache(maxsize=8)
def local_mesh(num_devices: int) -> Mesh:
    """1-D mesh over the first ``num_devices`` local devices."""
    return Mesh(np.array(jax.local_devices()[:num_devices]), (BATCH_AXIS,))


@bounded_cache(maxsize=64)
def _compiled(fn, static_items: tuple, num_devices: int):
    f = functools.partial(fn, **dict(static_items))
    if num_devices == 1:
        return jax.jit(f)
    spec = PartitionSpec(BATCH_AXIS)
    return jax.jit(jax.shard_map(f, mesh=local_mesh(num_devices), in_specs=spec,
                                 out_specs=spec, check_vma=False))


def _pad_to(x, size: int):
    n = x.shape[0]
    if n == size:
        return x
    # Repeat real entries: padding must stay a well-posed problem.
    return x[np.arange(size) % n]


def bucket_size(n: int, num_devices: int = 1) -> int:
    """Padded batch size: the next power of two >= n, a multiple of the devices.

    Batched programs compile once per bucket, so a new batch size inside a
    bucket never compiles again (at most half of a batch is padding).
    """
    size = 1 << max(0, int(n) - 1).bit_length()
    return -(-size // num_devices) * num_devices


def batch_call(fn, *args, num_devices: int | None = None, **static):
    """Call a batch-first ``fn(*args, **static)`` with its batch split over devices.

    The batch is padded (by repeating real entries) up to :func:`bucket_size`,
    so ``fn`` compiles once per bucket, and the padding is removed from the
    outputs.

    Args:
        fn: pure function whose array arguments and outputs all have the same
            leading batch axis (outputs may be any PyTree of such arrays).
        *args: PyTrees of arrays with a common leading batch size.
        num_devices: devices to use (default all local devices).
        **static: hashable keyword arguments passed through unchanged.

    Returns:
        ``fn``'s output for the batch, unpadded.
    """
    ndev = device_count(num_devices)
    leaves = jax.tree.leaves(args)
    nb = leaves[0].shape[0]
    ndev = max(1, min(ndev, nb))
    call = _compiled(fn, tuple(sorted(static.items())), ndev)
    size = bucket_size(nb, ndev)
    if size == nb:
        return call(*args)
    out = call(*jax.tree.map(lambda a: _pad_to(a, size), args))
    return jax.tree.map(lambda a: a[:nb], out)
