r"""Banded Cholesky by LAPACK on the host, callable from compiled CPU programs.

LAPACK's blocked banded Cholesky (``dpbtrf``) and its solves (``dpbtrs``,
``dtbtrs``) run at the speed of tuned matrix kernels: a factorisation costs
$O(n k^2)$ for $n$ DOFs and half-bandwidth $k$, like the same factorisation
written as XLA loops (:mod:`sphyr_jax.fem._banded`), with a smaller constant
(``benchmarks/scaling.py`` times both, and the multigrid CG, per grid size).  The routines are
SciPy's own LAPACK, reached through the function pointers that
``scipy.linalg.cython_lapack`` exports and called through :mod:`ctypes`,
which releases the interpreter lock during each call, so the samples of a
large enough batch are dealt to every core at once (:func:`_spread`), each
call single-threaded (one small band is faster on one thread).

The threads that share a batch's samples live in one pool per process,
created on the first batch that needs it (importing the module starts no
thread and registers nothing); it is shut down at interpreter exit, or by
:func:`shutdown_threads`, and a forked child makes its own.

Compiled programs call in through an XLA foreign-function target
(:mod:`sphyr_jax.fem.host`: one call per batch, a fixed overhead per call, the
program's buffers read in place), so this serves CPU programs, on one device
or several at once; elsewhere the XLA factorisation is used
(:class:`~sphyr_jax.fem.solvers.Banded`).

The band is assembled for 2D and voxel grids alike (:func:`band_weights`):
the banded solver factors 2D grids, and the multigrid CG's direct fallback
(:mod:`sphyr_jax.fem.multigrid`) factors the voxel samples whose CG failed.

Storage (per sample, C order): the factor is ``(n, k + 1)`` with
``F[j, d] = L[j + d, j]`` for the half-bandwidth $k$ (LAPACK's lower band
storage, column major).  Arrays cross the boundary batch-*first*.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem.host import host_call
from sphyr_jax.fem.structured import get_grid
from sphyr_jax.runtime import bounded_cache

_INT = ctypes.POINTER(ctypes.c_int)
_CHAR = ctypes.c_char_p
_PTR = ctypes.c_void_p


@functools.cache
def _routines():
    """(dpbtrf, dpbtrs, dtbtrs, set_threads or None) as ctypes functions."""
    from scipy.linalg import cython_lapack

    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                   ctypes.c_char_p]

    def routine(name, *args):
        capsule = cython_lapack.__pyx_capi__[name]
        address = get_pointer(capsule, get_name(capsule))
        return ctypes.CFUNCTYPE(None, *args)(address)

    pbtrf = routine("dpbtrf", _CHAR, _INT, _INT, _PTR, _INT, _INT)
    pbtrs = routine("dpbtrs", _CHAR, _INT, _INT, _INT, _PTR, _INT, _PTR, _INT, _INT)
    tbtrs = routine("dtbtrs", _CHAR, _CHAR, _CHAR, _INT, _INT, _INT, _PTR, _INT, _PTR, _INT,
                    _INT)
    return pbtrf, pbtrs, tbtrs, _thread_setter()


def _thread_setter():
    """OpenBLAS's per-thread thread count setter of the library behind SciPy's
    LAPACK, if found (``None`` otherwise)."""
    path = scipy_openblas()
    if path is None:
        return None
    try:
        setter = ctypes.CDLL(path).openblas_set_num_threads_local
    except (OSError, AttributeError):
        return None
    setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
    return setter


def scipy_openblas() -> str | None:
    """Path of the OpenBLAS that SciPy's LAPACK calls, if one is loaded.

    NumPy and SciPy wheels each bundle their own OpenBLAS (NumPy's the 64-bit
    integer build); SciPy's lives in the ``scipy.libs`` folder beside the
    package.  Limiting the wrong one leaves ``dpbtrf`` on every core, where
    its threads spin-wait for each other, many times slower per
    factorisation when two such processes share the cores.
    """
    import scipy

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    folder = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    own = sorted(p for p in paths if p.startswith(folder + os.sep))
    others = sorted(p for p in paths if "numpy" not in p)
    return (own or others or [None])[0]


@contextlib.contextmanager
def _single_thread():
    """OpenBLAS on one thread for this thread's calls (a band this size factors
    faster on one), restored after."""
    setter = _routines()[3]
    before = setter(1) if setter is not None else None
    try:
        yield
    finally:
        if setter is not None:
            setter(before)


def host_cores() -> int:
    """How many samples of a batch are factored at once: the cores this process
    may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


