r"""Geometric multigrid as a CG preconditioner on structured grids, batched and matrix-free.

The ``Multigrid`` solver (:class:`sphyr_jax.fem.solvers.Multigrid`) solves
$\tilde K u = b$ with $\tilde K = D K D + (I - D)$ (see
:mod:`sphyr_jax.fem.structured`) for a batch of designs at once, in any dimension
(Q4 in 2D, H8 in 3D) and on any grid size, in pure JAX.  Following Amir, Aage
& Lazarov (2014) and Aage et al. (2015), the conjugate gradients of
:mod:`sphyr_jax.fem.cg` are preconditioned with one geometric-multigrid
V-cycle per iteration:

* Hierarchy (:mod:`sphyr_jax.fem.multigrid_levels`): level $l + 1$ halves every
  axis of level $l$ (an odd count is padded with one empty, zero-stiffness
  cell first), until the coarse system has at most ``max_coarse_dofs`` DOFs.
* Transfer: (bi/tri)linear prolongation $P$ on the node lattice (static slices,
  no gathers); restriction $P^T$.  On the finest level the prolongation is
  masked, $P_0 = D P$, so fixed DOFs never receive corrections.
* Coarse operators: Galerkin products $K_{l} = P^T K P$ of the
  unconstrained stiffness, formed element by element — a level-$l$
  element's matrix is $\sum_f E_f\, P_f^T K_e P_f$ over its fine
  descendants $f$, one product-sum of constant tables with the fine moduli
  (:func:`~sphyr_jax.fem.multigrid_levels.galerkin_from_fine`; deep levels
  from the level above).  Galerkin operators keep the $E_{min} = 10^{-9}$
  contrast of void regions on every level, which is what makes the cycle
  robust for 0/1 designs.  The supports enter the coarse levels as springs:
  every fixed fine DOF gets a spring of :data:`SPRING` times its diagonal
  stiffness, lumped onto the coarse DOFs by restriction
  ($\mathrm{diag}(P^T s)$).  Building a level is then a few matrix
  products instead of a masked triple product per element, and the cycle
  needs about one more CG iteration than
  with the exactly masked operators $P^T D K D P$.  The fine level is the
  exact masked operator, so the solution is unchanged.
* Smoother: damped Jacobi ($\omega = 0.5$; 3 sweeps before and after the
  coarse correction on the finest level, 1 on coarser ones; symmetric, so
  the V-cycle is an SPD preconditioner).  Defaults chosen on the
  converted SPhyR-3D answers (``benchmarks/fea3d_throughput.py`` takes the
  cycle's options as flags and measures them).
* Coarsest level: dense Cholesky of the assembled Galerkin matrix, rows
  without stiffness (padding) replaced by the identity, a relative
  $10^{-12}$ diagonal shift as safeguard; its inverse $X^T X$, $X = L^{-1}$,
  is formed once per hierarchy, so a coarse solve is one matrix-vector
  product.  Factor and inverse are plain JAX loops
  (:func:`sphyr_jax.fem.small_spd.spd_inverse_loop`): jaxlib's batched LAPACK
  Cholesky spreads a batch over XLA's CPU thread pool and waits for it, so
  two of them running at once (three solves of a training step, or several
  devices) could block every thread of a small pool for good.
* Direct fallback: a geometric hierarchy cannot see the rigid-body modes of
  small islands of material floating in $E_{min}$ void (scattered cells of a
  model's completion, isolated voxels of a rounding); each island adds six
  near-zero eigenvalues the cycle does not remove, and CG stalls.  A sample
  whose CG has not converged within ``max_iter`` iterations is solved again
  directly (only when some sample failed), on quadrilateral grids of any
  size and on voxel grids of at most ``direct_fallback_dofs`` DOFs: in CPU
  programs by LAPACK's banded Cholesky on the host, the failed samples of
  the batch in one call; elsewhere one sample at a time, by the XLA banded
  Cholesky in 2D and a dense Cholesky of the assembled matrix in 3D.  It is
  then reported converged.  Larger voxel grids report the failure instead.

Everything is batch-last: element moduli (*cells, B), nodal vectors
(n_dofs, B) in the flat DOF order of :mod:`sphyr_jax.fem.structured` (lattice
fields (d, *nodes, B) inside).  The options (smoothing sweeps, damping,
coarsening, fallback) are the fields of the ``Multigrid`` solver.  float64 is
required.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool

from sphyr_jax.fem import _banded, _lapack, cg, small_spd
from sphyr_jax.fem import structured as st
from sphyr_jax.fem.array_types import Codes, FreeMask, Moduli, Vectors
from sphyr_jax.fem.multigrid_levels import (
    coarse_element_matrices,
    galerkin_from_fine,
    plan,
    prolong,
    restrict,
)

COARSE_SHIFT = 1e-12
SPRING = 0.2  # coarse-level support springs, relative to the fixed DOF's stiffness
GEMM_TABLE = 1 << 19  # largest table of descendant matrices a level is formed from


# ----------------------------------------------------------------------------
# Preconditioner.


def build_hierarchy(options, moduli, free_lat):
    """Per-level operator data (a PyTree) for a batch of designs.

    Args:
        options: the ``Multigrid`` solver (its coarsening fields).
        moduli: (*cells, B) fine element moduli.
        free_lat: (d, *nodes, B) free mask in lattice layout (floats).

    Returns:
        A dict with the fine ``moduli``/``free``/``inv_diag``, per coarse level
        the element matrices ``kes``, the support ``springs`` and ``inv_diag``,
        and the inverse of the coarsest matrix ``coarse_inverse`` (B, n, n).
    """
    dim = moduli.ndim - 1
    levels = plan(tuple(moduli.shape[:dim]), max_coarse_dofs=options.max_coarse_dofs,
                  levels=options.levels)
    grid = st.get_grid(levels[0].cells)
    fine_diag = st.diagonal_lattice(grid, moduli, free_lat)
    data = {"moduli": moduli, "free": free_lat, "inv_diag": [1.0 / fine_diag], "kes": [],
            "springs": []}
    if len(levels) == 1:
        return data, levels
    springs = SPRING * st.diagonal_lattice(grid, moduli, jnp.ones_like(free_lat)) * (1.0 - free_lat)
    kes = None
    for li in range(1, len(levels)):
        if kes is None or _table_size(dim, li) <= GEMM_TABLE:
            kes = galerkin_from_fine(levels, li, moduli)
        else:
            kes = coarse_element_matrices(levels[li - 1], kes)
        springs = restrict(levels[li - 1], springs)
        g = st.get_grid(levels[li].cells)
        m = kes.shape[0]
        diag = st.nodal_accumulate_lattice(g, kes[jnp.arange(m), jnp.arange(m)]) + springs
        data["kes"].append(kes)
        data["springs"].append(springs)
        data["inv_diag"].append(jnp.where(diag > 0, 1.0 / jnp.where(diag > 0, diag, 1.0), 0.0))
    # Coarsest: dense Cholesky of the last level's matrix.
    coarse = st.get_grid(levels[-1].cells)
    kd = st.assemble_dense(coarse, kes)
    kd = kd + jax.vmap(jnp.diag)(jnp.moveaxis(st.from_lattice(coarse, springs), -1, 0))
    d = jnp.diagonal(kd, axis1=1, axis2=2)
    kd = kd + jax.vmap(jnp.diag)(jnp.where(d <= 0.0, 1.0, COARSE_SHIFT * d))
    data["coarse_inverse"] = small_spd.spd_inverse_loop(kd)
    return data, levels


def _table_size(dim: int, depth: int) -> int:
    """Entries of the descendant table of level ``depth`` ($m^2\\, 2^{depth\\, d}$)."""
    m = dim * 2**dim
    return m * m * 2 ** (depth * dim)


def _level_matvec(levels, data, li, x):
    if li == 0:
        grid = st.get_grid(levels[0].cells)
        return st.matvec_lattice(grid, data["moduli"], data["free"], x, stencil=grid.dim == 2)
    grid = st.get_grid(levels[li].cells)
    xe = st.element_values_lattice(grid, x)
    y = st.nodal_accumulate_lattice(grid, st.apply_element_matrices(data["kes"][li - 1], xe))
    return y + data["springs"][li - 1] * x


def _coarse_solve(levels, data, b):
    grid = st.get_grid(levels[-1].cells)
    flat = jnp.moveaxis(st.from_lattice(grid, b), -1, 0)  # (B, n)
    x = jnp.einsum("bij,bj->bi", data["coarse_inverse"], flat)
    return st.to_lattice(grid, jnp.moveaxis(x, 0, -1))


def vcycle(levels, options, data, b, *, li: int = 0):
    """One V-cycle $x \\approx \\tilde K_l^{-1} b$ from a zero initial guess (lattice layout)."""
    if li == len(levels) - 1 and li > 0:
        return _coarse_solve(levels, data, b)
    inv_d = data["inv_diag"][li]
    w = options.omega
    sweeps = options.smooth if li == 0 or options.coarse_smooth is None else options.coarse_smooth
    x = w * inv_d * b
    for _ in range(sweeps - 1):
        x = x + w * inv_d * (b - _level_matvec(levels, data, li, x))
    if len(levels) > 1:
        r = b - _level_matvec(levels, data, li, x)
        if li == 0:
            r = r * data["free"]
        ec = vcycle(levels, options, data, restrict(levels[li], r), li=li + 1)
        corr = prolong(levels[li], ec)
        if li == 0:
            corr = corr * data["free"]
        x = x + corr
    for _ in range(sweeps):
        x = x + w * inv_d * (b - _level_matvec(levels, data, li, x))
    return x


def direct_solve(grid: st.StructuredGrid, moduli, free, rhs):
    """Direct solve of $\\tilde K x = b$ for one sample: the banded Cholesky
    on quadrilateral grids, a dense Cholesky otherwise.

    Args:
        moduli: (*cells,) element moduli; free, rhs: (n_dofs,) flat.

    Returns:
        x (n_dofs,).
    """
    if grid.dim == 2:
        plan = _banded.get_plan(grid.cells)
        fac = _banded.factor(plan, _banded.row_band(plan, moduli[..., None], free[:, None]))
        return _banded.solve(plan, fac, rhs[:, None])[:, 0]
    fe = st.element_values(grid, free[:, None])[..., 0]  # (m, *cells)
    ke = jnp.asarray(grid.element.ke, moduli.dtype)
    kes = ke.reshape(ke.shape + (1,) * moduli.ndim) * (fe[:, None] * fe[None]) * moduli
    k = st.assemble_dense(grid, kes[..., None])[0] + jnp.diag(1.0 - free)
    return jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(k), True), rhs)


def _with_fallback(grid, moduli, free, rhs, x, converged):
    """Re-solve the samples whose CG failed directly.

    In CPU programs, one batched call of LAPACK's banded Cholesky on the host
    (:mod:`sphyr_jax.fem._lapack`, any dimension; the converged samples enter
    as identities and cost nothing): $O(n k^2)$ per sample for the
    half-bandwidth $k$ of the grid, against $O(n^3)$ for a dense
    factorisation, and no dense matrix in the program.  Elsewhere
    :func:`direct_solve`, one sample at a time.
    """
    def on_host(_):
        failed = free * (1.0 - converged.astype(free.dtype))
        direct = _lapack.jax_factor_solve(moduli, failed, rhs.T[:, None, :])[:, 0].T
        return jnp.where(converged, x, direct)

    def one_by_one(_):
        def one(args):
            ok, m, f, b, xi = args
            return jax.lax.cond(ok, lambda: xi, lambda: direct_solve(grid, m, f, b))

        return jax.lax.map(one, (converged, jnp.moveaxis(moduli, -1, 0), free.T, rhs.T, x.T)).T

    fix = on_host if jax.default_backend() == "cpu" else one_by_one
    return jax.lax.cond(jnp.all(converged), lambda _: x, fix, None)


def solve(options, moduli: Moduli, free: FreeMask, rhs: Vectors, *, x0: Vectors | None = None
          ) -> tuple[Vectors, Bool[Array, " batch"], Codes]:
    """Multigrid-preconditioned CG on flat vectors, with the direct fallback.

    Args:
        options: the ``Multigrid`` solver (tolerance, iteration bound, cycle
            and fallback fields).
        moduli: (*cells, B) element moduli.
        free: (n_dofs, B) free-DOF mask (0/1 floats).
        rhs: (n_dofs, B) right-hand sides, zero on fixed DOFs.
        x0: optional (n_dofs, B) initial guess.

    Returns:
        ``(x, converged, iterations)``.  Samples whose CG did not converge are
        solved directly (2D grids, and voxel grids of at most
        ``options.direct_fallback_dofs`` DOFs) and then count as converged;
        their ``iterations`` stay at the CG bound.
    """
    grid = st.get_grid(tuple(moduli.shape[:-1]))
    free = jnp.asarray(free, moduli.dtype)
    free_lat = st.to_lattice(grid, free)
    data, levels = build_hierarchy(options, moduli, free_lat)

    def precondition(r):
        if len(levels) == 1:  # no coarse level: a plain Jacobi preconditioner
            return data["inv_diag"][0] * r
        return vcycle(levels, options, data, r)

    x, conv, its = cg.pcg(
        lambda v: st.matvec_lattice(grid, moduli, free_lat, v, stencil=grid.dim == 2),
        precondition,
        st.to_lattice(grid, rhs), tol=options.tol, max_iter=options.max_iter,
        x0=None if x0 is None else st.to_lattice(grid, x0))
    x = st.from_lattice(grid, x)
    fallback = options.direct_fallback_dofs > 0 and (
        grid.dim == 2 or grid.n_dofs <= options.direct_fallback_dofs)
    if fallback:
        x = _with_fallback(grid, moduli, free, rhs, x, conv)
        conv = jnp.all(jnp.isfinite(x), axis=0)
    return x, conv, its
