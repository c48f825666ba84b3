"""Process-wide JAX settings, applied only when asked for.

Importing sphyr_jax never changes JAX's global configuration; programs (the
app, the experiments, the tests, a notebook's first cell) call these once at
start-up:

* :func:`enable_x64` — float64 is required (E_min = 1e-9 makes the stiffness
  matrix ill-conditioned far beyond float32).
* :func:`enable_compilation_cache` — JAX's persistent compilation cache, so a
  new process loads compiled programs from disk instead of compiling them.
* :func:`release_memory_after_compiles` — hand the C heap's free pages back
  to the system after every XLA compilation (a compilation's scratch memory
  otherwise stays in the process for good).

It also keeps the library's in-memory caches in one registry: every cache
that grows with distinct inputs (grid shapes, solvers, static options) is a
:class:`BoundedCache` made by :func:`bounded_cache`, a least-recently-used
cache with a bound on its entries (:func:`cache_limits` lists them,
:func:`set_cache_limit` changes one, :func:`cache_sizes` counts their entries),
and :func:`clear_caches` empties them
all together with JAX's caches of compiled programs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import pathlib
from collections.abc import Callable

import jax

CACHE_ENV = "SPHYR_JAX_COMPILATION_CACHE"


def require_x64() -> None:
    """Raise a clear error unless JAX's float64 mode is on."""
    if not jax.config.jax_enable_x64:
        raise RuntimeError(
            "sphyr_jax needs float64 (E_min = 1e-9 makes the stiffness matrix "
            "ill-conditioned): call jax.config.update('jax_enable_x64', True) "
            "or sphyr_jax.enable_x64() before using it."
        )


def enable_x64() -> None:
    """Turn on JAX's float64 mode (call once, at program start)."""
    jax.config.update("jax_enable_x64", True)


