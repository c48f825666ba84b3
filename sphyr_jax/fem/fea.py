"""Finite-element analysis: SIMP moduli, solves, compliance, structural response.

Public functions take a :class:`~sphyr_jax.problem.loadcase.LoadCase` and densities
with any leading batch axes (broadcast against each other) and are pure JAX:
``jit``, ``vmap``, ``grad``, ``jvp`` and their compositions work.  Internally
the batch is flattened onto the last axis (the layout of the solvers); under
``jax.vmap`` the solver kernels fold the mapped axis into that same batch axis
(:mod:`sphyr_jax.fem.linear_solve`).

Solvers (:mod:`sphyr_jax.fem.solvers`; ``solver=`` takes an object or its
name, None picks :func:`~sphyr_jax.fem.solvers.default_solver`):

* :class:`Banded` (the 2D default): exact banded Cholesky, about 30x fewer
  flops than a dense one on a 10x10 grid.
* :class:`Dense`: dense Cholesky, the simplest exact path (2D).
* :class:`CG`: Jacobi-preconditioned conjugate gradients.
* :class:`Multigrid` (the 3D default): CG preconditioned by a geometric
  multigrid V-cycle, with a direct fallback on small grids.

Every solution carries a :class:`RESULTS` code per sample (``successful``,
``max_iterations_reached``, ``nonfinite_input``, ``no_load_path``,
``breakdown``); a failed solve gives NaN displacements and infinite
compliance, never a wrong number, and ``throw=True`` turns a failure into an
error.

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

from sphyr_jax.fem import linear_solve as ls
from sphyr_jax.fem import structured as st
from sphyr_jax.fem.array_types import (
    CellField,
    Densities,
    NodalField,
    Penalty,
    PerSample,
    SampleCodes,
)
from sphyr_jax.fem.elements import E0, EMIN
from sphyr_jax.fem.solvers import (
    CG,
    RESULT_MESSAGES,
    RESULTS,
    Banded,
    Dense,
    Multigrid,
    Solver,
    SolverLike,
    as_solver,
    default_solver,
    result_name,
)
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.runtime import enable_x64, require_x64
from sphyr_jax.sharding import bucket_size

SINGULARITY_RATIO = 1e3  # load_carrying iff c <= ratio * solid compliance

__all__ = [
    "CG", "RESULTS", "SINGULARITY_RATIO", "Analysis", "Banded", "Dense", "Multigrid",
    "Solution", "Solver", "analyze", "as_solver", "compliance", "default_solver",
    "dense_stiffness", "element_strain_energy", "enable_x64", "load_carrying", "require_x64",
    "result_name",
    "simp_moduli", "solve",
]


def simp_moduli(densities: Densities, *, penal: Penalty = 3.0) -> CellField:
    r"""SIMP moduli $E(\rho) = E_{min} + \rho^p (E_0 - E_{min})$, $\rho$ clipped to [0, 1]."""
    rho = jnp.clip(densities, 0.0, 1.0)
    return EMIN + rho**penal * (E0 - EMIN)


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
        displacements: (..., n_dofs); NaN where the solve did not succeed.
        compliance: (...) $c = f \\cdot u$; +inf where the problem has no load,
            no support, non-finite densities, or the solve did not succeed.
        result: (...) int32 :class:`RESULTS` code of each solve
            (:func:`result_name` names it).
        iterations: (...) CG iterations (0 for the direct solvers).
    """

    displacements: NodalField
    compliance: PerSample
    result: SampleCodes
    iterations: SampleCodes

    @property
    def converged(self) -> jax.Array:
        """(...) bool: the solve succeeded (``result == RESULTS.successful``)."""
        return self.result == RESULTS.successful


def _prepare(load_case: LoadCase, densities, penal):
    """Flatten the batch, move it last, and swap ill-posed problems for harmless ones.

    Where-twice: a problem without load or support, or with non-finite
    densities, is replaced by a well-posed one before the solve, so neither its
    value nor its gradient can turn into NaN; its compliance is reported inf.

    Returns:
        (batch shape, moduli (*cells, B), force (n, B), free (n, B) floats,
        ok (B,): the design is well posed, posed (B,): the load case is,
        code (B,): the :class:`RESULTS` code the input alone decides, else 0).
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
    moduli = simp_moduli(safe_rho, penal=penal)
    finite = finite_rho & jnp.isfinite(penal).reshape(-1) & jnp.all(jnp.isfinite(force), axis=-1)
    code = jnp.where(~posed, RESULTS.no_load_path,
                     jnp.where(~finite, RESULTS.nonfinite_input, RESULTS.successful))
    return (batch, jnp.moveaxis(moduli, 0, -1), force.T,
            safe_free.T.astype(jnp.float64), ok, posed, code.astype(jnp.int32))


def _finalise(c, ok):
    valid = ok & jnp.isfinite(c) & (c >= 0.0)
    return jnp.where(valid, c, jnp.inf)


def _result(code, solver_code, c):
    """The input's code where it decides, else the solver's; ``breakdown`` for a
    successful solve whose compliance is not a finite non-negative number."""
    out = jnp.where(code != RESULTS.successful, code, solver_code)
    bad = (out == RESULTS.successful) & ~(jnp.isfinite(c) & (c >= 0.0))
    return jnp.where(bad, RESULTS.breakdown, out).astype(jnp.int32)


def _throw(out, result):
    """``out`` unchanged, or an error naming the first failed sample's result."""
    return eqx.branched_error_if(out, result != RESULTS.successful, result, RESULT_MESSAGES)


