r"""Differentiable, batchable solves of the masked stiffness system (batch-last).

The layer between the solvers (:mod:`sphyr_jax.fem.solvers`) and the public
load-case API (:mod:`sphyr_jax.fem.fea`).  Arrays have the batch on their
*last* axis: element moduli (*cells, B), vectors (n_dofs, B).

* :class:`Kernels`: a solver's ``init``/``compute`` for one grid shape, split
  into cache-sized chunks of the batch, each wrapped in a
  :func:`jax.custom_batching.custom_vmap` whose rule folds a mapped axis into
  the last one, so ``jax.vmap`` of a solve runs the same batch-last code as a
  native batch.  The kernels are never differentiated themselves.
* :func:`linear_solve`: $x = \tilde K(E)^{-1} b$ behind
  ``lax.custom_linear_solve``, which supplies both differentiation modes (a
  tangent or a cotangent is one more solve with the same state; no solver is
  unrolled).
* :func:`compliance_rule`: $c = f^T \tilde K^{-1} f$ with a self-adjoint JVP
  rule that needs no extra solve in either mode.
* :func:`solve_system`, :func:`system_compliance`: the same on raw arrays
  (jitted), for callers that hold moduli rather than a load case.

A solve that does not succeed returns NaN displacements (and so NaN
derivatives), never a silently wrong number; its :data:`RESULTS` code says why.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from sphyr_jax.fem import structured as st
from sphyr_jax.fem.array_types import Codes, FreeMask, Moduli, PerSample, Vectors
from sphyr_jax.fem.solvers import RESULTS, AbstractSolver, SolverLike, as_solver
from sphyr_jax.runtime import bounded_cache


def chunked(fn, chunk: int, *arrays):
    """Apply a batch-last ``fn`` chunk by chunk (``lax.map``) when the batch is large.

    Every leaf of ``arrays`` and of the output has the batch on its last axis;
    a ragged last chunk is padded by repeating the last sample (padding must
    stay a well-posed problem) and cut off again.
    """
    leaves = jax.tree.leaves(arrays)
    nb = leaves[0].shape[-1]
    if not chunk or nb <= chunk:
        return fn(*arrays)
    n_chunks = -(-nb // chunk)
    pad = n_chunks * chunk - nb

    def split(a):
        if pad:
            a = jnp.concatenate([a, jnp.repeat(a[..., -1:], pad, axis=-1)], axis=-1)
        a = a.reshape(a.shape[:-1] + (n_chunks, chunk))
        return jnp.moveaxis(a, -2, 0)

    outs = jax.lax.map(lambda xs: fn(*xs), jax.tree.map(split, arrays))

    def join(o):
        o = jnp.moveaxis(o, 0, -2)
        return o.reshape(o.shape[:-2] + (n_chunks * chunk,))[..., :nb]

    return jax.tree.map(join, outs)


def _batch_last_vmap(kernel):
    """``kernel`` (batch-last in and out) with a batching rule that folds the
    mapped axis into the batch axis and calls ``kernel`` once."""
    wrapped = custom_vmap(kernel)

    @wrapped.def_vmap
    def _rule(axis_size, in_batched, *args):
        def fold(a, batched):
            if not batched:
                a = jnp.broadcast_to(a, (axis_size,) + a.shape)
            a = jnp.moveaxis(a, 0, -2)  # (..., V, B)
            return a.reshape(a.shape[:-2] + (-1,))

        out = wrapped(*jax.tree.map(fold, list(args), list(in_batched)))

        def unfold(o):
            o = o.reshape(o.shape[:-1] + (axis_size, -1))
            return jnp.moveaxis(o, -2, 0)

        out = jax.tree.map(unfold, out)
        return out, jax.tree.map(lambda _: True, out)

    return wrapped


class Kernels:
    """The batch-last kernels of one (grid shape, solver), built once.

    Attributes:
        grid: the structured grid.
        solver: the solver object.
        init: ``(moduli, free) -> state``, the solver's reusable state.
        compute: ``(state, rhs) -> (x, result, iterations)``.
        compute_from: ``(state, rhs, x0) -> (x, result, iterations)``, the
            iterative solvers starting from the guess ``x0`` (the direct ones
            ignore it).
        init_compute: ``(moduli, free, rhs) -> (x, result, iterations)``, fused
            (no state kept: cheapest when it is used once).
    """

    def __init__(self, shape: tuple[int, ...], solver: AbstractSolver):
        self.grid = grid = st.get_grid(tuple(shape))
        self.solver = solver
        self.ndim = grid.dim
        chunk = solver.batch_chunk(grid)

        def init(moduli, free):
            return chunked(functools.partial(solver.init, grid), chunk, moduli, free)

        def compute(state, rhs):
            return chunked(functools.partial(solver.compute, grid), chunk, state, rhs)

        def compute_from(state, rhs, x0):
            return chunked(functools.partial(solver.compute, grid), chunk, state, rhs, x0)

        def init_compute(moduli, free, rhs):
            return chunked(functools.partial(solver.init_compute, grid), chunk, moduli, free,
                           rhs)

        self.init = _batch_last_vmap(init)
        self.compute = _batch_last_vmap(compute)
        self.compute_from = _batch_last_vmap(compute_from)
        self.init_compute = _batch_last_vmap(init_compute)

    def matvec(self, moduli, free, x):
        """$\\tilde K x$ (batch-last)."""
        return st.matvec(self.grid, moduli, free, x)

    def energy(self, a, b):
        """Unit-modulus element energies $a_e^T K_e b_e$, (*cells, B)."""
        return st.element_energy(self.grid, a, b)


@bounded_cache(maxsize=64)
def kernels(shape: tuple[int, ...], solver: AbstractSolver) -> Kernels:
    """Cached :class:`Kernels` (one set per grid shape and solver, at most 64 kept)."""
    return Kernels(tuple(shape), solver)


def _checked(out):
    """Kernel output -> (x, (result, iterations)); a failed solve gives NaN, so it
    can never pass for a solution or a derivative."""
    x, result, its = out
    return jnp.where(result == RESULTS.successful, x, jnp.nan), (result, its)


def linear_solve(k: Kernels, moduli: Moduli, free: FreeMask, rhs: Vectors, *,
                 reuse_state: bool = True, x0: Vectors | None = None
                 ) -> tuple[Vectors, Codes, Codes]:
    r"""$x = \tilde K(E)^{-1} b$ behind ``lax.custom_linear_solve``.

    JAX derives both differentiation modes from the rule: a tangent is one
    more solve, $\dot x = \tilde K^{-1}(\dot b - \dot{\tilde K} x)$ (the matrix
    derivative comes from the matrix-free product, which is linear in $E$),
    and the transpose is the same solve ($\tilde K$ is symmetric).  With
    ``reuse_state`` the solver state (a factorisation) is computed once and
    kept for those extra solves; without it every solve starts afresh
    (cheaper when no derivative of ``x`` is taken).  ``x0`` is an initial
    guess of the iterative solvers (every solve of the rule starts from it;
    the direct solvers ignore it); the solution and its derivatives do not
    depend on it beyond the solver's tolerance.

    Args:
        k: kernels of the grid shape and solver.
        moduli: (*cells, B) element moduli.
        free: (n, B) free-DOF mask as 0/1 floats.
        rhs: (n, B), zero on fixed DOFs.
        x0: optional (n, B) initial guess (zero on fixed DOFs).

    Returns:
        (x (n, B), result (B,) :class:`RESULTS` codes, iterations (B,)).
    """
    m0 = jax.lax.stop_gradient(moduli)
    free = jax.lax.stop_gradient(free)
    if x0 is not None or reuse_state:
        state = k.init(m0, free)
        guess = () if x0 is None else (jax.lax.stop_gradient(x0),)
        compute = k.compute if x0 is None else k.compute_from

        def solve_fn(_, b):
            return _checked(compute(state, b, *guess))
    else:

        def solve_fn(_, b):
            return _checked(k.init_compute(m0, free, b))

    x, (result, its) = jax.lax.custom_linear_solve(
        lambda v: k.matvec(moduli, free, v), rhs, solve_fn, symmetric=True, has_aux=True)
    return x, result, its


@bounded_cache(maxsize=64)
def compliance_rule(shape: tuple[int, ...], solver: AbstractSolver):
    r"""$c = f^T \tilde K^{-1} f$ (batch-last) with a self-adjoint JVP rule.

    $\dot c = -\sum_e \dot E_e\, u_e^T K_e u_e + 2 u \cdot \dot f$: no extra solve
    in either mode (JAX transposes the rule for reverse mode).  The primal
    uses the fused kernel; inside the rule $u$ comes from :func:`linear_solve`,
    so second derivatives (Hessian-vector products) work.

    Returns:
        ``(moduli (*cells, B), f (n, B), free (n, B)) -> c (B,)``; ``f`` must
        vanish on fixed DOFs; a failed solve gives NaN.
    """
    k = kernels(shape, solver)

    @jax.custom_jvp
    def comp(moduli, f, free):
        u, _ = _checked(k.init_compute(moduli, jax.lax.stop_gradient(free), f))
        return jnp.sum(f * u, axis=0)

    @comp.defjvp
    def comp_jvp(primals, tangents):
        moduli, f, free = primals
        dm, df, _ = tangents
        u, _, _ = linear_solve(k, moduli, free, f, reuse_state=False)
        cells = tuple(range(k.ndim))
        dc = (-jnp.sum(dm * k.energy(u, u), axis=cells)
              + 2.0 * jnp.sum(df * u, axis=0))
        return jnp.sum(f * u, axis=0), dc

    return comp


@functools.partial(jax.jit, static_argnames=("solver",))
def solve_system(moduli: Moduli, free: FreeMask, rhs: Vectors, *, solver: SolverLike = None
                 ) -> tuple[Vectors, Codes, Codes]:
    r"""$u = \tilde K^{-1} (D\,\text{rhs})$ on raw batch-last arrays, differentiable.

    Args:
        moduli: (*cells, B) element moduli.
        free: (n_dofs, B) free-DOF mask (0/1).
        rhs: (n_dofs, B) right-hand sides (masked here).
        solver: a solver object or name (None: the grid's default).

    Returns:
        ``(u (n_dofs, B), result (B,), iterations (B,))``.
    """
    shape = tuple(moduli.shape[:-1])
    k = kernels(shape, as_solver(solver, shape))
    free = jnp.asarray(free, moduli.dtype)
    return linear_solve(k, moduli, free, rhs * free)


@functools.partial(jax.jit, static_argnames=("solver",))
def system_compliance(moduli: Moduli, force: Vectors, free: FreeMask, *,
                      solver: SolverLike = None) -> PerSample:
    r"""$c = f^T \tilde K^{-1} f$, $f = D\,\text{force}$, on raw batch-last arrays.

    Differentiable in both modes with respect to the moduli and the force
    (self-adjoint: no extra solve).

    Returns:
        c (B,); NaN where the solve failed (:func:`solve_system` reports why).
    """
    shape = tuple(moduli.shape[:-1])
    free = jnp.asarray(free, moduli.dtype)
    return compliance_rule(shape, as_solver(solver, shape))(moduli, force * free, free)
