"""Finite-element analysis: SIMP moduli, solves, compliance, structural response.

Public functions take a :class:`~sphyr_jax.problem.loadcase.LoadCase` and densities
with any leading batch axes (broadcast against each other) and are pure JAX:
``jit``, ``vmap``, ``grad``, ``jvp`` and their compositions work.  Internally
the batch is flattened onto the last axis (the layout the structured solvers
of :mod:`sphyr_jax.fem._banded` want); under ``jax.vmap`` the solver kernels fold
the mapped axis into that same batch axis (:mod:`sphyr_jax.fem._kernels`).

Solvers:

* ``"banded"`` (default): exact banded Cholesky, about 30x fewer flops than a
  dense one on a 10x10 grid.
* ``"dense"``: dense Cholesky (``jnp.linalg.cholesky``), the simplest exact path.
* ``"cg"``: Jacobi-preconditioned conjugate gradients with a bounded number of
  iterations; reports convergence instead of raising (an unconverged system
  gives NaN displacements and infinite compliance, never a wrong number).

Derivatives: every solve sits behind ``lax.custom_linear_solve`` (a tangent or
a cotangent is one more solve with the same factorisation; no solver is
unrolled), and compliance has a self-adjoint JVP rule that needs no extra
solve in either mode.  Both modes work with respect to the densities, the
force vector and the SIMP penalty.

Each public function is one module-level jitted program per grid shape,
solver and (eager) batch bucket, so repeated calls on new samples never
recompile.

float64 is required (E_min = 1e-9 makes K ill-conditioned); enable it with
``jax.config.update("jax_enable_x64", True)`` before calling these functions.
"""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import _kernels
from sphyr_jax.fem._kernels import Solver, as_solver, default_chunk
from sphyr_jax.fem.mesh import E0, EMIN, get_mesh
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.runtime import enable_x64, require_x64
from sphyr_jax.sharding import bucket_size

SINGULARITY_RATIO = 1e3  # load_carrying iff c <= ratio * solid compliance

__all__ = [
    "SINGULARITY_RATIO", "Analysis", "Solution", "Solver", "analyze", "as_solver",
    "compliance", "default_chunk", "dense_stiffness", "element_strain_energy", "enable_x64",
    "require_x64", "simp_moduli", "solve",
]


def simp_moduli(densities: jax.Array, penal=3.0) -> jax.Array:
    r"""SIMP moduli $E(\rho) = E_{min} + \rho^p (E_0 - E_{min})$, $\rho$ clipped to [0, 1]."""
    rho = jnp.clip(densities, 0.0, 1.0)
    return EMIN + rho**penal * (E0 - EMIN)


# ----------------------------------------------------------------------------
# Differentiable solves (batch-last: moduli (nely, nelx, B), vectors (n, B)).


def _checked(out):
    """Kernel output -> (x, (converged, iterations)); unconverged systems give NaN,
    so a CG that failed can never pass for a solution or a derivative."""
    x, conv, its = out
    return jnp.where(conv, x, jnp.nan), (conv, its)


def linear_solve(k: _kernels.Kernels, moduli, free, rhs, reuse_factor: bool = True):
    r"""$x = \tilde K(E)^{-1} b$ behind ``lax.custom_linear_solve``.

    JAX derives both differentiation modes from the rule: a tangent is one
    more solve, $\dot x = \tilde K^{-1}(\dot b - \dot{\tilde K} x)$ (the matrix
    derivative comes from the matrix-free product, which is linear in $E$),
    and the transpose is the same solve ($\tilde K$ is symmetric).  With
    ``reuse_factor`` the factorisation is computed once and kept for those
    extra solves; without it every solve refactors (cheaper when no
    derivative of ``x`` is taken).

    Args:
        k: kernels of the grid shape and solver.
        moduli: (nely, nelx, B) element moduli.
        free: (n, B) free-DOF mask as 0/1 floats.
        rhs: (n, B), zero on fixed DOFs.

    Returns:
        (x (n, B), converged (B,), iterations (B,)).
    """
    m0 = jax.lax.stop_gradient(moduli)
    free = jax.lax.stop_gradient(free)
    if reuse_factor:
        fac = k.factor(m0, free)

        def solve_fn(_, b):
            return _checked(k.apply(fac, b))
    else:

        def solve_fn(_, b):
            return _checked(k.factor_solve(m0, free, b))

    x, (conv, its) = jax.lax.custom_linear_solve(
        lambda v: k.matvec(moduli, free, v), rhs, solve_fn, symmetric=True, has_aux=True)
    return x, conv, its


