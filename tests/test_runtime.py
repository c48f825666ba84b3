"""Process-wide settings of :mod:`sphyr_jax.runtime`: the heap handed back.

Independent truth: the kernel's count of the process's resident pages
(``/proc/self/status``), around a heap fragmented on purpose.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sphyr_jax import runtime

STATUS = pathlib.Path("/proc/self/status")
BLOCKS, SIZE = 16_000, 4096  # 64 MB of small blocks: below glibc's mmap threshold

pytestmark = pytest.mark.skipif(
    not STATUS.exists() or runtime._malloc_trim() is None,
    reason="needs Linux's /proc and glibc's malloc_trim")


def _rss_mb() -> float:
    for line in STATUS.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def _fragment_heap():
    """Touch 64 MB of small heap blocks, then free all but the last one, which
    pins the heap's top: glibc's own free gives none of it back.  The heap's
    free pages are handed back first, so the new blocks are resident pages
    of their own, whatever ran in this process before.

    Returns:
        ``(rss_before_mb, free_last)``.
    """
    runtime.release_heap()
    before = _rss_mb()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(SIZE) for _ in range(BLOCKS)]
    for b in blocks:
        ctypes.memset(b, 1, SIZE)
    for b in blocks[:-1]:
        libc.free(b)
    return before, lambda: libc.free(blocks[-1])


def test_release_heap_returns_free_pages():
    before, done = _fragment_heap()
    try:
        held = _rss_mb()
        assert held - before > 48  # the freed blocks are still resident
        assert runtime.release_heap()
        assert held - _rss_mb() > 32  # at least half of the 64 MB
    finally:
        done()


def test_a_compilation_hands_the_free_pages_back():
    runtime.release_memory_after_compiles()
    try:
        _, done = _fragment_heap()
        try:
            held = _rss_mb()
            # A program no test has compiled yet (a new constant).
            value = jax.jit(lambda x: x * 7.0 + np.pi ** 3)(jnp.arange(3.0))
            np.testing.assert_allclose(np.asarray(value), np.arange(3.0) * 7.0 + np.pi ** 3)
            assert held - _rss_mb() > 32  # at least half of the 64 MB
        finally:
            done()
    finally:
        jax.monitoring.unregister_event_duration_listener(runtime._trim_after_compile)
        runtime._trimming = False