_POOL: list[ThreadPoolExecutor] = []  # the pool, once made; emptied in a forked child
_POOL_LOCK = threading.Lock()
_HOOKS: list[bool] = []  # [True] once the exit and fork hooks are registered


def _forget_pool() -> None:
    """In a forked child: the parent's threads do not exist here."""
    _POOL.clear()


def shutdown_threads() -> None:
    """Stop the host threads (after their work); a later batch starts new ones.

    Registered to run at interpreter exit once the pool exists; call it to
    release the threads earlier.
    """
    with _POOL_LOCK:
        pools = list(_POOL)
        _POOL.clear()
    for pool in pools:
        pool.shutdown(wait=True)


def _pool() -> ThreadPoolExecutor:
    """The process's thread pool, made (and its hooks registered) on first use."""
    with _POOL_LOCK:
        if not _HOOKS:
            atexit.register(shutdown_threads)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_forget_pool)
            _HOOKS.append(True)
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(host_cores(), "sphyr-lapack"))
        return _POOL[0]


# A batch runs on the calling thread below this many multiply-adds in all, or
# per sample ($n k^2$ for a factorisation): handing work to another thread and
# back costs a fixed overhead, and each sample's assembly holds the
# interpreter lock, so small bands and small batches gain nothing from more
# threads.
_SPREAD_FLOPS = 3e6
_SPREAD_FLOPS_EACH = 1e5


def _spread(live: list[int], work, flops_each: float) -> None:
    """``work(i)`` for every ``i`` in ``live``, on every core where that pays.

    The samples are dealt round-robin to at most :func:`host_cores` threads
    (the calling one among them), each running OpenBLAS on one thread.  The
    ctypes calls release the interpreter lock, so the factorisations run in
    parallel; a shared pool keeps the total at the core count when several
    devices call in at once.  Small batches and small samples stay on the
    calling thread (the thresholds above).
    An exception in any sample is raised here.

    Args:
        live: sample indices to work on.
        work: ``i -> None``, run once per index.
        flops_each: multiply-adds of one sample's work.
    """
    ways = min(host_cores(), len(live))
    if flops_each < _SPREAD_FLOPS_EACH or flops_each * len(live) < _SPREAD_FLOPS:
        ways = 1

    def run(chunk):
        with _single_thread():
            for i in chunk:
                work(i)

    if ways == 1:
        run(live)
        return
    futures = [_pool().submit(run, live[w::ways]) for w in range(1, ways)]
    try:
        run(live[0::ways])
    finally:
        for f in futures:
            f.result()


def _flops(n: int, width: int) -> float:
    return float(n) * float(width) ** 2


def _live(free: np.ndarray) -> list[int]:
    """Samples with a free DOF (the others are the identity: no work)."""
    return [int(i) for i in np.flatnonzero(free.any(axis=1))]


def _c_int(v: int):
    return ctypes.byref(ctypes.c_int(int(v)))


def _factor_one(band: np.ndarray) -> bool:
    """Factor one (n, k + 1) lower band in place; False if it is not positive definite."""
    n, width = band.shape
    info = ctypes.c_int(0)
    _routines()[0](b"L", _c_int(n), _c_int(width - 1), band.ctypes.data, _c_int(width),
                   ctypes.byref(info))
    return info.value == 0


def _solve_one(fac: np.ndarray, rhs: np.ndarray) -> None:
    """Solve in place for the (r, n) right-hand sides ``rhs`` with one factor."""
    n, width = fac.shape
    info = ctypes.c_int(0)
    _routines()[1](b"L", _c_int(n), _c_int(width - 1), _c_int(rhs.shape[0]), fac.ctypes.data,
                   _c_int(width), rhs.ctypes.data, _c_int(n), ctypes.byref(info))


