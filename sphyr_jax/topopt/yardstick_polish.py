"""The reference yardstick's swap polish, scored by low-rank updates.

The published polish (:mod:`sphyr_jax.topopt.yardstick`) moves one cell of material
per pass: the ``source_limit`` solid design cells of lowest unit-modulus strain
energy are paired (source-major) with the ``target_limit`` empty design cells
whose most strained solid neighbour (8-neighbourhood) is largest, ties in cell
order, and the first pair whose compliance beats the best so far by more than
1e-12 wins; a pass without one ends the polish (at most ``polish_passes``).

The published method solves every pair from scratch.  Here a pass costs one
factorisation: a swap changes two element moduli by $\\mp\\delta$, a rank-10
change $W D W^T$ of $K$ ($W = [P_s V, P_t V]$ with the element's 5 deformation
modes $V$, $D = \\mathrm{diag}(-\\delta\\Lambda, \\delta\\Lambda)$), so by the
Sherman-Morrison-Woodbury identity

$$c' = c - w^T (D^{-1} + W^T K^{-1} W)^{-1} w, \\qquad w = W^T u,$$

with $K^{-1} W$ restricted to the DOFs of the ranked cells from one forward
substitution ($W^T K^{-1} W = (L^{-1} W)^T (L^{-1} W)$).  Every accepted design
is solved exactly at the start of the next pass (its energies rank the next
pass's cells), and the reported compliance is that exact solve.

Arrays are batch-first (B, nel) outside, batch-last inside the solver.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import _banded, _small, fea
from sphyr_jax.fem.mesh import E0, EMIN, get_mesh
from sphyr_jax.problem.loadcase import LoadCase

IMPROVEMENT = 1e-12  # absolute, as published


@functools.lru_cache(maxsize=8)
def element_modes(shape) -> tuple[np.ndarray, np.ndarray]:
    """Deformation modes (8, 5) and their stiffnesses (5,) of the unit element."""
    lam, vec = np.linalg.eigh(get_mesh(*shape).ke)
    keep = lam > 1e-10 * lam.max()
    return vec[:, keep], lam[keep]


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


def _exact(mesh, case: LoadCase, x, penal):
    """Factor (batch-last), displacements (n, B) and compliance (B,) of designs (B, nel)."""
    nb = x.shape[0]
    moduli = fea.simp_moduli(x.reshape((nb,) + mesh.shape), penal)
    free = jnp.asarray(case.free_dofs, jnp.float64).T  # (n, B)
    fac = _banded.factor(mesh, _banded.row_band(mesh, jnp.moveaxis(moduli, 0, -1), free))
    f = jnp.asarray(case.force, jnp.float64).T * free
    u = _banded.solve(mesh, fac, f)
    c = jnp.sum(f * u, axis=0)
    has_load = jnp.any(f != 0.0, axis=0)
    c = jnp.where(has_load & jnp.isfinite(c) & (c >= 0.0), c, jnp.inf)
    return fac, u, free, c


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
        static: :meth:`sphyr_jax.topopt.yardstick.ReferenceOptions.static`.
        evaluate: ``x -> (compliance (B,), unit-modulus energies (B, nel), aux)``.
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
        c, e, aux = evaluate(x)
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


def polish(case: LoadCase, x, mask, static):
    """The published swap polish of 0/1 designs (B, nel): (designs, exact compliance).

    Args:
        case: batched load cases (B).
        x: (B, nel) start designs (0/1 on design cells).
        mask: (B, nel) design cells.
        static: :meth:`sphyr_jax.topopt.yardstick.ReferenceOptions.static`.
    """
    penal, _, n_src, _ = static[5:9]
    shape = case.shape
    mesh = get_mesh(*shape)
    nb = x.shape[0]
    n = mesh.n_dofs
    edofs = jnp.asarray(mesh.edofs)  # (nel, 8)
    ke = jnp.asarray(mesh.ke)
    modes_np, lam_np = element_modes(shape)
    modes, lam = jnp.asarray(modes_np), jnp.asarray(lam_np)
    k = lam.shape[0]
    delta = (E0 - EMIN) * 1.0  # E(1) - E(0) at any penalty
    d_inv = jnp.concatenate([-1.0 / (delta * lam), 1.0 / (delta * lam)])

    def evaluate(x):
        fac, u, free, c = _exact(mesh, case, x, penal)  # u (n, B)
        ue = u[edofs]  # (nel, 8, B)
        e = jnp.einsum("eaB,ab,ebB->Be", ue, ke, ue)  # unit-modulus energies (B, nel)
        return c, e, (fac, u, free)

    def score(x, c, aux, src, tgt):
        fac, u, free = aux
        n_rank = src.shape[1] + tgt.shape[1]
        # K^{-1} restricted to the ranked cells' DOFs: Y = L^{-1} E, K^{-1} = Y^T Y.
        rc = jnp.concatenate([src, tgt], axis=1)  # (B, R)
        dofs = edofs[rc].reshape(nb, n_rank * 8)  # (B, 8R)
        unit = jax.nn.one_hot(dofs, n, dtype=jnp.float64) * free.T[:, None, :]  # (B, 8R, n)
        y = _banded.forward(mesh, fac, unit.transpose(2, 1, 0))  # (rows, 8R, B)
        y = y.reshape(y.shape[0], n_rank, 8, nb)
        m = jnp.einsum("ak,rcaB->Bckr", modes, y)  # (B, R, 5, rows)
        u_rc = jnp.take_along_axis(u.T[:, None, :], dofs.reshape(nb, n_rank, 8), axis=-1)
        w = jnp.einsum("ak,Bca->Bck", modes, u_rc)  # (B, R, 5)
        g_self = jnp.einsum("Bckr,Bclr->Bckl", m, m)  # (B, R, 5, 5)
        g_st = jnp.einsum("Bskr,Btlr->Bstkl", m[:, :n_src], m[:, n_src:])  # (B, S, T, 5, 5)
        a_ss = g_self[:, :n_src, None] + jnp.diag(d_inv[:k])  # (B, S, 1, 5, 5), indefinite
        a_tt = g_self[:, None, n_src:] + jnp.diag(d_inv[k:])  # (B, 1, T, 5, 5), SPD
        # q = r^T A^{-1} r for A = [[a_ss, G], [G^T, a_tt]] by blocks: the addition
        # block a_tt first, then the removal's Schur complement a_ss - G a_tt^{-1} G^T
        # (negative definite).  Unrolled 5 x 5 algebra (no batched LAPACK call: those
        # share XLA's CPU thread pool and can deadlock when several devices run them).
        inv_tt = _small.spd_inverse(a_tt)
        r_s, r_t = w[:, :n_src, None], w[:, None, n_src:]  # (B, S, 1, 5), (B, 1, T, 5)
        y = jnp.einsum("...kl,...l->...k", inv_tt, r_t)
        v = r_s - jnp.einsum("...kl,...l->...k", g_st, y)  # (B, S, T, 5)
        schur = a_ss - jnp.einsum("...kl,...lm,...nm->...kn", g_st, inv_tt, g_st)
        q = jnp.sum(r_t * y, axis=-1) - _small.spd_quadratic(-schur, v)
        scores = c[:, None, None] - q
        return scores, jnp.isfinite(scores) & (scores > 0)

    return _swap_passes(x, mask, shape, static, evaluate, score)


def polish_exact(case: LoadCase, x, mask, static, solver="banded"):
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
        static: :meth:`sphyr_jax.topopt.yardstick.ReferenceOptions.static`.
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

    def evaluate(x):
        sol = fea.solve(case, x.reshape((nb,) + shape), penal, solver)
        e = fea.element_strain_energy(case, sol.displacements).reshape(nb, nel)
        return clean(sol.compliance), e, None

    def score(x, c, aux, src, tgt):
        out = jax.nn.one_hot(src, nel, dtype=x.dtype)  # (B, S, nel)
        into = jax.nn.one_hot(tgt, nel, dtype=x.dtype)  # (B, T, nel)
        swapped = x[:, None, None] - out[:, :, None] + into[:, None, :]  # (B, S, T, nel)
        c = fea.compliance(many, swapped.reshape((nb * pairs,) + shape), penal, solver)
        c = clean(c).reshape(nb, n_src, n_tgt)
        return c, c < jnp.inf

    return _swap_passes(x, mask, shape, static, evaluate, score)