def default_compilation_cache() -> str:
    """``$SPHYR_JAX_COMPILATION_CACHE`` if set, else ``~/.cache/sphyr_jax/jax``."""
    return os.environ.get(CACHE_ENV) or str(pathlib.Path.home() / ".cache" / "sphyr_jax" / "jax")


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str | None:
    """Keep every compiled program in JAX's persistent compilation cache.

    A fresh process then loads sphyr_jax's programs from disk instead of
    compiling them.  Results are unaffected.

    Args:
        path: cache folder (created if missing); None: :func:`default_compilation_cache`;
            ``""``: leave the cache off.

    Returns:
        The folder in use, or None when disabled.
    """
    path = default_compilation_cache() if path is None else str(path)
    if not path:
        return None
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    # sphyr_jax's programs are small: cache them all, however fast they compiled.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileCounter:
    """Count XLA compilations (and their seconds) while the context is open.

    Uses JAX's own monitoring events: every backend compilation reports its
    duration, whether or not the persistent cache then serves it.

    Examples:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from sphyr_jax.runtime import CompileCounter
        >>> double = jax.jit(lambda x: 2 * x)
        >>> x, y = jnp.ones(3), jnp.zeros(3)
        >>> with CompileCounter() as cc:
        ...     _ = double(x), double(y)  # one shape: one compilation
        >>> cc.count
        1
    """

    def __init__(self):
        self.count = 0
        self.seconds = 0.0
        self.cache_hits = 0

    def _on_duration(self, event: str, duration: float, **_):
        if event == BACKEND_COMPILE_EVENT:
            self.count += 1
            self.seconds += duration

    def _on_event(self, event: str, **_):
        if event == CACHE_HIT_EVENT:
            self.cache_hits += 1

    def __enter__(self) -> CompileCounter:
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_heap() -> bool:
    """Return the C heap's free pages to the system now (glibc ``malloc_trim``).

    Returns:
        Whether the C library could (False where it has no ``malloc_trim``).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


_trimming = False  # whether the listener is registered


def _trim_after_compile(event: str, duration: float, **_) -> None:
    if event == BACKEND_COMPILE_EVENT:
        release_heap()


def release_memory_after_compiles() -> None:
    """After every XLA compilation, give the heap's free pages back (once per
    process, however often called).

    XLA's CPU compiler builds every kernel of a program before it frees them
    all, and glibc keeps the freed pages in its per-thread heaps: after a
    large compilation (the voxel yardstick's) the process stays larger by
    most of the compiler's scratch memory for the rest of its life, and the
    programs' buffers then grow on top.  Trimming costs a pass over the heap
    per compilation and changes no result (``benchmarks/optimum3d.py`` prints
    the peak memory).
    """
    global _trimming
    if not _trimming:
        jax.monitoring.register_event_duration_secs_listener(_trim_after_compile)
        _trimming = True


# ----------------------------------------------------------------------------
# Bounded caches, released together.

_CACHES: dict[str, BoundedCache] = {}


class BoundedCache:
    """A function's results kept in a least-recently-used cache of bounded size.

    Calls go to :func:`functools.lru_cache` (arguments must be hashable); the
    bound can be changed later (:meth:`resize`, or :func:`set_cache_limit` by
    name), which empties the cache.

    Attributes:
        name: ``module.qualname`` of the function, the cache's name in the
            registry.
        maxsize: the bound on entries.
    """

    def __init__(self, fn: Callable, maxsize: int):
        functools.update_wrapper(self, fn)
        self.name = f"{fn.__module__}.{fn.__qualname__}"
        self._fn = fn
        self.maxsize = 0
        self.resize(maxsize)

    def __call__(self, *args, **kwargs):
        return self._cached(*args, **kwargs)

    def resize(self, maxsize: int) -> None:
        """Bound the cache to ``maxsize`` entries (at least 1); it starts empty."""
        maxsize = int(maxsize)
        if maxsize < 1:
            raise ValueError(f"cache {self.name}: the bound must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._cached = functools.lru_cache(maxsize=maxsize)(self._fn)

    def cache_clear(self) -> None:
        """Drop every entry."""
        self._cached.cache_clear()

    def cache_info(self):
        """``functools``' hits, misses, bound and current size."""
        return self._cached.cache_info()


def bounded_cache(maxsize: int) -> Callable[[Callable], BoundedCache]:
    """Decorator: cache a function's results in a registered :class:`BoundedCache`.

    Args:
        maxsize: bound on the entries (distinct argument tuples) kept.
    """

    def wrap(fn: Callable) -> BoundedCache:
        cache = BoundedCache(fn, maxsize)
        _CACHES[cache.name] = cache
        return cache

    return wrap


def cache_limits() -> dict[str, int]:
    """The bound of every registered cache, by name (``module.qualname``)."""
    return {name: cache.maxsize for name, cache in sorted(_CACHES.items())}


def set_cache_limit(name: str, maxsize: int) -> None:
    """Change the bound of one registered cache (emptying it).

    Raises:
        KeyError: no cache of that name (:func:`cache_limits` lists them).
    """
    if name not in _CACHES:
        raise KeyError(f"no cache named {name!r}; known: {', '.join(sorted(_CACHES))}")
    _CACHES[name].resize(maxsize)


def clear_caches() -> None:
    """Release every cache of the library and JAX's compiled programs.

    Empties each registered :class:`BoundedCache` (grids, plans, solver
    kernels, the per-device compiled batch programs) and calls
    :func:`jax.clear_caches`, so the memory of every compiled program is
    handed back once nothing else holds it.  Results are unaffected: the next
    call traces (and compiles, or loads from the persistent compilation
    cache) again.
    """
    for cache in _CACHES.values():
        cache.cache_clear()
    jax.clear_caches()


def cache_sizes() -> dict[str, int]:
    """The entries each registered cache holds now, by name."""
    return {name: cache.cache_info().currsize for name, cache in sorted(_CACHES.items())}