@functools.lru_cache(maxsize=64)
def _compliance_rule(shape: tuple[int, int], solver: Solver):
    r"""$c = f^T \tilde K^{-1} f$ (batch-last) with a self-adjoint JVP rule.

    $\dot c = -\sum_e \dot E_e\, u_e^T K_e u_e + 2 u \cdot \dot f$: no extra solve
    in either mode (JAX transposes the rule for reverse mode).  The primal
    uses the fused factor-and-solve kernel; inside the rule $u$ comes from
    :func:`linear_solve`, so second derivatives (Hessian-vector products) work.
    """
    k = _kernels.kernels(shape, solver)

    @jax.custom_jvp
    def comp(moduli, f, free):
        u, _ = _checked(k.factor_solve(moduli, jax.lax.stop_gradient(free), f))
        return jnp.sum(f * u, axis=0)

    @comp.defjvp
    def comp_jvp(primals, tangents):
        moduli, f, free = primals
        dm, df, _ = tangents
        u, _, _ = linear_solve(k, moduli, free, f, reuse_factor=False)
        cells = tuple(range(k.ndim))
        dc = (-jnp.sum(dm * k.energy(u, u), axis=cells)
              + 2.0 * jnp.sum(df * u, axis=0))
        return jnp.sum(f * u, axis=0), dc

    return comp


# ----------------------------------------------------------------------------
# Public, batch-first API.


def _grid_axes(load_case: LoadCase) -> tuple[int, ...]:
    return tuple(range(-load_case.ndim, 0))


def _check_shape(load_case: LoadCase, densities) -> None:
    shape, d = load_case.shape, load_case.ndim
    if tuple(np.shape(densities)[-d:]) != shape:
        raise ValueError(
            f"densities have grid shape {tuple(np.shape(densities)[-d:])}, load case has {shape}")


def _flatten_batch(load_case: LoadCase, densities: jax.Array):
    shape, d = load_case.shape, load_case.ndim
    _check_shape(load_case, densities)
    batch = tuple(jnp.broadcast_shapes(load_case.batch_shape, densities.shape[:-d]))
    nb = math.prod(batch)
    n = d * math.prod(s + 1 for s in shape)
    rho = jnp.broadcast_to(densities, batch + shape).reshape((nb,) + shape)
    force = jnp.broadcast_to(load_case.force, batch + (n,)).reshape(nb, n)
    free = jnp.broadcast_to(load_case.free_dofs, batch + (n,)).reshape(nb, n)
    return batch, rho, force, free


class Solution(eqx.Module):
    """Displacements of a batch of designs.

    Attributes:
        displacements: (..., n_dofs); NaN where CG did not converge.
        compliance: (...) $c = f \\cdot u$; +inf where the problem has no load,
            no support, or a non-finite or negative result (CG that did not
            converge included).
        converged: (...) bool, always True for the direct solvers.
        iterations: (...) CG iterations (0 for the direct solvers).
    """

    displacements: jax.Array
    compliance: jax.Array
    converged: jax.Array
    iterations: jax.Array


def _prepare(load_case: LoadCase, densities, penal):
    """Flatten the batch, move it last, and swap ill-posed problems for harmless ones.

    Where-twice: a problem without load or support, or with non-finite
    densities, is replaced by a well-posed one before the solve, so neither its
    value nor its gradient can turn into NaN; its compliance is reported inf.

    Returns:
        (batch shape, moduli (*cells, B), force (n, B), free (n, B) floats,
        ok (B,): the design is well posed, posed (B,): the load case is).
    """
    densities = jnp.asarray(densities, dtype=jnp.float64)
    batch, rho, force, free = _flatten_batch(load_case, densities)
    force = jnp.asarray(force, jnp.float64)
    has_load = jnp.any(force != 0.0, axis=-1)
    has_support = jnp.any(~jnp.asarray(free, bool), axis=-1)
    finite_rho = jnp.all(jnp.isfinite(rho), axis=_grid_axes(load_case))
    posed = has_load & has_support  # a property of the load case alone
    ok = posed & finite_rho
    safe_rho = jnp.where(ok.reshape((-1,) + (1,) * load_case.ndim), rho, 1.0)
    safe_free = jnp.where(posed[:, None], jnp.asarray(free, bool), False)
    penal = jnp.broadcast_to(jnp.asarray(penal, jnp.float64), batch).reshape(
        (-1,) + (1,) * load_case.ndim)
    moduli = simp_moduli(safe_rho, penal)
    return (batch, jnp.moveaxis(moduli, 0, -1), force.T,
            safe_free.T.astype(jnp.float64), ok, posed)


def _finalise(c, ok):
    valid = ok & jnp.isfinite(c) & (c >= 0.0)
    return jnp.where(valid, c, jnp.inf)


