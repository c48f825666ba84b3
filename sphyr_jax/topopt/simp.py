"""SIMP topology optimisation on SPhyR grids, batched in one compiled loop.

Minimum compliance with a whole-grid material budget:

$$\\min_x\\; c(\\tilde x) = f^T u \\quad\\text{s.t.}\\quad K(\\tilde x) u = f,\\;
\\sum_i \\tilde x_i \\le V,\\; 0 \\le x \\le 1,$$

where only the cells of the design mask are variables, every other cell keeps
its pinned density (load and support cells are passive solid), $\\tilde x$ is
the cone-filtered design ($\\tilde x_i = \\sum_j H_{ij} x_j / \\sum_j H_{ij}$ on
design cells, pinned elsewhere) and $V$ = volume fraction x cells, the pinned
material paid first.  Sensitivities come from ``jax.grad`` of
:func:`sphyr_jax.fem.fea.compliance` through its custom VJP (one extra solve with
the same factorisation) and through the filter; the update is the classic
optimality-criteria rule with a move limit and a bisection on the volume
multiplier.  Every sample of a batch runs in the same ``lax.while_loop`` with
its own convergence flag (largest design change below ``tol``), so samples
with different load cases, masks, budgets and penalties batch together.  The
budget follows :mod:`sphyr_jax.topopt.budget`.

Arrays are batch-first: designs (B, nely, nelx), flattened to (B, nel) inside.
"""

from __future__ import annotations

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import fea
from sphyr_jax.fem.array_types import Densities, FlatDesigns, Penalty
from sphyr_jax.fem.solvers import SolverLike
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.runtime import bounded_cache
from sphyr_jax.topopt.budget import free_budget

DEFAULT_FILTER_RADIUS = 1.2
DEFAULT_MOVE_LIMIT = 0.2
DEFAULT_TOLERANCE = 1e-3
DEFAULT_MAX_ITERATIONS = 500
BISECTION_STEPS = 100  # enough for the tolerance from [1e-9, 1e9] at any multiplier
BISECTION_TOL = 1e-6


@dataclasses.dataclass(frozen=True)
class SimpOptions:
    """Static SIMP settings.

    Attributes:
        filter_radius: cone filter radius in cells (1.2: a cell and its 4 edge
            neighbours).
        move_limit: largest change of a design variable per iteration.
        tol: convergence threshold on the largest design change.
        max_iterations: iteration bound.
        solver: linear solver (a :mod:`sphyr_jax.fem.solvers` object or name;
            None: the grid's default).
    """

    filter_radius: float = DEFAULT_FILTER_RADIUS
    move_limit: float = DEFAULT_MOVE_LIMIT
    tol: float = DEFAULT_TOLERANCE
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    solver: SolverLike = None


DEFAULT_OPTIONS = SimpOptions()


@bounded_cache(maxsize=32)
def cell_distances(cells: tuple[int, ...]) -> np.ndarray:
    """Centre-to-centre distances (nel, nel) of the cells of a 2D or 3D grid (row-major)."""
    coords = np.stack(np.unravel_index(np.arange(int(np.prod(cells))), cells), axis=1)
    return np.sqrt(np.sum((coords[:, None] - coords[None, :]) ** 2, axis=-1))


def filter_matrix(*cells_and_radius) -> np.ndarray:
    """Dense cone filter weights $H_{ij} = \\max(0, r - d_{ij})$, (nel, nel).

    Called as ``filter_matrix(nely, nelx[, radius])`` or, for any dimension,
    ``filter_matrix((nz, ny, nx), radius)``.  Radius 1.2 (the default) keeps a
    cell and its edge (2D) or face (3D) neighbours.
    """
    if isinstance(cells_and_radius[0], tuple):
        cells, rest = cells_and_radius[0], cells_and_radius[1:]
    else:
        cells, rest = tuple(cells_and_radius[:2]), cells_and_radius[2:]
    radius = rest[0] if rest else DEFAULT_FILTER_RADIUS
    return np.maximum(0.0, radius - cell_distances(tuple(int(n) for n in cells)))