def _kernels(load_case: LoadCase, solver):
    return ls.kernels(load_case.shape, as_solver(solver, load_case.shape))


def _solve_impl(load_case, densities, penal, solver, throw=False, x0=None,
                keep_factor=True) -> Solution:
    batch, moduli, force, free, ok, posed, code = _prepare(load_case, densities, penal)
    if x0 is not None:
        n = force.shape[0]
        x0 = jnp.broadcast_to(jnp.asarray(x0, jnp.float64), batch + (n,)).reshape(-1, n).T * free
    u, solver_code, its = ls.linear_solve(_kernels(load_case, solver), moduli, free,
                                          force * free, reuse_state=keep_factor, x0=x0)
    c_raw = jnp.sum(force * u, axis=0)
    result = _result(code, solver_code, c_raw)
    n = force.shape[0]
    sol = Solution(
        displacements=u.T.reshape(batch + (n,)),
        compliance=_finalise(c_raw, ok).reshape(batch),
        result=result.reshape(batch),
        iterations=its.reshape(batch),
    )
    return _throw(sol, sol.result) if throw else sol


def _compliance_impl(load_case, densities, penal, solver, throw=False) -> jax.Array:
    batch, moduli, force, free, ok, posed, code = _prepare(load_case, densities, penal)
    shape = load_case.shape
    c = ls.compliance_rule(shape, as_solver(solver, shape))(moduli, force * free, free)
    out = _finalise(c, ok).reshape(batch)
    if throw:
        failed = jnp.where(jnp.isfinite(c), RESULTS.successful, RESULTS.breakdown)
        out = _throw(out, _result(code, failed, c).reshape(batch))
    return out


class Analysis(eqx.Module):
    """Structural response of designs (fields batched like the input).

    Attributes:
        compliance: raw compliance (lower is stiffer), inf if invalid.
        volume_fraction: mean density over the whole grid.
        max_displacement: largest nodal displacement magnitude.
        load_carrying: compliance finite and <= 1e3 x the solid grid's.
        solid_compliance: compliance of the all-ones grid.
        result: int32 :class:`RESULTS` code of the design's solve.
    """

    compliance: PerSample
    volume_fraction: PerSample
    max_displacement: PerSample
    load_carrying: jax.Array
    solid_compliance: PerSample
    result: SampleCodes

    @property
    def converged(self) -> jax.Array:
        """The design's solve succeeded (``result == RESULTS.successful``)."""
        return self.result == RESULTS.successful


def load_carrying(compliance_, solid_compliance) -> jax.Array:
    r"""Whether designs carry their load: compliance finite and
    $c \le$ :data:`SINGULARITY_RATIO` $\times$ the all-solid grid's (any
    shapes that broadcast; NumPy in, NumPy out, with nothing to compile)."""
    xp = np if all(isinstance(a, np.ndarray) for a in (compliance_, solid_compliance)) else jnp
    return (xp.isfinite(compliance_) & xp.isfinite(solid_compliance)
            & (compliance_ <= SINGULARITY_RATIO * solid_compliance))