def _solve_impl(load_case, densities, penal, solver) -> Solution:
    batch, moduli, force, free, ok, posed = _prepare(load_case, densities, penal)
    k = _kernels.kernels(load_case.shape, solver)
    u, conv, its = linear_solve(k, moduli, free, force * free, reuse_factor=True)
    c = _finalise(jnp.sum(force * u, axis=0), ok)
    n = force.shape[0]
    return Solution(
        displacements=u.T.reshape(batch + (n,)),
        compliance=c.reshape(batch),
        converged=conv.reshape(batch),
        iterations=its.reshape(batch),
    )


def _compliance_impl(load_case, densities, penal, solver) -> jax.Array:
    batch, moduli, force, free, ok, posed = _prepare(load_case, densities, penal)
    c = _compliance_rule(load_case.shape, solver)(moduli, force * free, free)
    return _finalise(c, ok).reshape(batch)


class Analysis(eqx.Module):
    """Structural response of designs (fields batched like the input).

    Attributes:
        compliance: raw compliance (lower is stiffer), inf if invalid.
        volume_fraction: mean density over the whole grid.
        max_displacement: largest nodal displacement magnitude.
        load_carrying: compliance finite and <= 1e3 x the solid grid's.
        solid_compliance: compliance of the all-ones grid.
        converged: solver convergence (always True for direct solvers).
    """

    compliance: jax.Array
    volume_fraction: jax.Array
    max_displacement: jax.Array
    load_carrying: jax.Array
    solid_compliance: jax.Array
    converged: jax.Array


def _analyze_impl(load_case, densities, penal, solver) -> Analysis:
    densities = jnp.asarray(densities, dtype=jnp.float64)
    batch, moduli, force, free, ok, posed = _prepare(load_case, densities, penal)
    nb = force.shape[1]
    # The design and the solid grid in one batched solve (one factorisation kernel).
    solid_moduli = simp_moduli(jnp.ones_like(moduli), jnp.broadcast_to(
        jnp.asarray(penal, jnp.float64), batch).reshape(-1))
    k = _kernels.kernels(load_case.shape, solver)
    u, conv, _ = linear_solve(k, jnp.concatenate([moduli, solid_moduli], axis=-1),
                              jnp.concatenate([free, free], axis=-1),
                              jnp.concatenate([force * free] * 2, axis=-1), reuse_factor=False)
    c_both = jnp.sum(jnp.concatenate([force] * 2, axis=-1) * u, axis=0)
    sol = Solution(
        displacements=u[:, :nb].T.reshape(batch + (force.shape[0],)),
        compliance=_finalise(c_both[:nb], ok).reshape(batch),
        converged=conv[:nb].reshape(batch),
        iterations=jnp.zeros(batch, jnp.int32),
    )
    solid = _finalise(c_both[nb:], posed).reshape(batch)
    u = sol.displacements.reshape(sol.displacements.shape[:-1] + (-1, load_case.ndim))
    max_disp = jnp.max(jnp.sqrt(jnp.sum(u * u, axis=-1)), axis=-1)
    carrying = (
        jnp.isfinite(sol.compliance)
        & jnp.isfinite(solid)
        & (sol.compliance <= SINGULARITY_RATIO * solid)
    )
    rho = jnp.clip(jnp.where(jnp.isfinite(densities), densities, 0.0), 0.0, 1.0)
    vf = jnp.broadcast_to(jnp.mean(rho, axis=_grid_axes(load_case)), sol.compliance.shape)
    return Analysis(
        compliance=sol.compliance,
        volume_fraction=vf,
        max_displacement=jnp.where(jnp.isfinite(sol.compliance), max_disp, 0.0),
        load_carrying=carrying,
        solid_compliance=solid,
        converged=sol.converged,
    )


# ----------------------------------------------------------------------------
# Public, batch-first API.  Each function is one module-level jitted program
# per (grid shape, solver, batch bucket): called eagerly, any batch is
# flattened and padded up to a power of two (a new sample, mask, budget or
# load direction never compiles again); under a caller's jit/vmap/grad the
# program is simply inlined.

_JIT = {name: jax.jit(fn, static_argnames=("solver",)) for name, fn in
        (("solve", _solve_impl), ("compliance", _compliance_impl), ("analyze", _analyze_impl))}