def apply_filter(x: Densities, *, radius: float = DEFAULT_FILTER_RADIUS, ndim: int = 2
                 ) -> jax.Array:
    """Cone-filter designs (..., *cells): $\\tilde x = H x / (H \\mathbf{1})$."""
    shape = x.shape[-ndim:]
    h = jnp.asarray(filter_matrix(tuple(shape), radius))
    flat = x.reshape(x.shape[:-ndim] + (-1,))
    out = flat @ h.T / jnp.sum(h, axis=1)
    return out.reshape(x.shape)


def physical_densities(x: Densities, design_mask, pinned, *,
                       radius: float = DEFAULT_FILTER_RADIUS, ndim: int = 2) -> jax.Array:
    """Filtered design on design cells, pinned densities everywhere else."""
    full = jnp.where(design_mask, x, pinned)
    return jnp.where(design_mask, apply_filter(full, radius=radius, ndim=ndim), pinned)


def initial_design(load_case: LoadCase, warm_start=None):
    """Uniform budget on design cells (cold) or a clipped warm start."""
    free, _ = free_budget(load_case.design_mask, load_case.pinned, load_case.volume_fraction,
                          ndim=load_case.ndim)
    axes = tuple(range(-load_case.ndim, 0))
    n_design = jnp.maximum(jnp.sum(load_case.design_mask, axis=axes), 1)
    uniform = (free / n_design).reshape(jnp.shape(n_design) + (1,) * load_case.ndim)
    start = uniform if warm_start is None else jnp.clip(warm_start, 1e-3, 1.0)
    return jnp.where(load_case.design_mask, start, load_case.pinned)


def oc_update(x: FlatDesigns, dc: FlatDesigns, dv: FlatDesigns, design_mask, target_volume,
              const_volume, *, move_limit: float) -> FlatDesigns:
    """Optimality-criteria step with a bisection on the volume multiplier.

    $x^{new}(\\lambda) = \\mathrm{clip}(x \\sqrt{-\\partial c / (\\lambda\\,\\partial V)},
    x \\pm m, [0, 1])$.  The multiplier is bisected arithmetically on
    $[10^{-9}, 10^9]$ until $(\\lambda_2 - \\lambda_1) / (\\lambda_1 + \\lambda_2) \\le
    10^{-6}$ and the design of the last midpoint is returned, as in the
    classic 88-line code and the reference implementation (so both follow the
    same optimisation paths).  The volume of the filtered design is linear in
    $x$ (weights ``dv``), so each bisection step costs O(n); the loop is a
    bounded ``fori_loop`` in which finished samples stop moving.

    Args:
        x: (B, nel) current design (pinned values off the design mask).
        dc: (B, nel) compliance sensitivity (<= 0 on design cells).
        dv: (B, nel) volume sensitivity (> 0 on design cells).
        design_mask: (B, nel) bool.
        target_volume: (B,) volume budget of the whole grid.
        const_volume: (B,) volume not controlled by the design variables.
        move_limit: largest change per variable.
    """
    ratio2 = jnp.maximum(-dc, 0.0) / jnp.maximum(dv, 1e-12)
    lo_move = x - move_limit
    hi_move = x + move_limit

    def candidate(lam):
        new = jnp.clip(jnp.clip(x * jnp.sqrt(ratio2 / lam[:, None]), lo_move, hi_move), 0.0, 1.0)
        return jnp.where(design_mask, new, x)

    def volume(new):
        return jnp.sum(jnp.where(design_mask, dv * new, 0.0), axis=-1) + const_volume

    def body(_, carry):
        lo, hi, mid = carry
        active = (hi - lo) / (lo + hi) > BISECTION_TOL
        m = 0.5 * (lo + hi)
        over = volume(candidate(m)) > target_volume
        lo = jnp.where(active & over, m, lo)
        hi = jnp.where(active & ~over, m, hi)
        return lo, hi, jnp.where(active, m, mid)

    nb = x.shape[0]
    lo = jnp.full((nb,), 1e-9)
    hi = jnp.full((nb,), 1e9)
    _, _, mid = jax.lax.fori_loop(0, BISECTION_STEPS, body, (lo, hi, 0.5 * (lo + hi)))
    return candidate(mid)