def _analyze_impl(load_case, densities, penal, solver, throw=False,
                  solid_compliance=None) -> Analysis:
    densities = jnp.asarray(densities, dtype=jnp.float64)
    batch, moduli, force, free, ok, posed, code = _prepare(load_case, densities, penal)
    nb = force.shape[1]
    if solid_compliance is None:
        # The design and the solid grid in one batched solve (one factorisation kernel).
        solid_moduli = simp_moduli(jnp.ones_like(moduli), penal=jnp.broadcast_to(
            jnp.asarray(penal, jnp.float64), batch).reshape(-1))
        moduli = jnp.concatenate([moduli, solid_moduli], axis=-1)
        free2, force2 = jnp.concatenate([free, free], axis=-1), jnp.concatenate([force] * 2, -1)
    else:
        free2, force2 = free, force
    u, solver_code, _ = ls.linear_solve(_kernels(load_case, solver), moduli, free2,
                                        force2 * free2, reuse_state=False)
    c_both = jnp.sum(force2 * u, axis=0)
    compliance_ = _finalise(c_both[:nb], ok).reshape(batch)
    result = _result(code, solver_code[:nb], c_both[:nb]).reshape(batch)
    if solid_compliance is None:
        solid = _finalise(c_both[nb:], posed).reshape(batch)
    else:
        solid = jnp.broadcast_to(jnp.asarray(solid_compliance, jnp.float64), batch)
    u = u[:, :nb].T.reshape(batch + (-1, load_case.ndim))
    max_disp = jnp.max(jnp.sqrt(jnp.sum(u * u, axis=-1)), axis=-1)
    carrying = load_carrying(compliance_, solid)
    rho = jnp.clip(jnp.where(jnp.isfinite(densities), densities, 0.0), 0.0, 1.0)
    vf = jnp.broadcast_to(jnp.mean(rho, axis=_grid_axes(load_case)), compliance_.shape)
    out = Analysis(
        compliance=compliance_,
        volume_fraction=vf,
        max_displacement=jnp.where(jnp.isfinite(compliance_), max_disp, 0.0),
        load_carrying=carrying,
        solid_compliance=solid,
        result=result,
    )
    return _throw(out, result) if throw else out


# ----------------------------------------------------------------------------
# Public, batch-first API.  Each function is one module-level jitted program
# per (grid shape, solver, batch bucket): called eagerly, any batch is
# flattened and padded up to a power of two (a new sample, mask, budget or
# load direction never compiles again); under a caller's jit/vmap/grad the
# program is simply inlined.

_IMPLS = {"solve": _solve_impl, "compliance": _compliance_impl, "analyze": _analyze_impl}
_JIT = {name: jax.jit(fn, static_argnames=("solver", "throw")
                      + (("keep_factor",) if name == "solve" else ()))
        for name, fn in _IMPLS.items()}
# With throw=True: equinox's filter_jit, which reports a failed check as a readable error.
_JIT_THROW = {name: eqx.filter_jit(fn) for name, fn in _IMPLS.items()}


def _is_traced(tree) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


# Optional per-sample inputs of the programs: the rank of one sample's entry.
_EXTRA_RANK = {"x0": 1, "solid_compliance": 0}


def _call(name: str, load_case: LoadCase, densities, penal, solver, throw: bool,
          static=None, **extra):
    """Run one public program; eager batches are flattened and bucketed.

    ``extra`` holds optional per-sample arrays (:data:`_EXTRA_RANK`: ``x0``
    (..., n_dofs), ``solid_compliance`` (...)), passed through like the densities.
    """
    require_x64()
    solver = as_solver(solver, load_case.shape)
    extra = {k: v if _is_traced(v) else np.asarray(v, np.float64)
             for k, v in extra.items() if v is not None}
    fn = functools.partial((_JIT_THROW if throw else _JIT)[name], solver=solver,
                           throw=bool(throw), **(static or {}))
    if _is_traced((load_case, densities, penal, extra)):
        return fn(load_case, densities, penal, **extra)
    densities = np.asarray(densities, np.float64)
    penal = np.asarray(penal, np.float64)
    shape = load_case.shape
    _check_shape(load_case, densities)
    batch = np.broadcast_shapes(load_case.batch_shape, densities.shape[:-load_case.ndim],
                                penal.shape)
    if not batch:
        return fn(load_case, densities, penal, **extra)
    nb = math.prod(batch)
    size = bucket_size(nb)
    if (batch == (size,) and load_case.batch_shape == batch
            and densities.shape[:-load_case.ndim] == batch
            and all(np.shape(v)[:np.ndim(v) - _EXTRA_RANK[k]] == batch
                    for k, v in extra.items())):
        # A flat batch of a bucket's size: nothing to pad, broadcast or cut,
        # so the load case's arrays go in as they are (no host round trip).
        return fn(load_case, densities, np.broadcast_to(penal, batch), **extra)
    idx = np.minimum(np.arange(size), nb - 1)  # pad by repeating the last sample

    def flat(a, tail):
        a = np.broadcast_to(np.asarray(a), batch + tail).reshape((nb,) + tail)
        return a[idx]

    case = jax.tree.map(lambda a: flat(a, np.shape(a)[len(load_case.batch_shape):]),
                        load_case)
    extra = {k: flat(v, np.shape(v)[np.ndim(v) - _EXTRA_RANK[k]:]) for k, v in extra.items()}
    out = fn(case, flat(densities, shape), flat(penal, ()), **extra)
    # Unpad on the host: an eager slice would compile once per batch size.
    # (jax.device_put, not jnp.asarray: the latter stages a program per shape.)
    return jax.tree.map(
        lambda a: jax.device_put(np.asarray(a)[:nb].reshape(batch + a.shape[1:])), out)


