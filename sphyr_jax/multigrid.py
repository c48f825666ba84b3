r"""Batched, matrix-free multigrid-preconditioned conjugate gradients on structured grids.

Solves $\tilde K u = b$ with $\tilde K = D K D + (I - D)$ (see
:mod:`sphyr_jax.structured`) for a batch of designs at once, in any dimension
(Q4 in 2D, H8 in 3D) and on any grid size, in pure JAX.  Following Amir, Aage
& Lazarov (2014) and Aage et al. (2015), CG is preconditioned with one
geometric-multigrid V-cycle per iteration:

* Hierarchy: level $l + 1$ halves every axis of level $l$ (an odd count is
  padded with one empty, zero-stiffness cell first), until the coarse system
  has at most ``max_coarse_dofs`` DOFs.
* Transfer: (bi/tri)linear prolongation $P$ on the node lattice (static slices,
  no gathers); restriction $P^T$.  On the finest level the prolongation is
  masked, $P_0 = D P$, so fixed DOFs never receive corrections.
* Coarse operators: exact Galerkin products $K_{l+1} = P^T K_l P$, formed
  element by element — a coarse element's matrix is
  $\sum_j P_j^T K^{(j)} P_j$ over its $2^d$ children $j$ ($P_j$ the fixed
  interpolation from the coarse element's nodes to child $j$'s nodes, and on
  the finest level $K^{(j)} = E_j\,\mathrm{diag}(d_j) K_e\,\mathrm{diag}(d_j)$).
  Galerkin operators keep the $E_{min} = 10^{-9}$ contrast of void regions
  exact on every level, which is what makes the cycle robust for 0/1 designs.
* Smoother: damped Jacobi ($\omega = 0.5$; 3 sweeps before and after the
  coarse correction on the finest level, 1 on coarser ones; symmetric, so
  the V-cycle is an SPD preconditioner).  Defaults measured best on the
  converted SPhyR-3D answers (about 30 iterations to $10^{-10}$).
* Coarsest level: dense Cholesky of the assembled Galerkin matrix, rows
  without stiffness (padding) replaced by the identity, a relative
  $10^{-12}$ diagonal shift as safeguard; its inverse $X^T X$, $X = L^{-1}$,
  is formed once per hierarchy, so a coarse solve is one matrix-vector
  product.  Factor and inverse are plain JAX loops
  (:func:`sphyr_jax._small.spd_inverse_loop`): jaxlib's batched LAPACK
  Cholesky spreads a batch over XLA's CPU thread pool and waits for it, so
  two of them running at once (three solves of a training step, or several
  devices) could block every thread of a small pool for good.
* Direct fallback: a geometric hierarchy cannot see the rigid-body modes of
  small islands of material floating in $E_{min}$ void (scattered cells of a
  model's completion, isolated voxels of a rounding); each island adds six
  near-zero eigenvalues the cycle does not remove, and CG stalls.  A sample
  whose CG has not converged within ``max_iter`` iterations is solved again
  by a dense Cholesky factorisation of its assembled matrix (one sample at a
  time, only when some sample failed), on grids of at most
  ``direct_fallback_dofs`` DOFs; it is then reported converged.  Larger grids
  report the failure instead.

Everything is batch-last: element moduli (*cells, B), nodal vectors
(n_dofs, B) in the flat DOF order of :mod:`sphyr_jax.structured`.  CG runs in
lockstep over the batch inside a bounded ``lax.while_loop`` and reports, per
sample, whether $\|r\| \le \text{tol}\,\|b\|$ was reached and after how many
iterations.  Solves are differentiated with ``jax.custom_vjp`` (one more
MG-CG solve; the system is symmetric), never by unrolling the loop.

Entry points :func:`solve` and :func:`compliance` are jitted at module level
(compiled once per grid shape, batch size and :class:`MGOptions`).  float64 is
required.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax import _small
from sphyr_jax import structured as st

COARSE_SHIFT = 1e-12


@dataclasses.dataclass(frozen=True)
class MGOptions:
    """Static options of the MG-preconditioned CG (hashable; a jit static argument).

    Attributes:
        tol: CG stops once $\\|r\\|_2 \\le \\text{tol}\\, \\|b\\|_2$.
        max_iter: bound on CG iterations.
        smooth: damped-Jacobi sweeps before and after each coarse correction.
        omega: Jacobi damping factor.
        max_coarse_dofs: coarsen until the coarsest system has at most this
            many DOFs (then solved densely).
        levels: number of coarsenings; None picks it from ``max_coarse_dofs``.
        coarse_smooth: sweeps on the coarse levels (None: ``smooth``); their
            Galerkin element matrices make a coarse sweep cost more memory
            traffic than a fine one.
        direct_fallback_dofs: samples whose CG did not converge are solved
            by dense Cholesky on grids of at most this many DOFs (0: never).
    """

    tol: float = 1e-10
    max_iter: int = 100
    smooth: int = 3
    omega: float = 0.5
    max_coarse_dofs: int = 100
    levels: int | None = None
    coarse_smooth: int | None = 1
    direct_fallback_dofs: int = 6000

    def __post_init__(self):
        if (not self.tol > 0 or self.max_iter < 1 or self.smooth < 1
                or (self.coarse_smooth is not None and self.coarse_smooth < 1)):
            raise ValueError(f"invalid MGOptions: {self}")
        if not 0.0 < self.omega <= 1.0:
            raise ValueError(f"omega must lie in (0, 1], got {self.omega}")


# ----------------------------------------------------------------------------
# Static hierarchy plan.


@dataclasses.dataclass(frozen=True, eq=False)
class Level:
    """Static shapes of one level: ``cells`` (element counts) and their even padding."""

    cells: tuple[int, ...]

    @property
    def node_shape(self) -> tuple[int, ...]:
        return tuple(n + 1 for n in self.cells)

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(n + n % 2 for n in self.cells)

    @property
    def coarse(self) -> tuple[int, ...]:
        return tuple(p // 2 for p in self.padded)

    def n_dofs(self) -> int:
        return len(self.cells) * math.prod(self.node_shape)


@functools.lru_cache(maxsize=64)
def plan(cells: tuple[int, ...], max_coarse_dofs: int = 100,
         levels: int | None = None) -> tuple[Level, ...]:
    """The levels, finest first, for a grid of ``cells`` elements."""
    out = [Level(tuple(cells))]
    while True:
        last = out[-1]
        if levels is not None:
            if len(out) > levels:
                break
        elif last.n_dofs() <= max_coarse_dofs:
            break
        if max(last.cells) <= 1:
            break
        out.append(Level(last.coarse))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def child_interpolation(dim: int, nodal: bool = False) -> np.ndarray:
    """$P_j$ for every child $j$: (2^d, d 2^d, d 2^d), fine-local DOF x coarse-local DOF.

    With ``nodal=True`` the nodal weights $S_j$ (2^d, 2^d, 2^d), $P_j = S_j \\otimes I_d$.

    Child $j$ (row-major over $\\{0, 1\\}^d$) of a coarse element is the fine
    element at offset $j$; its local node $a$ lies at $(j + o_a) / 2$ in the
    coarse element, where coarse node $b$ has (multi)linear weight
    $\\prod_i w((j_i + o_{a,i}) / 2, o_{b,i})$.
    """
    offsets = st.get_grid((1,) * dim).element.node_offsets
    n = len(offsets)
    out = []
    for j in itertools.product((0, 1), repeat=dim):
        s = np.zeros((n, n))
        for a, oa in enumerate(offsets):
            for b, ob in enumerate(offsets):
                w = 1.0
                for i in range(dim):
                    pos = (j[i] + oa[i]) / 2.0
                    w *= pos if ob[i] == 1 else 1.0 - pos
                s[a, b] = w
        out.append(s if nodal else np.kron(s, np.eye(dim)))
    return np.stack(out)


# ----------------------------------------------------------------------------
# Grid transfer on lattice fields (d, *nodes, B).


def _prolong_axis(x, axis: int, n_fine: int):
    m1 = x.shape[axis]
    lo = jax.lax.slice_in_dim(x, 0, m1 - 1, axis=axis)
    hi = jax.lax.slice_in_dim(x, 1, m1, axis=axis)
    mid = 0.5 * (lo + hi)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, 1)
    mid = jnp.pad(mid, pad)
    both = jnp.stack([x, mid], axis=axis + 1)
    shape = x.shape[:axis] + (2 * m1,) + x.shape[axis + 1 :]
    return jax.lax.slice_in_dim(both.reshape(shape), 0, n_fine, axis=axis)


def _restrict_axis(x, axis: int, n_coarse: int):
    n_fine = x.shape[axis]
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, 2 * n_coarse - n_fine)
    x = jnp.pad(x, pad)
    shape = x.shape[:axis] + (n_coarse, 2) + x.shape[axis + 1 :]
    x = x.reshape(shape)
    even = jnp.take(x, 0, axis=axis + 1)
    odd = jnp.take(x, 1, axis=axis + 1)  # fine 2c + 1; the last one is padding
    shift = [(0, 0)] * odd.ndim
    shift[axis] = (1, 0)
    odd_prev = jax.lax.slice_in_dim(jnp.pad(odd, shift), 0, n_coarse, axis=axis)
    return even + 0.5 * (odd + odd_prev)


def prolong(fine: Level, coarse_field):
    """$P e$: coarse lattice field (d, *coarse nodes, ...) -> fine lattice field."""
    x = coarse_field
    for i, n in enumerate(fine.node_shape):
        x = _prolong_axis(x, 1 + i, n)
    return x


def restrict(fine: Level, fine_field):
    """$P^T r$: fine lattice field (d, *fine nodes, ...) -> coarse lattice field."""
    x = fine_field
    for i, n in enumerate(fine.coarse):
        x = _restrict_axis(x, 1 + i, n + 1)
    return x


# ----------------------------------------------------------------------------
# Galerkin coarse element matrices.


def _pad_cells(level: Level, x, lead: int):
    """Zero-pad the cell axes (after ``lead`` leading axes) to even counts."""
    pad = [(0, 0)] * x.ndim
    for i, (n, p) in enumerate(zip(level.cells, level.padded, strict=True)):
        pad[lead + i] = (0, p - n)
    return jnp.pad(x, pad)


def _child(x, j, lead: int):
    idx = (slice(None),) * lead + tuple(slice(ji, None, 2) for ji in j)
    return x[idx]


def _galerkin(sj, g):
    """$P_j^T G P_j$ for symmetric element matrices g (m, m, ...): two plain matmuls.

    $P_j = S_j \\otimes I_d$ ($S_j$ the $2^d \\times 2^d$ nodal weights), so
    $T = P_j^T G$ is one matmul of $S_j^T$ over the node index of the leading
    axis; swapping the two leading axes gives $T^T = G P_j$ (G symmetric), and
    $P_j^T (G P_j)$ is a second such matmul ($d$ times fewer flops than with $P_j$).
    """
    nodes = sj.shape[0]
    t = (sj.T @ g.reshape(nodes, -1)).reshape(g.shape)
    t = jnp.swapaxes(t, 0, 1)
    return (sj.T @ t.reshape(nodes, -1)).reshape(g.shape)


def coarse_element_matrices(level: Level, kes):
    """Galerkin element matrices of the next level.

    Args:
        kes: (m, m, *cells, B) symmetric element matrices of this level.

    Returns:
        (m, m, *coarse cells, B) with $K_C = \\sum_j P_j^T K^{(2C + j)} P_j$.
    """
    dim = len(level.cells)
    pj = jnp.asarray(child_interpolation(dim, nodal=True), kes.dtype)
    kes = _pad_cells(level, kes, 2)
    total = None
    for c, j in enumerate(itertools.product((0, 1), repeat=dim)):
        part = _galerkin(pj[c], _child(kes, j, 2))
        total = part if total is None else total + part
    return total


def fine_coarse_matrices(level: Level, ke, moduli, free_e):
    """First Galerkin level straight from the fine moduli and free mask.

    Args:
        ke: (m, m) unit element matrix.
        moduli: (*cells, B) fine moduli.
        free_e: (m, *cells, B) element values of the free mask.

    Returns:
        (m, m, *coarse cells, B), the element matrices of $P^T D K D P$: child
        $j$ contributes $P_j^T (E_j\\, d_j d_j^T \\odot K_e) P_j$.
    """
    dim = len(level.cells)
    pj = jnp.asarray(child_interpolation(dim, nodal=True), moduli.dtype)
    ke = jnp.asarray(ke, moduli.dtype)
    moduli = _pad_cells(level, moduli, 0)
    free_e = _pad_cells(level, free_e, 1)
    ke_b = ke.reshape(ke.shape + (1,) * moduli.ndim)
    total = None
    for c, j in enumerate(itertools.product((0, 1), repeat=dim)):
        e = _child(moduli, j, 0)
        d = _child(free_e, j, 1)  # (m, *coarse, B)
        g = ke_b * (d[:, None] * d[None, :]) * e[None, None]
        part = _galerkin(pj[c], g)
        total = part if total is None else total + part
    return total


def _assemble_dense(level: Level, kes):
    """Dense flat matrix (B, n, n) of element matrices (m, m, *cells, B)."""
    return assemble_dense(st.get_grid(level.cells), kes)


def assemble_dense(grid: st.StructuredGrid, kes):
    """Dense flat matrix (B, n, n) of element matrices (m, m, *cells, B)."""
    edofs = jnp.asarray(st.element_dofs(grid))  # (n_cells, m)
    nb = kes.shape[-1]
    m = kes.shape[0]
    vals = jnp.moveaxis(kes.reshape(m, m, -1, nb), (3, 2), (0, 1))  # (B, n_cells, m, m)
    k = jnp.zeros((nb, grid.n_dofs, grid.n_dofs), kes.dtype)
    return k.at[:, edofs[:, :, None], edofs[:, None, :]].add(vals)


# ----------------------------------------------------------------------------
# Preconditioner.


def build_hierarchy(options: MGOptions, moduli, free_lat):
    """Per-level operator data (a PyTree) for a batch of designs.

    Args:
        options: static options.
        moduli: (*cells, B) fine element moduli.
        free_lat: (d, *nodes, B) free mask in lattice layout (floats).

    Returns:
        A dict with the fine ``moduli``/``free``/``inv_diag``, per coarse level
        the element matrices ``kes`` and ``inv_diag``, and the inverse of the
        coarsest matrix ``coarse_inverse`` (B, n, n).
    """
    dim = moduli.ndim - 1
    levels = plan(tuple(moduli.shape[:dim]), options.max_coarse_dofs, options.levels)
    grid = st.get_grid(levels[0].cells)
    fine_diag = st.diagonal_lattice(grid, moduli, free_lat)
    data = {"moduli": moduli, "free": free_lat, "inv_diag": [1.0 / fine_diag], "kes": []}
    if len(levels) == 1:
        return data, levels
    free_e = st.element_values_lattice(grid, free_lat)
    kes = fine_coarse_matrices(levels[0], grid.element.ke, moduli, free_e)
    for li in range(1, len(levels)):
        lev = levels[li]
        g = st.get_grid(lev.cells)
        m = kes.shape[0]
        kd = kes[jnp.arange(m), jnp.arange(m)]  # (m, *cells, B)
        diag = st.nodal_accumulate_lattice(g, kd)
        data["kes"].append(kes)
        data["inv_diag"].append(jnp.where(diag > 0, 1.0 / jnp.where(diag > 0, diag, 1.0), 0.0))
        if li + 1 < len(levels):
            kes = coarse_element_matrices(lev, kes)
    # Coarsest: dense Cholesky of the last level's Galerkin matrix.
    kd = _assemble_dense(levels[-1], data["kes"][-1])
    d = jnp.diagonal(kd, axis1=1, axis2=2)
    empty = d <= 0.0
    kd = kd + jax.vmap(jnp.diag)(jnp.where(empty, 1.0, COARSE_SHIFT * d))
    data["coarse_inverse"] = _small.spd_inverse_loop(kd)
    return data, levels


def _level_matvec(levels, data, li, x):
    if li == 0:
        grid = st.get_grid(levels[0].cells)
        return st.matvec_lattice(grid, data["moduli"], data["free"], x)
    grid = st.get_grid(levels[li].cells)
    xe = st.element_values_lattice(grid, x)
    return st.nodal_accumulate_lattice(grid, st.apply_element_matrices(data["kes"][li - 1], xe))


def _coarse_solve(levels, data, b):
    grid = st.get_grid(levels[-1].cells)
    flat = jnp.moveaxis(st.from_lattice(grid, b), -1, 0)  # (B, n)
    x = jnp.einsum("bij,bj->bi", data["coarse_inverse"], flat)
    return st.to_lattice(grid, jnp.moveaxis(x, 0, -1))


def vcycle(levels, options: MGOptions, data, b, li: int = 0):
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
        ec = vcycle(levels, options, data, restrict(levels[li], r), li + 1)
        corr = prolong(levels[li], ec)
        if li == 0:
            corr = corr * data["free"]
        x = x + corr
    for _ in range(sweeps):
        x = x + w * inv_d * (b - _level_matvec(levels, data, li, x))
    return x


# ----------------------------------------------------------------------------
# Preconditioned CG.


def _dot(a, b, dim):
    return jnp.sum(a * b, axis=tuple(range(dim + 1)))


def pcg_lattice(options: MGOptions, moduli, free_lat, b_lat, x0=None):
    """MG-preconditioned CG in lattice layout, lockstep over the batch.

    Args:
        options: static options.
        moduli: (*cells, B) element moduli.
        free_lat: (d, *nodes, B) free mask (floats).
        b_lat: (d, *nodes, B) right-hand sides (zero on fixed DOFs).
        x0: optional initial guess (zero by default).

    Returns:
        ``(x, converged, iterations)``: x (d, *nodes, B); converged (B,) bool;
        iterations (B,) int32, the CG steps each sample took.
    """
    dim = moduli.ndim - 1
    data, levels = build_hierarchy(options, moduli, free_lat)
    grid = st.get_grid(levels[0].cells)

    def apply_a(x):
        return st.matvec_lattice(grid, moduli, free_lat, x)

    def precond(r):
        if len(levels) == 1:  # no coarse level: a plain Jacobi preconditioner
            return data["inv_diag"][0] * r
        return vcycle(levels, options, data, r)

    bnorm = jnp.sqrt(_dot(b_lat, b_lat, dim))
    if x0 is None:
        x0 = jnp.zeros_like(b_lat)
        r0 = b_lat
    else:
        r0 = b_lat - apply_a(x0)
    z0 = precond(r0)
    rnorm0 = jnp.sqrt(_dot(r0, r0, dim))
    done0 = (rnorm0 <= options.tol * bnorm) | (bnorm == 0.0)

    def cond(state):
        return (state[5] < options.max_iter) & ~jnp.all(state[7])

    def body(state):
        x, r, p, rz, _, it, its, done = state
        ap = apply_a(p)
        pap = _dot(p, ap, dim)
        alpha = jnp.where(done, 0.0, rz / jnp.where(pap == 0.0, 1.0, pap))
        x = x + alpha * p
        r = r - alpha * ap
        z = precond(r)
        rz_new = _dot(r, z, dim)
        beta = jnp.where(done, 0.0, rz_new / jnp.where(rz == 0.0, 1.0, rz))
        p = jnp.where(done, p, z + beta * p)
        rnorm = jnp.sqrt(_dot(r, r, dim))
        its = its + jnp.where(done, 0, 1)
        done = done | (rnorm <= options.tol * bnorm) | ~jnp.isfinite(rnorm)
        return x, r, p, rz_new, rnorm, it + 1, its, done

    its0 = jnp.zeros(bnorm.shape, jnp.int32)
    state = (x0, r0, z0, _dot(r0, z0, dim), rnorm0, jnp.asarray(0), its0, done0)
    x, _, _, _, rnorm, _, its, _ = jax.lax.while_loop(cond, body, state)
    converged = (rnorm <= options.tol * bnorm) | (bnorm == 0.0)
    return x, converged, its


def direct_solve(grid: st.StructuredGrid, moduli, free, rhs):
    """Dense Cholesky solve of $\\tilde K x = b$ for one sample.

    Args:
        moduli: (*cells,) element moduli; free, rhs: (n_dofs,) flat.

    Returns:
        x (n_dofs,).
    """
    fe = st.element_values(grid, free[:, None])[..., 0]  # (m, *cells)
    ke = jnp.asarray(grid.element.ke, moduli.dtype)
    kes = ke.reshape(ke.shape + (1,) * moduli.ndim) * (fe[:, None] * fe[None]) * moduli
    k = assemble_dense(grid, kes[..., None])[0] + jnp.diag(1.0 - free)
    return jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(k), True), rhs)


def _with_fallback(grid, moduli, free, rhs, x, converged):
    """Re-solve the samples whose CG failed with :func:`direct_solve`."""

    def fix(_):
        def one(args):
            ok, m, f, b, xi = args
            return jax.lax.cond(ok, lambda: xi, lambda: direct_solve(grid, m, f, b))

        cols = jax.lax.map(one, (converged, jnp.moveaxis(moduli, -1, 0), free.T, rhs.T, x.T))
        return cols.T

    return jax.lax.cond(jnp.all(converged), lambda _: x, fix, None)


def pcg(options: MGOptions, moduli, free, rhs):
    """:func:`pcg_lattice` on flat vectors: free, rhs (n_dofs, B); returns flat x.

    Samples whose CG did not converge are solved directly on small grids
    (``options.direct_fallback_dofs``) and then count as converged; their
    ``iterations`` stay at the CG bound.
    """
    grid = st.get_grid(tuple(moduli.shape[:-1]))
    free = jnp.asarray(free, moduli.dtype)
    free_lat = st.to_lattice(grid, free)
    x, conv, its = pcg_lattice(options, moduli, free_lat, st.to_lattice(grid, rhs))
    x = st.from_lattice(grid, x)
    if grid.n_dofs <= options.direct_fallback_dofs:
        x = _with_fallback(grid, moduli, free, rhs, x, conv)
        conv = jnp.all(jnp.isfinite(x), axis=0)
    return x, conv, its


# ----------------------------------------------------------------------------
# Differentiable solves.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def solve_kernel(options: MGOptions, moduli, free, rhs):
    """$u = \\tilde K^{-1} (D\\,\\text{rhs})$ (flat, batch-last) -> (u, converged, iterations).

    Differentiable in ``moduli`` and ``rhs``: the backward pass is one more
    MG-CG solve, $\\lambda = \\tilde K^{-1} D \\bar u$, $\\bar E_e = -\\lambda_e^T K_e u_e$.
    """
    return pcg(options, moduli, free, rhs * free)


def _solve_fwd(options, moduli, free, rhs):
    out = pcg(options, moduli, free, rhs * free)
    return out, (moduli, free, out[0])


def _solve_bwd(options, res, cts):
    moduli, free, u = res
    lam, _, _ = pcg(options, moduli, free, cts[0] * free)
    grid = st.get_grid(tuple(moduli.shape[:-1]))
    moduli_bar = -st.element_energy(grid, lam, u)
    return moduli_bar, None, lam * free


solve_kernel.defvjp(_solve_fwd, _solve_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def compliance_kernel(options: MGOptions, moduli, force, free):
    """$c = f^T \\tilde K^{-1} f$ with $f = D\\,\\text{force}$; returns (c, converged, iterations).

    Self-adjoint: the gradient reuses the forward displacements,
    $\\partial c / \\partial E_e = -u_e^T K_e u_e$ (no extra solve).
    """
    f = force * free
    u, conv, its = pcg(options, moduli, free, f)
    return jnp.sum(f * u, axis=0), conv, its


def _compliance_fwd(options, moduli, force, free):
    f = force * free
    u, conv, its = pcg(options, moduli, free, f)
    return (jnp.sum(f * u, axis=0), conv, its), (moduli, free, u)


def _compliance_bwd(options, res, cts):
    moduli, free, u = res
    c_bar = cts[0]
    grid = st.get_grid(tuple(moduli.shape[:-1]))
    return -c_bar * st.element_energy(grid, u, u), 2.0 * c_bar * u * free, None


compliance_kernel.defvjp(_compliance_fwd, _compliance_bwd)


@functools.partial(jax.jit, static_argnames=("options",))
def solve(moduli, free, rhs, options: MGOptions = MGOptions()):
    """Jitted :func:`solve_kernel`: moduli (*cells, B), free and rhs (n_dofs, B).

    Returns:
        ``(u, converged, iterations)`` with u (n_dofs, B).
    """
    return solve_kernel(options, moduli, jnp.asarray(free, moduli.dtype), rhs)


@functools.partial(jax.jit, static_argnames=("options",))
def compliance(moduli, force, free, options: MGOptions = MGOptions()):
    """Jitted :func:`compliance_kernel`: moduli (*cells, B), force and free (n_dofs, B).

    Returns:
        ``(c, converged, iterations)``, each of shape (B,).
    """
    return compliance_kernel(options, moduli, force, jnp.asarray(free, moduli.dtype))