class SimpResult(eqx.Module):
    """Outcome of a batch of SIMP runs (batch-first).

    Attributes:
        densities: (B, nely, nelx) physical (filtered, pinned) densities.
        design: (B, nely, nelx) design variables at the end.
        compliance: (B,) compliance of ``densities`` at the run's penalty.
        volume_fraction: (B,) mean of ``densities``.
        iterations: (B,) iterations used.
        converged: (B,) largest design change fell below tol.
    """

    densities: jax.Array
    design: jax.Array
    compliance: jax.Array
    volume_fraction: jax.Array
    iterations: jax.Array
    converged: jax.Array


def _flat(a, ndim: int = 2):
    return a.reshape(a.shape[:-ndim] + (-1,))


def _value_and_grad(compliance_fn, x):
    """Per-sample compliances and their gradients (samples are independent)."""

    def total(z):
        c = compliance_fn(z)
        return jnp.sum(jnp.where(jnp.isfinite(c), c, 0.0)), c

    (_, c), g = jax.value_and_grad(total, has_aux=True)(x)
    return c, g


class SimpState(eqx.Module):
    """Loop state of a batch of SIMP runs (batch-first).

    Attributes:
        x: (B, nel) design variables (pinned values off the design mask).
        iterations: (B,) iterations done.
        done: (B,) run finished (converged, iteration bound or invalid).
        change: (B,) largest design change of the last iteration.
    """

    x: jax.Array
    iterations: jax.Array
    done: jax.Array
    change: jax.Array


class _Problem(eqx.Module):
    """Per-sample arrays of a SIMP run derived once from the load case."""

    mask: jax.Array
    pinned: jax.Array
    dv: jax.Array
    target: jax.Array
    const_volume: jax.Array


def _problem(load_case: LoadCase, h, hs) -> _Problem:
    mask = _flat(jnp.asarray(load_case.design_mask, bool), load_case.ndim)
    pinned = _flat(jnp.asarray(load_case.pinned, jnp.float64), load_case.ndim)
    free, pinned_volume = free_budget(load_case.design_mask, load_case.pinned,
                                      load_case.volume_fraction, ndim=load_case.ndim)
    target = pinned_volume + free
    # Volume of the physical design = sum_j dv_j x_j (design cells) + const.
    weights = jnp.einsum("bi,bij->bj", mask / hs, h)  # sum over design rows i of H_ij / hs_i
    off = jnp.where(mask, 0.0, pinned)
    return _Problem(
        mask=mask,
        pinned=pinned,
        dv=jnp.where(mask, weights, 0.0),
        target=target,
        const_volume=jnp.sum(off, axis=-1) + jnp.sum(off * weights, axis=-1),
    )


def _filter_arrays(shape, radius):
    """Per-run cone filters (B, nel, nel) and row sums (B, nel) for radii (B,)."""
    dist = cell_distances(tuple(shape))
    h = jnp.maximum(0.0, jnp.asarray(radius, jnp.float64)[:, None, None] - dist[None])
    return h, jnp.sum(h, axis=2)


def _apply(h, hs, x):
    return jnp.einsum("bij,bj->bi", h, x) / hs


def _radius(radius, options: SimpOptions, nb: int):
    if radius is None:
        return jnp.full((nb,), options.filter_radius)
    return jnp.broadcast_to(jnp.asarray(radius, jnp.float64), (nb,))


def init_state(load_case: LoadCase, x0=None) -> SimpState:
    """Start of a batch of runs: cold (uniform budget) or warm from ``x0``."""
    x = _flat(initial_design(load_case, x0), load_case.ndim)
    nb = x.shape[0]
    return SimpState(
        x=x,
        iterations=jnp.zeros((nb,), jnp.int32),
        done=jnp.zeros((nb,), bool),
        change=jnp.full((nb,), jnp.inf),
    )