def _forward_one(fac: np.ndarray, rhs: np.ndarray) -> None:
    """$L^{-1}$ applied in place to the (r, n) right-hand sides ``rhs``."""
    n, width = fac.shape
    info = ctypes.c_int(0)
    _routines()[2](b"L", b"N", b"N", _c_int(n), _c_int(width - 1), _c_int(rhs.shape[0]),
                   fac.ctypes.data, _c_int(width), rhs.ctypes.data, _c_int(n),
                   ctypes.byref(info))


@bounded_cache(maxsize=32)
def band_weights(shape: tuple[int, ...]) -> np.ndarray:
    r"""Assembly weights of the lower band, $(2^D, D (k + 1))$ for a grid of
    dimension $D$ (Q4 or hexahedral elements, $D$ DOFs per node).

    Column DOF $j = D v + \gamma$ of node $v$ holds $K_{j + d, j} = K_{j, j + d}$,
    the sum over the (at most $2^D$) elements that touch $v$ of the element's
    modulus times a fixed entry of its stiffness: with $E^{(q)}_v$ the modulus
    of the element whose local node $q$ is $v$,
    $K_{D v + \gamma,\, D v + \gamma + d} = \sum_q E^{(q)}_v W_{q, \gamma (k + 1) + d}$.
    With the row-major node numbering, node $v$'s neighbour across one
    element lies at most $s = \sum_a \text{stride}_a$ nodes on, so
    $k + 1 = D (s + 1)$ ($2 n_{elx} + 6$ in 2D).
    """
    grid = get_grid(tuple(shape))
    dim, offsets, ke = grid.dim, grid.element.node_offsets, grid.element.ke
    strides = np.cumprod((1,) + tuple(grid.node_shape[:0:-1]))[::-1]  # row-major node strides
    width = dim * (int(strides.sum()) + 1)  # k + 1
    nq = len(offsets)
    w = np.zeros((nq, dim, width))
    for a in range(nq * dim):
        for c in range(nq * dim):
            na, gamma = divmod(a, dim)
            nc, alpha = divmod(c, dim)
            shift = int(np.dot(np.subtract(offsets[nc], offsets[na]), strides))
            d = dim * shift + alpha - gamma
            if d >= 0:
                w[na, gamma, d] += ke[a, c]
    out = w.reshape(nq, dim * width)
    out.setflags(write=False)
    return out


def band_width(shape: tuple[int, ...]) -> int:
    """$k + 1$, the stored band's width, of a grid of ``shape`` cells."""
    return band_weights(tuple(shape)).shape[1] // len(shape)


class _Layout(NamedTuple):
    """Everything the band assembly of one grid shape needs, looked up once per batch."""

    weights: np.ndarray  # band_weights(shape)
    corners: tuple  # per element corner q: the slices of the node lattice it fills
    fixed: np.ndarray  # flat offsets of a DOF's band row and column (see _fixed_offsets)