def _is_traced(tree) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def _call(name: str, load_case: LoadCase, densities, penal, solver):
    """Run one public program; eager batches are flattened and bucketed."""
    require_x64()
    solver = as_solver(solver)
    fn = _JIT[name]
    if _is_traced((load_case, densities, penal)):
        return fn(load_case, densities, penal, solver=solver)
    densities = np.asarray(densities, np.float64)
    penal = np.asarray(penal, np.float64)
    shape = load_case.shape
    _check_shape(load_case, densities)
    batch = np.broadcast_shapes(load_case.batch_shape, densities.shape[:-load_case.ndim],
                                penal.shape)
    if not batch:
        return fn(load_case, densities, penal, solver=solver)
    nb = math.prod(batch)
    size = bucket_size(nb)
    idx = np.minimum(np.arange(size), nb - 1)  # pad by repeating the last sample

    def flat(a, tail):
        a = np.broadcast_to(np.asarray(a), batch + tail).reshape((nb,) + tail)
        return a[idx]

    case = jax.tree.map(lambda a: flat(a, np.shape(a)[len(load_case.batch_shape):]),
                        load_case)
    out = fn(case, flat(densities, shape), flat(penal, ()), solver=solver)
    # Unpad on the host: an eager slice would compile once per batch size.
    # (jax.device_put, not jnp.asarray: the latter stages a program per shape.)
    return jax.tree.map(
        lambda a: jax.device_put(np.asarray(a)[:nb].reshape(batch + a.shape[1:])), out)


def solve(load_case: LoadCase, densities, penal=3.0, solver="banded") -> Solution:
    """Solve $K(\\rho) u = f$ for densities with any leading batch axes.

    Differentiable in both modes (``jax.grad``, ``jax.jvp``, ``jax.jacfwd``,
    Hessian-vector products) with respect to the densities, the load vector
    ``load_case.force`` and the penalty: the solve sits behind
    ``lax.custom_linear_solve``, so a tangent or a cotangent costs one more
    solve with the same factorisation.  ``jax.vmap`` over it runs the same
    batched kernels as a native batch.

    Args:
        load_case: boundary conditions (possibly batched).
        densities: (..., nely, nelx) densities, clipped to [0, 1]; the batch axes
            broadcast against the load case's.
        penal: SIMP exponent $p$, a scalar or an array of the batch shape.
        solver: ``"banded"``, ``"dense"``, ``"cg"`` or a :class:`Solver`.

    Returns:
        A :class:`Solution` with the broadcast batch shape.
    """
    return _call("solve", load_case, densities, penal, solver)


def compliance(load_case: LoadCase, densities, penal=3.0, solver="banded") -> jax.Array:
    """Compliance $c = f \\cdot u$ of densities under a load case.

    jit-able, vmap-able, batchable (see :func:`solve` for the arguments) and
    differentiable in both modes with respect to the densities, the force and
    the penalty.  Compliance is self-adjoint ($\\partial c / \\partial E_e =
    -u_e^T K_e u_e$, $\\partial c / \\partial f = 2 u$), so neither a gradient
    nor a JVP needs an extra solve; a Hessian-vector product needs one.

    Returns:
        (...) compliance; +inf for load-less, support-less or invalid problems.
    """
    return _call("compliance", load_case, densities, penal, solver)


def analyze(load_case: LoadCase, densities, penal=3.0, solver="banded") -> Analysis:
    """Solve a design and report its structural response.

    Densities are used as given (callers set L/S cells solid; see
    :func:`sphyr_jax.scoring.metrics.get_structural_metrics`).
    """
    return _call("analyze", load_case, densities, penal, solver)


@jax.jit
def _strain_energy(load_case: LoadCase, displacements):
    k = _kernels.kernels(load_case.shape, Solver())
    batch = displacements.shape[:-1]
    u = jnp.asarray(displacements, jnp.float64).reshape((-1, k.grid.n_dofs)).T
    e = k.energy(u, u)
    return jnp.moveaxis(e, -1, 0).reshape(batch + load_case.shape)


def element_strain_energy(load_case: LoadCase, displacements: jax.Array) -> jax.Array:
    """Unit-modulus element energies $u_e^T K_e u_e$, (..., *cells)."""
    return _strain_energy(load_case, displacements)


@jax.jit
def _dense_stiffness(free_dofs, densities, penal):
    mesh = get_mesh(*densities.shape)
    moduli = simp_moduli(jnp.asarray(densities, jnp.float64), penal)[..., None]
    return _kernels.dense_matrix(mesh, moduli, free_dofs.astype(jnp.float64)[:, None])[0]


def dense_stiffness(load_case: LoadCase, densities, penal=3.0) -> np.ndarray:
    """Masked dense stiffness matrix of one sample (for inspection and tests)."""
    return np.asarray(_dense_stiffness(load_case.free_dofs, np.asarray(densities, np.float64),
                                       np.float64(penal)))