def run_segment(load_case: LoadCase, penal: Penalty, state: SimpState, *,
                options: SimpOptions, steps: int, radius=None) -> SimpState:
    """Advance every unfinished run by up to ``steps`` SIMP iterations.

    Pure and jit-able (``options`` and ``steps`` static; ``radius`` (B,) gives
    each run its own filter radius, default ``options.filter_radius``).  Runs stop
    individually when their largest design change falls below ``options.tol``,
    when they reach ``options.max_iterations``, or when their compliance is
    not finite; finished runs are carried along unchanged.
    """
    shape = load_case.shape
    nb = state.x.shape[0]
    h, hs = _filter_arrays(shape, _radius(radius, options, nb))
    prob = _problem(load_case, h, hs)
    penal = jnp.broadcast_to(jnp.asarray(penal, jnp.float64), (nb,))

    def compliance_of(x):
        rho = jnp.where(prob.mask, _apply(h, hs, x), prob.pinned).reshape((nb,) + shape)
        return fea.compliance(load_case, rho, penal=penal, solver=options.solver)

    def cond(carry):
        it, st = carry
        return (it < steps) & ~jnp.all(st.done)

    def body(carry):
        it, st = carry
        c, dc = _value_and_grad(compliance_of, st.x)
        new = oc_update(st.x, dc, prob.dv, prob.mask, prob.target, prob.const_volume,
                        move_limit=options.move_limit)
        change = jnp.max(jnp.where(prob.mask, jnp.abs(new - st.x), 0.0), axis=-1)
        its = st.iterations + jnp.where(st.done, 0, 1)
        done = (st.done | (change < options.tol) | ~jnp.isfinite(c)
                | (its >= options.max_iterations))
        return it + 1, SimpState(
            x=jnp.where(st.done[:, None], st.x, new),
            iterations=its,
            done=done,
            change=jnp.where(st.done, st.change, change),
        )

    done0 = state.done | (state.iterations >= options.max_iterations)
    state = eqx.tree_at(lambda s: s.done, state, done0)
    _, state = jax.lax.while_loop(cond, body, (jnp.asarray(0), state))
    return state


def finish(load_case: LoadCase, penal: Penalty, state: SimpState, *, options: SimpOptions,
           radius=None) -> SimpResult:
    """Physical densities and compliance at the end of a batch of runs."""
    shape = load_case.shape
    nb = state.x.shape[0]
    h, hs = _filter_arrays(shape, _radius(radius, options, nb))
    prob = _problem(load_case, h, hs)
    rho = jnp.where(prob.mask, _apply(h, hs, state.x), prob.pinned).reshape((nb,) + shape)
    penal = jnp.broadcast_to(jnp.asarray(penal, jnp.float64), (nb,))
    c = fea.compliance(load_case, rho, penal=penal, solver=options.solver)
    return SimpResult(
        densities=rho,
        design=state.x.reshape((nb,) + shape),
        compliance=c,
        volume_fraction=jnp.mean(rho, axis=tuple(range(-load_case.ndim, 0))),
        iterations=state.iterations,
        converged=state.change < options.tol,
    )


@functools.partial(jax.jit, static_argnames=("options",))
def optimize(load_case: LoadCase, *, penal: Penalty, x0: Densities | None = None,
             options: SimpOptions = DEFAULT_OPTIONS, radius=None) -> SimpResult:
    """Run SIMP on a batch of samples in one compiled loop.

    Every run iterates in lockstep until all are finished; for large,
    heterogeneous batches :func:`sphyr_jax.topopt.strong.run_simp_batch` schedules
    runs through a slot pool instead, so early finishers do not idle.

    Args:
        load_case: batched load cases (leading axis B) with design masks and
            budgets (``volume_fraction``).
        penal: (B,) or scalar SIMP penalty of each run.
        x0: optional (B, nely, nelx) warm start (used on design cells, clipped to
            [1e-3, 1]); without it runs start from the uniform budget.
        options: static settings.
        radius: optional (B,) filter radius of each run.

    Returns:
        A :class:`SimpResult`.
    """
    fea.require_x64()
    state = run_segment(load_case, penal, init_state(load_case, x0), options=options,
                        steps=options.max_iterations, radius=radius)
    return finish(load_case, penal, state, options=options, radius=radius)
