"""The yardstick on voxel grids (SPhyR-3D).

The published recipe is 2D only; on 3D grids both yardstick names select this
one, built from the same dimension-generic pieces: for every sample,

* SIMP runs (:func:`sphyr_jax.simp.optimize`, cone filter of radius 1.2 = a
  voxel and its 6 face neighbours, optimality criteria, multigrid-CG solves):
  cold at p = 1, 2, 3, the continuation chain p = 1 -> 2 -> 3, and a p = 3 run
  warm-started from the dataset answer;
* a budget-preserving 0/1 rounding of each (:func:`sphyr_jax.optimum.binarize`);
* the dataset answer itself;

and the optimum is the stiffest of those candidates at p = 3 within the
answer's budget.  Because the answer is a candidate, the optimum is never
worse than it.  There is no swap polish in 3D (a swap neighbourhood of a
voxel grid has ~10^5 members and no factorisation to update); SIMP runs stop
after :data:`MAX_ITERATIONS` iterations.

Batches are padded to power-of-two buckets, so every batch size inside a
bucket reuses one compiled program.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from sphyr_jax import fea, simp
from sphyr_jax.loadcase import LoadCase
from sphyr_jax.optimum import OptimumResult, binarize
from sphyr_jax.sharding import bucket_size

MAX_ITERATIONS = 150
SCHEDULE = (1.0, 2.0, 3.0)
PENAL = 3.0
BUDGET_SLACK = 1e-9
OPTIONS = simp.SimpOptions(max_iterations=MAX_ITERATIONS)

_binarize = jax.jit(functools.partial(binarize, ndim=3))


def _pad(tree, size: int):
    n = jax.tree.leaves(tree)[0].shape[0]
    idx = np.arange(size) % n
    return jax.tree.map(lambda a: np.asarray(a)[idx], tree)


def _optimize(case_np, penal, x0=None):
    """SIMP of a batch (padded to a bucket), NumPy physical densities out."""
    n = case_np.load_mask.shape[0]
    size = bucket_size(n)
    case_p = _pad(case_np, size)
    penal = _pad(np.asarray(penal, np.float64), size)
    x0 = None if x0 is None else _pad(x0, size)
    res = simp.optimize(case_p, penal, x0, options=OPTIONS)
    return np.asarray(res.densities)[:n], np.asarray(res.iterations)[:n], np.asarray(
        res.converged)[:n]


def voxel_optimum_batch(load_case: LoadCase, seeds=None):
    """Optima of a batch of 3D samples (see the module docstring).

    Args:
        load_case: batched 3D load cases (leading axis B).
        seeds: optional (B, nz, ny, nx) seed designs (default: the answers).

    Returns:
        An :class:`~sphyr_jax.optimum.OptimumResult` (NumPy arrays).
    """
    fea.require_x64()
    case = jax.tree.map(np.asarray, load_case)
    nb = case.load_mask.shape[0]
    mask, pinned = case.design_mask, case.pinned
    seeds = pinned if seeds is None else np.where(mask, np.clip(seeds, 0.0, 1.0), pinned)
    tile = lambda a, k: np.concatenate([a] * k)  # noqa: E731
    cases3 = jax.tree.map(lambda a: tile(a, 3), case)
    cold, its, conv = _optimize(cases3, np.repeat(SCHEDULE, nb))  # (3B, ...)
    designs = [cold[k * nb:(k + 1) * nb] for k in range(3)]
    chain = designs[0]
    iterations = its.reshape(3, nb).sum(0)
    converged = conv.reshape(3, nb).all(0)
    for p in SCHEDULE[1:]:
        chain, its, conv = _optimize(case, np.full(nb, p), chain)
        designs.append(chain)
        iterations, converged = iterations + its, converged & conv
    warm, its, conv = _optimize(case, np.full(nb, PENAL), seeds)
    designs += [warm, seeds]
    iterations, converged = iterations + its, converged & conv
    continuous = np.stack(designs, axis=1)  # (B, K, ...)
    k = continuous.shape[1]
    free_budget = np.asarray(simp.budget_split(mask, pinned, case.volume_fraction)[1])
    rounded = np.asarray(_binarize(continuous, mask[:, None], pinned[:, None],
                                   free_budget[:, None]))
    candidates = np.concatenate([continuous, rounded], axis=1)  # (B, 2K, ...)
    flat_cases = jax.tree.map(lambda a: np.repeat(a, 2 * k, axis=0), case)
    flat = candidates.reshape((nb * 2 * k,) + candidates.shape[2:])
    scores = np.asarray(fea.compliance(flat_cases, flat, PENAL)).reshape(nb, 2 * k)
    nel = int(np.prod(mask.shape[1:]))
    budget = case.volume_fraction * nel + BUDGET_SLACK
    within = candidates.reshape(nb, 2 * k, -1).sum(-1) <= budget[:, None]
    scores = np.where(within, scores, np.inf)
    best = np.argmin(scores, axis=1)
    best_x = candidates[np.arange(nb), best]
    return OptimumResult(
        densities=best_x,
        compliance=scores[np.arange(nb), best],
        volume_fraction=best_x.reshape(nb, -1).mean(-1),
        iterations=iterations,
        converged=converged,
    )
