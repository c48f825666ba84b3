"""The strong search's polish: exhaustive single swaps and a tabu search.

SIMP solves a relaxed problem, so a rounded design is rarely the best 0/1
design.  The polish moves one cell of material at a time - from a solid design
cell ``s`` to an empty design cell ``t``, keeping the budget - and takes the
best such swap per pass until none improves.  The whole neighbourhood (every
solid x every empty design cell) is scored exactly without re-solving, by the
Sherman-Morrison-Woodbury identity of :mod:`sphyr_jax.topopt.swaps`: a 10 x 10
system per pair from the modal flexibility $\\Phi_{ij} = V^T Z_{ij} V$
($Z = \\tilde K^{-1}$) between design cells.  Only the block of $Z$ on the
design DOFs is kept; it is computed once per design and updated by the same
identity after each accepted swap ($Z' = Z - Z W A^{-1} W^T Z$).  Every pass
re-solves the accepted design, so reported compliances are always exact
solves; a swap the exact solve does not confirm is undone and the design is
finished.

Arrays are batch-first; the sizes of the solid/empty cell lists and of the
design-DOF set are static (host-computed bounds), the lists themselves data.
Designs that finish early leave the batch (it is compacted between device
calls), so a few long polishes do not keep the whole batch busy.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import fea, small_spd, structured
from sphyr_jax.fem.array_types import Densities
from sphyr_jax.fem.linear_solve import chunked
from sphyr_jax.fem.solvers import AbstractFactorSolver, SolverLike, SolverName, as_factor_solver
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.sharding import batch_call
from sphyr_jax.topopt import swaps

DEFAULT_MAX_PASSES = 100
DEFAULT_TENURE = 4
IMPROVEMENT = 1e-10  # a swap must lower compliance by this relative amount
_RHS_PER_CHUNK = 2048  # right-hand sides per banded multi-solve (cache-sized)


class PolishResult(eqx.Module):
    """Polished 0/1 designs.

    Attributes:
        densities: (B, nely, nelx).
        compliance: (B,) exact compliance at p = 3.
        swaps: (B,) swaps applied.
    """

    densities: jax.Array
    compliance: jax.Array
    swaps: jax.Array


class _State(eqx.Module):
    x: jax.Array  # (B, nel) current design
    u: jax.Array  # (B, n) displacements of x
    c: jax.Array  # (B,) compliance of x
    phi: jax.Array  # (B, 5F, 5F) modal flexibility between design cells
    best_x: jax.Array  # (B, nel) stiffest design seen
    best_c: jax.Array  # (B,)
    last: jax.Array  # (B, F) pass at which each design cell last changed
    passes: jax.Array  # (B,) passes done
    stall: jax.Array  # (B,) passes since the best improved
    done: jax.Array  # (B,)
    swaps: jax.Array  # (B,) swaps applied


def _cell_list(mask, size):
    """Indices of the True entries of ``mask`` (F,), padded to ``size``, and validity."""
    n = mask.shape[-1]
    idx = jnp.arange(n)
    order = jnp.argsort(jnp.where(mask, idx, n + idx))[:size]
    return order, mask[order]


def _pair_scores(phi, y, solid, empty, c, lam, sizes):
    """Exact compliance after every (solid -> empty) swap of one design.

    Args:
        phi: (F, 5, F, 5) modal flexibility $V^T Z_{ij} V$ between design cells.
        y: (F, 5) modal displacements $V^T u_i$.
        solid, empty: (F,) bool, state of each design cell (padding: neither).
        c: compliance of the design; lam: (5,) element eigenvalues.
        sizes: static (S, V) list sizes.

    Returns:
        (scores (S, V), solid positions (S,), empty positions (V,)).
    """
    s_idx, s_ok = _cell_list(solid, sizes[0])
    t_idx, t_ok = _cell_list(empty, sizes[1])
    g_st = phi[s_idx][:, :, t_idx, :].transpose(0, 2, 1, 3)  # (S, V, 5, 5)
    q = swaps.swap_gain(phi[s_idx, :, s_idx, :][:, None], phi[t_idx, :, t_idx, :][None], g_st,
                        y[s_idx][:, None], y[t_idx][None], lam)
    scores = c - q
    ok = s_ok[:, None] & t_ok[None, :] & jnp.isfinite(scores)
    return jnp.where(ok, scores, jnp.inf), s_idx, t_idx


def design_cells(load_case: LoadCase) -> np.ndarray:
    """Number of design cells of each sample (host)."""
    return np.sum(np.asarray(load_case.design_mask, bool), axis=(-2, -1))


def design_dofs(load_case: LoadCase) -> np.ndarray:
    """(..., n) bool: free DOFs touched by a design cell (host computation)."""
    mask = np.asarray(load_case.design_mask, bool)
    grid = structured.get_grid(mask.shape[-2:])
    edofs = structured.element_dofs(grid)
    flat = mask.reshape(mask.shape[:-2] + (-1,))
    touched = np.zeros(flat.shape[:-1] + (grid.n_dofs,), bool)
    for e in range(grid.n_cells):
        touched[..., edofs[e]] |= flat[..., e : e + 1]
    return touched & np.asarray(load_case.free_dofs, bool)


def static_sizes(load_case: LoadCase, designs) -> tuple[int, int, int, int]:
    """Bounds (solid cells, empty cells, design cells, design DOFs) of a batch (host)."""
    mask = np.asarray(load_case.design_mask, bool)
    x = np.asarray(designs)
    solid = int(np.max(np.sum(mask & (x > 0.5), axis=(-2, -1)), initial=0))
    empty = int(np.max(np.sum(mask & (x <= 0.5), axis=(-2, -1)), initial=0))
    cells = int(np.max(design_cells(load_case), initial=0))
    dofs = int(np.max(np.sum(design_dofs(load_case), axis=-1), initial=0))

    nel = mask.shape[-2] * mask.shape[-1]
    ndof = 2 * (mask.shape[-2] + 1) * (mask.shape[-1] + 1)
    # Small problems all share one shape (cheap to pad, costly to recompile).
    return (min(_bucket(solid, 16), nel), min(_bucket(empty, 16), nel),
            min(_bucket(cells, 16), nel), min(_bucket(dofs, 64), ndof))


def _bucket(v: int, smallest: int) -> int:
    """Round up to the ladder smallest * {1, 1.5, 2, 3, 4, 6, 8, ...}: at most
    half of padding, and few distinct shapes (each new shape compiles)."""
    size = smallest
    while True:
        for step in (size, size * 3 // 2):
            if step >= v:
                return step
        size *= 2


def _exact(load_case, x, factor):
    """Factor, displacements (B, n) and compliance of designs (B, nel) at p = 3."""
    fac, u, _, c = swaps.exact(load_case, x, penal=3.0, factor=factor)
    return fac, u.T, c


def _swap_inverse(amat, k):
    r"""Inverse of swap matrices (B, 2k, 2k) = [[P, Q], [Q^T, R]] without LAPACK.

    P (removal) is negative definite and R (addition) positive definite, so
    the block inverse needs only SPD inverses: $S = P - Q R^{-1} Q^T$,
    $A^{-1} = [[S^{-1}, -S^{-1} Q R^{-1}], [\cdot^T, R^{-1} + R^{-1} Q^T S^{-1} Q R^{-1}]]$.
    """
    p, q, r = amat[:, :k, :k], amat[:, :k, k:], amat[:, k:, k:]
    r_inv = small_spd.spd_inverse(r)
    qr = q @ r_inv
    s_inv = -small_spd.spd_inverse(-(p - qr @ q.transpose(0, 2, 1)))
    top_right = -s_inv @ qr
    bottom_right = r_inv + qr.transpose(0, 2, 1) @ s_inv @ qr
    return jnp.concatenate([
        jnp.concatenate([s_inv, top_right], axis=2),
        jnp.concatenate([top_right.transpose(0, 2, 1), bottom_right], axis=2),
    ], axis=1)


def _cells_of(load_case: LoadCase, n_cells: int):
    """Design cells (B, F) in cell order, padded with cell 0, and validity."""
    nb = load_case.design_mask.shape[0]
    mask = jnp.asarray(load_case.design_mask, bool).reshape(nb, -1)
    idx = jnp.arange(mask.shape[-1])
    order = jnp.argsort(jnp.where(mask, idx, mask.shape[-1] + idx), axis=-1)[:, :n_cells]
    return order, jnp.take_along_axis(mask, order, axis=-1)


def _modal(grid, modes, vec, cells, ok):
    """$V^T v_e$ for the design cells: vec (B, n, ...) -> (B, F, 5, ...)."""
    edofs = jnp.asarray(structured.element_dofs(grid))[cells]  # (B, F, 8)
    g = jax.vmap(lambda v, d: v[d])(vec, edofs)  # (B, F, 8, ...)
    out = jnp.einsum("ak,bfa...->bfk...", modes, g)
    return out * ok.reshape(ok.shape + (1,) * (out.ndim - 2))


def _init(load_case: LoadCase, x0, *, sizes, factor: AbstractFactorSolver):
    """Exact solve of the start designs and their modal flexibility $\\Phi$.

    $\\Phi_{ij} = V^T Z_{ij} V$ needs $Z = \\tilde K^{-1}$ only on the design
    DOFs: with $Y = L^{-1} E_D$ (forward substitution on the unit vectors of
    those DOFs), $Z_D = Y^T Y$.
    """
    shape = load_case.shape
    grid = structured.get_grid(shape)
    n = grid.n_dofs
    nb = x0.shape[0]
    n_cells, n_dofs_d = sizes[2], sizes[3]
    modes = jnp.asarray(swaps.modes(shape)[0])
    nk = modes.shape[1]
    x = x0.reshape(nb, -1)
    fac, u, c = _exact(load_case, x, factor)
    cells, ok = _cells_of(load_case, n_cells)
    edofs = jnp.asarray(structured.element_dofs(grid))[cells]  # (B, F, 8)
    # Design DOFs: free DOFs of valid design cells, listed first in DOF order.
    hit = jnp.zeros((nb, n + 1), bool)
    hit = hit.at[jnp.arange(nb)[:, None, None], jnp.where(ok[:, :, None], edofs, n)
                 ].set(True)[:, : n]
    hit = hit & jnp.asarray(load_case.free_dofs, bool)
    idx = jnp.arange(n)
    cols = jnp.argsort(jnp.where(hit, idx, n + idx), axis=-1)[:, :n_dofs_d]  # (B, D)
    col_ok = jnp.take_along_axis(hit, cols, axis=-1)
    # Position of every DOF in the design list (D: the zero padding row/column).
    where = jnp.full((nb, n + 1), n_dofs_d)
    where = where.at[jnp.arange(nb)[:, None], jnp.where(col_ok, cols, n)].set(
        jnp.where(col_ok, jnp.arange(n_dofs_d)[None], n_dofs_d))
    where = where.at[:, n].set(n_dofs_d)
    pos = jnp.take_along_axis(where, edofs.reshape(nb, -1), axis=-1)  # (B, 8F)

    def gram(fc, cl, co):  # one chunk, batch last: Z_D (D, D, b)
        rhs = jax.nn.one_hot(cl.T, n, dtype=jnp.float64) * co.T[..., None]
        y = jnp.moveaxis(factor.forward(grid, fc, rhs.transpose(2, 1, 0)), -1, 0)
        return jnp.moveaxis(jnp.einsum("bni,bnj->bij", y, y), 0, -1)

    chunk = max(1, _RHS_PER_CHUNK // n_dofs_d)
    z = chunked(gram, chunk, fac, cols.T, col_ok.T.astype(jnp.float64))  # (D, D, B)
    z = jnp.pad(jnp.moveaxis(z, -1, 0), ((0, 0), (0, 1), (0, 1)))  # zero row/column D

    def modal_rows(a):  # rows of a (B, D+1, w) at the cells' DOFs, contracted with V
        g = jnp.take_along_axis(a, pos[:, :, None], axis=1).reshape(nb, n_cells, 8, -1)
        g = jnp.einsum("ak,bfaw->bfkw", modes, g) * ok[:, :, None, None]
        return g.reshape(nb, n_cells * nk, -1)

    half = modal_rows(z)  # (B, 5F, D+1)
    phi = modal_rows(jnp.swapaxes(half, 1, 2))  # (B, 5F, 5F), symmetric
    zeros = jnp.zeros((nb,), jnp.int32)
    return _State(x=x, u=u, c=c, phi=phi, best_x=x, best_c=c,
                  last=jnp.full((nb, n_cells), -(1 << 20), jnp.int32), passes=zeros,
                  stall=zeros, done=~jnp.isfinite(c), swaps=zeros)


def _segment(load_case: LoadCase, st: _State, *, sizes, passes, tabu, tenure,
             factor: AbstractFactorSolver):
    """``passes`` polish passes; with ``tabu`` > 0 the search goes on past local
    optima (best admissible swap, recently moved cells tabu for ``tenure``
    passes unless the swap beats the best design) for ``tabu`` passes without
    a new best."""
    shape = load_case.shape
    grid = structured.get_grid(shape)
    nb = st.x.shape[0]
    n_cells = sizes[2]
    modes_np, lam_np = swaps.modes(shape)
    modes, lam = jnp.asarray(modes_np), jnp.asarray(lam_np)
    nk = modes.shape[1]
    cells, ok = _cells_of(load_case, n_cells)
    d_inv = jnp.concatenate([-1.0 / (swaps.DELTA * lam), 1.0 / (swaps.DELTA * lam)])
    rows = jnp.arange(nb)

    def one_pass(_, st: _State) -> _State:
        xc = jnp.take_along_axis(st.x, cells, axis=-1)
        solid = ok & (xc > 0.5)
        empty = ok & (xc <= 0.5)
        y = _modal(grid, modes, st.u, cells, ok)  # (B, F, 5)
        phi4 = st.phi.reshape(nb, n_cells, nk, n_cells, nk)
        sc, s_idx, t_idx = jax.vmap(
            lambda p, yy, so, em, c: _pair_scores(p, yy, so, em, c, lam, sizes[:2])
        )(phi4, y, solid, empty, st.c)
        free_cell = (st.passes[:, None] - st.last) >= tenure  # (B, F)
        allowed = (jnp.take_along_axis(free_cell, s_idx, axis=-1)[:, :, None]
                   & jnp.take_along_axis(free_cell, t_idx, axis=-1)[:, None, :])
        aspire = sc < st.best_c[:, None, None] * (1.0 - IMPROVEMENT)
        sc = jnp.where(allowed | aspire, sc, jnp.inf)
        flat = sc.reshape(nb, -1)
        best = jnp.argmin(flat, axis=-1)
        predicted = jnp.take_along_axis(flat, best[:, None], axis=-1)[:, 0]
        improving = predicted < st.c * (1.0 - IMPROVEMENT)
        move = ~st.done & jnp.isfinite(predicted) & (improving | (st.stall < tabu))
        sj = jnp.take_along_axis(s_idx, (best // sizes[1])[:, None], axis=-1)[:, 0]
        tj = jnp.take_along_axis(t_idx, (best % sizes[1])[:, None], axis=-1)[:, 0]
        si, ti = cells[rows, sj], cells[rows, tj]
        x = st.x.at[rows, si].set(jnp.where(move, 0.0, st.x[rows, si]))
        x = x.at[rows, ti].set(jnp.where(move, 1.0, x[rows, ti]))
        # Woodbury update of the modal flexibility for the swap.
        cols = jnp.concatenate([sj[:, None] * nk + jnp.arange(nk), tj[:, None] * nk
                                + jnp.arange(nk)], axis=-1)  # (B, 10)
        pc = jnp.take_along_axis(st.phi, cols[:, None, :], axis=2)  # (B, 5F, 10)
        amat = jnp.diag(d_inv)[None] + jnp.take_along_axis(pc, cols[:, :, None], axis=1)
        phi = st.phi - pc @ _swap_inverse(amat, nk) @ pc.transpose(0, 2, 1)
        _, u, c = _exact(load_case, x, factor)
        # Pure descent keeps a swap only if the exact solve confirms it; the
        # tabu phase keeps every swap and remembers the best design.
        accept = move & ((c < st.c) | (tabu > 0)) & jnp.isfinite(c)
        keep = ~accept
        new_best = accept & (c < st.best_c * (1.0 - IMPROVEMENT))
        stall = jnp.where(new_best, 0, st.stall + accept.astype(jnp.int32))
        moved = (jnp.arange(n_cells)[None] == sj[:, None]) | (jnp.arange(n_cells)[None]
                                                               == tj[:, None])
        return _State(
            x=jnp.where(keep[:, None], st.x, x),
            u=jnp.where(keep[:, None], st.u, u),
            c=jnp.where(keep, st.c, c),
            phi=jnp.where(keep[:, None, None], st.phi, phi),
            best_x=jnp.where(new_best[:, None], x, st.best_x),
            best_c=jnp.where(new_best, c, st.best_c),
            last=jnp.where(accept[:, None] & moved, st.passes[:, None], st.last),
            passes=st.passes + 1,
            stall=stall,
            done=st.done | ~accept | (stall > tabu) | ((tabu == 0) & ~new_best),
            swaps=st.swaps + accept.astype(jnp.int32),
        )

    return jax.lax.fori_loop(0, passes, one_pass, st)


def bucket_ladder(n: int, *, factor: int = 4, smallest: int = 8) -> list[int]:
    """Batch sizes a shrinking batch moves through: a power of two >= n, then /factor."""
    top = max(smallest, 1 << max(0, (n - 1).bit_length()))
    sizes = [top]
    while sizes[-1] // factor >= smallest:
        sizes.append(sizes[-1] // factor)
    return sizes


def _take(tree, idx):
    return jax.tree.map(lambda a: a[idx], tree)


_take_jit = jax.jit(_take)


def polish(load_case: LoadCase, designs: Densities, *, max_passes: int = DEFAULT_MAX_PASSES,
           solver: SolverLike = None, passes_per_call: int = 2,
           num_devices: int | None = None, tabu: int = 0, tenure: int = DEFAULT_TENURE,
           factor: AbstractFactorSolver | SolverName = swaps.FACTOR) -> PolishResult:
    """Best-improvement single-swap polish of 0/1 designs, batched.

    Args:
        load_case: batched load cases (B leading axis).
        designs: (B, nely, nelx) designs, 0/1 on design cells (other cells keep
            their values and never change).
        max_passes: bound on swaps per design.
        solver: used for the final exact compliance (None: the grid's default).
        factor: the factorising solver whose factor the swap scores use
            (a name or an object; the iterative solvers keep no factor and are
            refused with a ``TypeError``).
        passes_per_call: passes per device call (finished designs leave the
            batch between calls, which shrinks through :func:`bucket_ladder`).
        num_devices: devices the batch is split over (None: all local).
        tabu: passes without a new best allowed after a local optimum (0: stop
            at the first local optimum).
        tenure: passes a moved cell stays tabu.

    Returns:
        A :class:`PolishResult` (NumPy arrays); compliance at p = 3.
    """
    fea.require_x64()
    factor = as_factor_solver(factor, load_case.shape)
    case_np = jax.tree.map(np.asarray, load_case)
    x0 = np.asarray(designs, np.float64)
    nb = x0.shape[0]
    sizes = static_sizes(case_np, x0)
    out_x = x0.reshape(nb, -1).copy()
    out_swaps = np.zeros(nb, np.int32)

    ladder = bucket_ladder(nb)
    active = np.arange(nb)
    idx = np.resize(active, ladder[0])  # pad by repeating real designs
    st = batch_call(_init, _take(case_np, idx), x0[idx], sizes=sizes, factor=factor,
                    num_devices=num_devices)
    passes = 0
    while passes < max_passes:
        step = min(passes_per_call, max_passes - passes)
        st = batch_call(_segment, _take(case_np, idx), st, sizes=sizes, passes=step,
                        tabu=tabu, tenure=tenure, factor=factor, num_devices=num_devices)
        passes += step
        n = len(active)
        done = np.asarray(st.done)[:n]
        out_x[active] = np.asarray(st.best_x)[:n]
        out_swaps[active] = np.asarray(st.swaps)[:n]
        if done.all():
            break
        if done.any():
            sel = np.flatnonzero(~done)
            active = active[sel]
            size = min(s for s in ladder if s >= len(active))
            sel = np.resize(sel, size)
            st = _take_jit(st, sel)
            idx = np.resize(active, size)
    rho = out_x.reshape(x0.shape)
    c = np.asarray(fea.compliance(case_np, rho, penal=3.0, solver=solver))
    return PolishResult(densities=rho, compliance=c, swaps=out_swaps)