@bounded_cache(maxsize=32)
def _layout(shape: tuple[int, ...]) -> _Layout:
    weights = band_weights(shape)
    corners = tuple(tuple(slice(o, o + n) for o, n in zip(off, shape, strict=True)) + (q,)
                    for q, off in enumerate(get_grid(shape).element.node_offsets))
    return _Layout(weights, corners, _fixed_offsets(weights.shape[1] // len(shape)))


@functools.cache
def _dgemm():
    from scipy.linalg import blas

    return blas.dgemm


def _fixed_offsets(width: int) -> np.ndarray:
    """Flat offsets, from ``j (k + 1)``, of the band entries in row and column
    $j$: ``F[j, d]`` for $d = 0..k$ and ``F[j - d, d]`` for $d = 1..k$."""
    d = np.arange(1, width)
    out = np.concatenate([np.arange(width), -d * (width - 1)])
    out.setflags(write=False)
    return out


def _assemble(moduli: np.ndarray, free: np.ndarray, layout: _Layout, out: np.ndarray) -> None:
    r"""The masked lower band of one sample into ``out`` (n, k + 1), C-contiguous.

    $\tilde K = D K D + (I - D)$ with $D = \mathrm{diag}(\text{free})$: the rows
    and columns of fixed DOFs are cleared and their diagonal set to 1.  The
    band is one product of the corner moduli with the weights (zeros
    included, so nothing is filled twice), then the fixed entries are set
    through flat indices.
    """
    n, width = out.shape
    slices = layout.corners
    corners = np.zeros(tuple(c + 1 for c in moduli.shape) + (len(slices),))
    for where in slices:
        corners[where] = moduli
    # out = corners @ weights, written in place by SciPy's dgemm (the
    # transposed product in column-major order), so it runs on the one
    # OpenBLAS thread of the factorisation: NumPy's matmul spreads a product
    # this size over its own OpenBLAS threads, which then spin beside
    # ``dpbtrf``.
    dim = moduli.ndim
    _dgemm()(1.0, layout.weights.T, corners.reshape(-1, len(slices)).T, beta=0.0,
             c=out.reshape(n // dim, dim * width).T, overwrite_c=1)
    fixed = np.flatnonzero(free == 0)
    if fixed.size:
        flat = out.reshape(-1)
        entries = (fixed[:, None] * width + layout.fixed).reshape(-1)
        flat[entries[entries >= 0]] = 0.0  # F[i - d, d] lies before the band when d > i
        flat[fixed * width] = 1.0


def factor(moduli: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Cholesky factors of the masked stiffness matrices, assembled here.

    Args:
        moduli: (B, *cells) element moduli (2D or 3D).
        free: (B, n) free-DOF masks (0/1).

    Returns:
        (B, n, k + 1) factors in LAPACK's lower band storage; a sample that is
        not positive definite is NaN.  A sample without a free DOF (the
        identity) costs no factorisation.
    """
    moduli, free = np.asarray(moduli, np.float64), np.asarray(free, np.float64)
    nb, n = free.shape
    layout = _layout(moduli.shape[1:])
    width = band_width(moduli.shape[1:])
    out = np.empty((nb, n, width))
    for i in np.flatnonzero(~free.any(axis=1)):  # the identity
        _assemble(moduli[i], free[i], layout, out[i])

    def one(i):
        _assemble(moduli[i], free[i], layout, out[i])
        if not _factor_one(out[i]):
            out[i] = np.nan

    _spread(_live(free), one, _flops(n, width))
    return out


def _per_sample(one, fac: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``one(factor, rows)`` in place on a copy of every sample's right-hand sides."""
    fac = np.ascontiguousarray(fac, dtype=np.float64)
    out = np.array(rhs, dtype=np.float64, order="C", copy=True)
    nb, n, width = fac.shape
    _spread(list(range(nb)), lambda i: one(fac[i], out[i]), 4.0 * n * width * out.shape[1])
    return out


def solve(fac: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """$x = A^{-1} b$ with factors from :func:`factor`.

    Args:
        fac: (B, n, k + 1) factors.
        rhs: (B, r, n) right-hand sides (r per sample).

    Returns:
        (B, r, n) solutions.
    """
    return _per_sample(_solve_one, fac, rhs)


def forward(fac: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """$y = L^{-1} b$ with factors from :func:`factor`; shapes as :func:`solve`."""
    return _per_sample(_forward_one, fac, rhs)


def inverse_quadratic(fac: np.ndarray, dofs: np.ndarray, free: np.ndarray,
                      combos: np.ndarray) -> np.ndarray:
    r"""$W^T A^{-1} W$ for columns made of unit vectors, with factors from :func:`factor`.

    Args:
        fac: (B, n, k + 1) factors of $A = L L^T$.
        dofs: (B, C, m) DOF indices, m per group.
        free: (B, n) free-DOF masks: a fixed DOF's unit vector is zero (a
            sample without a free DOF gives zeros at no cost).
        combos: (m, r) combinations: column $(c, k)$ of $W$ is
            $\sum_a$ ``combos[a, k]`` $e_{\text{dofs}[c, a]}$.

    Returns:
        (B, C r, C r) $(V^T Y)^T (V^T Y)$ with $Y = L^{-1} E$: one forward
        substitution per sample; $Y$ stays on the host.
    """
    fac = np.ascontiguousarray(fac, dtype=np.float64)
    dofs = np.asarray(dofs, np.int64)
    free = np.asarray(free, np.float64)
    combos = np.asarray(combos, np.float64)
    nb, n = free.shape
    groups, per = dofs.shape[1:]
    rank = combos.shape[1]
    out = np.zeros((nb, groups * rank, groups * rank))

    def one(i):
        flat = dofs[i].reshape(-1)
        unit = np.zeros((flat.size, n))
        unit[np.arange(flat.size), flat] = free[i, flat]
        _forward_one(fac[i], unit)
        projected = np.einsum("ak,can->ckn", combos, unit.reshape(groups, per, n))
        projected = projected.reshape(groups * rank, n)
        np.matmul(projected, projected.T, out=out[i])

    # A sample without a free DOF is the identity: every unit vector zero.
    _spread(_live(free), one, 2.0 * n * fac.shape[2] * groups * per)
    return out


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, int]) -> np.ndarray:
    """This thread's band buffer of ``shape``, reused across calls: a fresh
    multi-megabyte array per call would cost its page faults every time."""
    buf = getattr(_SCRATCH, "band", None)
    if buf is None or buf.shape != shape:
        buf = _SCRATCH.band = np.empty(shape)
    return buf


def factor_solve(moduli: np.ndarray, free: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """:func:`factor` then :func:`solve`, one sample at a time, keeping no factor.

    A sample without a free DOF returns its right-hand side (the identity).
    """
    moduli, free = np.asarray(moduli, np.float64), np.asarray(free, np.float64)
    nb, n = free.shape
    layout = _layout(moduli.shape[1:])
    width = band_width(moduli.shape[1:])
    out = np.array(rhs, dtype=np.float64, order="C", copy=True)

    def one(i):
        band = _scratch((n, width))  # the running thread's own
        _assemble(moduli[i], free[i], layout, band)
        if _factor_one(band):
            _solve_one(band, out[i])
        else:
            out[i] = np.nan

    _spread(_live(free), one, _flops(n, width))
    return out


# ----------------------------------------------------------------------------
# The same from compiled programs (batch-first arrays; never differentiated or
# batched themselves: the solver layer wraps them).


def _callback(fn, shape, *args):
    return host_call(fn, jax.ShapeDtypeStruct(shape, jnp.float64), *args)


def _batch_first(moduli, free):
    return (jnp.moveaxis(jnp.asarray(moduli, jnp.float64), -1, 0),
            jnp.asarray(free, jnp.float64).T)


def jax_factor(moduli, free):
    """:func:`factor` from a compiled program, batch-last in: moduli (*cells, B),
    free (n, B); returns the factors (B, n, k + 1)."""
    m, f = _batch_first(moduli, free)
    width = band_width(m.shape[1:])
    return _callback(factor, f.shape + (width,), m, f)


def jax_solve(fac, rhs):
    """:func:`solve` from a compiled program (batch-first)."""
    return _callback(solve, rhs.shape, fac, rhs)


def jax_forward(fac, rhs):
    """:func:`forward` from a compiled program (batch-first)."""
    return _callback(forward, rhs.shape, fac, rhs)


def jax_inverse_quadratic(fac, dofs, free, combos):
    """:func:`inverse_quadratic` from a compiled program (batch-first)."""
    size = dofs.shape[1] * combos.shape[1]
    return _callback(inverse_quadratic, (dofs.shape[0], size, size), fac, dofs, free, combos)


def jax_factor_solve(moduli, free, rhs):
    """:func:`factor_solve` from a compiled program; moduli and free batch-last,
    rhs batch-first (B, r, n)."""
    m, f = _batch_first(moduli, free)
    return _callback(factor_solve, rhs.shape, m, f, rhs)