def solve(load_case: LoadCase, densities: Densities, *, penal: Penalty = 3.0,
          solver: SolverLike = None, throw: bool = False, x0: NodalField | None = None,
          keep_factor: bool = True) -> Solution:
    """Solve $K(\\rho) u = f$ for densities with any leading batch axes.

    Differentiable in both modes (``jax.grad``, ``jax.jvp``, ``jax.jacfwd``,
    Hessian-vector products) with respect to the densities, the load vector
    ``load_case.force`` and the penalty: the solve sits behind
    ``lax.custom_linear_solve``, so a tangent or a cotangent costs one more
    solve with the same factorisation.  ``jax.vmap`` over it runs the same
    batched kernels as a native batch.

    Args:
        load_case: boundary conditions (possibly batched).
        densities: (..., *cells) densities, clipped to [0, 1]; the batch axes
            broadcast against the load case's.
        penal: SIMP exponent $p$, a scalar or an array of the batch shape.
        solver: a solver object (:class:`Banded`, :class:`Dense`, :class:`CG`,
            :class:`Multigrid`), its name, or None (:func:`default_solver`).
        throw: raise an error (at run time, also under ``jit``) if any solve
            did not succeed, naming its :class:`RESULTS` code.
        x0: optional (..., n_dofs) initial guess of the iterative solvers
            (e.g. the previous displacements of an optimisation loop); the
            direct solvers ignore it.
        keep_factor: keep the solver's factorisation for the extra solves of
            derivatives (the default); False factors and solves in one step
            and keeps nothing, cheaper when no derivative of the displacements
            is taken (derivatives stay exact: each one factors again).

    Returns:
        A :class:`Solution` with the broadcast batch shape.
    """
    return _call("solve", load_case, densities, penal, solver, throw,
                 static={"keep_factor": bool(keep_factor)}, x0=x0)


def compliance(load_case: LoadCase, densities: Densities, *, penal: Penalty = 3.0,
               solver: SolverLike = None, throw: bool = False) -> PerSample:
    """Compliance $c = f \\cdot u$ of densities under a load case.

    jit-able, vmap-able, batchable (see :func:`solve` for the arguments) and
    differentiable in both modes with respect to the densities, the force and
    the penalty.  Compliance is self-adjoint ($\\partial c / \\partial E_e =
    -u_e^T K_e u_e$, $\\partial c / \\partial f = 2 u$), so neither a gradient
    nor a JVP needs an extra solve; a Hessian-vector product needs one.

    Returns:
        (...) compliance; +inf for load-less, support-less or invalid problems
        and for solves that did not succeed (:func:`solve` reports why).
    """
    return _call("compliance", load_case, densities, penal, solver, throw)


def analyze(load_case: LoadCase, densities: Densities, *, penal: Penalty = 3.0,
            solver: SolverLike = None, throw: bool = False,
            solid_compliance: PerSample | None = None) -> Analysis:
    """Solve a design and report its structural response.

    Densities are used as given (callers set L/S cells solid; see
    :func:`sphyr_jax.scoring.metrics.get_structural_metrics`).

    Args:
        solid_compliance: optional (...) compliance of the all-solid grid of
            each sample (it depends on the load case only, so callers scoring
            many designs of one sample pass the value of an earlier analysis);
            None: solved here, beside the design.
    """
    return _call("analyze", load_case, densities, penal, solver, throw,
                 solid_compliance=solid_compliance)


@jax.jit
def _strain_energy(load_case: LoadCase, displacements):
    grid = st.get_grid(load_case.shape)
    batch = displacements.shape[:-1]
    u = jnp.asarray(displacements, jnp.float64).reshape((-1, grid.n_dofs)).T
    e = st.element_energy(grid, u, u)
    return jnp.moveaxis(e, -1, 0).reshape(batch + load_case.shape)


def element_strain_energy(load_case: LoadCase, displacements: NodalField) -> CellField:
    """Unit-modulus element energies $u_e^T K_e u_e$, (..., *cells)."""
    return _strain_energy(load_case, displacements)


@jax.jit
def _dense_stiffness(free_dofs, densities, penal):
    grid = st.get_grid(densities.shape)
    moduli = simp_moduli(jnp.asarray(densities, jnp.float64), penal=penal)[..., None]
    return st.dense_matrix(grid, moduli, free_dofs.astype(jnp.float64)[:, None])[0]


def dense_stiffness(load_case: LoadCase, densities: Densities, *, penal: float = 3.0
                    ) -> np.ndarray:
    """Masked dense stiffness matrix of one sample (for inspection and tests)."""
    return np.asarray(_dense_stiffness(load_case.free_dofs, np.asarray(densities, np.float64),
                                       np.float64(penal)))
