"""The reference yardstick's swap polish, scored by low-rank updates.

The published polish (:mod:`sphyr_jax.topopt.yardstick`) moves one cell of material
per pass: the ``source_limit`` solid design cells of lowest unit-modulus strain
energy are paired (source-major) with the ``target_limit`` empty design cells
whose most strained solid neighbour (8-neighbourhood) is largest, ties in cell
order, and the first pair whose compliance beats the best so far by more than
1e-12 wins; a pass without one ends the polish (at most ``polish_passes``).

The published method solves every pair from scratch.  Here a pass costs one
factorisation: a swap is a rank-10 change of $K$, scored by the
Sherman-Morrison-Woodbury identity (:mod:`sphyr_jax.topopt.swaps`), with
$K^{-1} W$ restricted to the DOFs of the ranked cells from one forward
substitution ($W^T K^{-1} W = (L^{-1} W)^T (L^{-1} W)$).  Every accepted design
is solved exactly at the start of the next pass (its energies rank the next
pass's cells), and the reported compliance is that exact solve.

Arrays are batch-first (B, nel) outside, batch-last inside the solver.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from sphyr_jax.fem import fea
from sphyr_jax.fem import structured as st
from sphyr_jax.fem.array_types import DesignMask, FlatDesigns, PerSample
from sphyr_jax.fem.solvers import AbstractFactorSolver, SolverLike
from sphyr_jax.problem.loadcase import LoadCase, fix_samples
from sphyr_jax.topopt import swaps

IMPROVEMENT = 1e-12  # absolute, as published


def neighbour_energy(e, solid):
    """Largest energy among the solid neighbours of each cell, 0 if none, (B, *cells).

    Neighbours share an edge or a corner: 8 in 2D, 26 in 3D.
    """
    cells = e.shape[1:]
    padded = jnp.pad(jnp.where(solid, e, 0.0), [(0, 0)] + [(1, 1)] * len(cells))
    best = jnp.zeros_like(e)
    for off in itertools.product((-1, 0, 1), repeat=len(cells)):
        if any(off):
            window = tuple(slice(1 + o, 1 + o + n) for o, n in zip(off, cells, strict=True))
            best = jnp.maximum(best, padded[(slice(None),) + window])
    return best


def ranked(key, ok, limit):
    """First ``limit`` cells by ascending key (ties: cell order) and their validity."""
    order = jnp.argsort(jnp.where(ok, key, jnp.inf), axis=-1, stable=True)[:, :limit]
    valid = jnp.take_along_axis(ok, order, axis=-1)
    short = limit - order.shape[-1]  # grids with fewer cells than the limit
    if short > 0:
        order = jnp.pad(order, ((0, 0), (0, short)))
        valid = jnp.pad(valid, ((0, 0), (0, short)))
    return order, valid


def scan_first_better(c, ok, best):
    """The published running-best scan over pairs (P, B) in order: (best, index).

    A pair is taken if its compliance beats the best so far by more than 1e-12.
    """
    def step(carry, item):
        b, sel = carry
        ck, okk, k = item
        take = okk & (ck < b - IMPROVEMENT)
        return (jnp.where(take, ck, b), jnp.where(take, k, sel)), None

    nb = c.shape[1]
    (best, sel), _ = jax.lax.scan(step, (best, jnp.full((nb,), -1, jnp.int32)),
                                  (c, ok, jnp.arange(c.shape[0], dtype=jnp.int32)))
    return best, sel


def _swap_passes(x, mask, shape, static, evaluate, score):
    """The published pass loop, shared by both polishes.

    Each pass evaluates the design exactly, ranks ``source_limit`` solid design
    cells by ascending strain energy and ``target_limit`` empty design cells by
    descending neighbour energy, scores every (source, target) swap and takes
    the first one that beats the best so far (:func:`scan_first_better`).

    Args:
        x: (B, nel) start designs.
        mask: (B, nel) design cells.
        shape: grid shape.
        static: :meth:`sphyr_jax.topopt.options.ReferenceOptions.static`.
        evaluate: ``(x, on) -> (compliance (B,), unit-modulus energies (B, nel),
            aux)``; only the samples ``on`` (B,) still search, the others'
            outputs are never read (so they may skip their solves).
        score: ``(x, compliance, aux, src (B, S), tgt (B, T)) -> (scores (B, S, T),
            usable (B, S, T))``: the compliance after each swap.

    Returns:
        (designs (B, nel), exact compliance (B,)).
    """
    passes, n_src, n_tgt = static[6:9]
    nb, nel = x.shape
    cells = jnp.arange(nel)

    def body(st):
        x, best, live, dirty, it = st
        c, e, aux = evaluate(x, dirty)
        best = jnp.where(dirty, c, best)
        solid = x > 0.5
        near = neighbour_energy(e.reshape((nb,) + shape),
                                solid.reshape((nb,) + shape)).reshape(nb, nel)
        src, src_ok = ranked(e, mask & solid, n_src)
        tgt, tgt_ok = ranked(0.0 - near, mask & ~solid, n_tgt)
        searching = live & (it < passes) & src_ok[:, 0] & tgt_ok[:, 0]
        scores, usable = score(x, c, aux, src, tgt)
        ok = src_ok[:, :, None] & tgt_ok[:, None, :] & usable
        scores = jnp.where(ok, scores, jnp.inf).reshape(nb, -1).T  # (S T, B)
        _, sel = scan_first_better(scores, ok.reshape(nb, -1).T, best)
        swap = searching & (sel >= 0)
        pick = jnp.maximum(sel, 0)
        s_cell = jnp.take_along_axis(src, pick[:, None] // n_tgt, axis=-1)
        t_cell = jnp.take_along_axis(tgt, pick[:, None] % n_tgt, axis=-1)
        moved = jnp.where(cells == s_cell, 0.0, jnp.where(cells == t_cell, 1.0, x))
        return (jnp.where(swap[:, None], moved, x), best, swap, swap, it + 1)

    state = (x, jnp.full((nb,), jnp.inf), jnp.ones((nb,), bool), jnp.ones((nb,), bool),
             jnp.int32(0))
    x, best, _, _, _ = jax.lax.while_loop(lambda st: jnp.any(st[3]), body, state)
    return x, best


def polish(case: LoadCase, x: FlatDesigns, mask: DesignMask, *, static: tuple,
           factor: AbstractFactorSolver = swaps.FACTOR) -> tuple[FlatDesigns, PerSample]:
    """The published swap polish of 0/1 designs (B, nel): (designs, exact compliance).

    Args:
        case: batched load cases (B), 2D.
        x: (B, nel) start designs (0/1 on design cells).
        mask: (B, nel) design cells.
        static: :meth:`sphyr_jax.topopt.options.ReferenceOptions.static`.
        factor: the factorising solver each pass's exact solve keeps the
            factor of (the low-rank scores are computed from it).
    """
    penal, _, n_src, _ = static[5:9]
    shape = case.shape
    grid = st.get_grid(shape)
    nb = x.shape[0]
    edofs = jnp.asarray(st.element_dofs(grid))  # (nel, 8)
    modes_np, lam_np = swaps.modes(shape)
    modes, lam = jnp.asarray(modes_np), jnp.asarray(lam_np)

    def evaluate(x, on):
        fac, u, free, c = swaps.exact(fix_samples(case, on), x, penal=penal,
                                      factor=factor)  # u (n, B)
        e = st.element_energy(grid, u, u)  # unit-modulus energies (*cells, B)
        return c, jnp.moveaxis(e, -1, 0).reshape(nb, -1), (fac, u, free)

    def score(x, c, aux, src, tgt):
        fac, u, free = aux
        n_rank = src.shape[1] + tgt.shape[1]
        # V^T K^{-1} V among the ranked cells' DOFs (one forward substitution).
        rc = jnp.concatenate([src, tgt], axis=1)  # (B, R)
        dofs = edofs[rc].reshape(nb, n_rank * 8)  # (B, 8R)
        r = modes.shape[1]
        g = factor.inverse_quadratic(grid, fac, dofs.reshape(nb, n_rank, 8), free,
                                     modes).reshape(nb, n_rank, r, n_rank, r)
        u_rc = jnp.take_along_axis(u.T[:, None, :], dofs.reshape(nb, n_rank, 8), axis=-1)
        w = jnp.einsum("ak,Bca->Bck", modes, u_rc)  # (B, R, 5)
        g_self = jnp.einsum("Bckcl->Bckl", g)  # (B, R, 5, 5)
        g_st = jnp.transpose(g[:, :n_src, :, n_src:], (0, 1, 3, 2, 4))  # (B, S, T, 5, 5)
        q = swaps.swap_gain(g_self[:, :n_src, None], g_self[:, None, n_src:], g_st,
                            w[:, :n_src, None], w[:, None, n_src:], lam)
        scores = c[:, None, None] - q
        return scores, jnp.isfinite(scores) & (scores > 0)

    return _swap_passes(x, mask, shape, static, evaluate, score)


def polish_exact(case: LoadCase, x: FlatDesigns, mask: DesignMask, *, static: tuple,
                 solver: SolverLike = "banded") -> tuple[FlatDesigns, PerSample]:
    """The published swap polish, every pair scored by an exact solve (any dimension).

    The same passes, rankings (strain energy; neighbour energy over the 8 (2D)
    or 26 (3D) surrounding cells) and running-best scan as :func:`polish`, but
    each of the ``source_limit`` x ``target_limit`` swapped designs of a pass
    is solved outright, in one batch, by ``solver`` — so it needs no
    factorisation to update and serves voxel grids (multigrid CG).  On 2D
    grids it is a second method for :func:`polish` (equal up to rounding).

    Args:
        case: batched load cases (B).
        x: (B, nel) start designs (0/1 on design cells).
        mask: (B, nel) design cells.
        static: :meth:`sphyr_jax.topopt.options.ReferenceOptions.static`.
        solver: linear solver of every solve.

    Returns:
        (designs (B, nel), exact compliance (B,)).
    """
    penal, _, n_src, n_tgt = static[5:9]
    shape = case.shape
    nb, nel = x.shape
    pairs = n_src * n_tgt
    many = jax.tree.map(lambda a: jnp.repeat(a, pairs, axis=0), case)

    def clean(c):
        return jnp.where(jnp.isfinite(c) & (c >= 0.0), c, jnp.inf)

    def evaluate(x, on):
        sol = fea.solve(fix_samples(case, on), x.reshape((nb,) + shape), penal=penal,
                        solver=solver)
        e = fea.element_strain_energy(case, sol.displacements).reshape(nb, nel)
        return clean(sol.compliance), e, on

    def score(x, c, on, src, tgt):
        out = jax.nn.one_hot(src, nel, dtype=x.dtype)  # (B, S, nel)
        into = jax.nn.one_hot(tgt, nel, dtype=x.dtype)  # (B, T, nel)
        swapped = x[:, None, None] - out[:, :, None] + into[:, None, :]  # (B, S, T, nel)
        c = fea.compliance(fix_samples(many, jnp.repeat(on, pairs)),
                           swapped.reshape((nb * pairs,) + shape), penal=penal, solver=solver)
        c = clean(c).reshape(nb, n_src, n_tgt)
        return c, c < jnp.inf

    return _swap_passes(x, mask, shape, static, evaluate, score)
