"""The ``strong`` yardstick: a harder search for the optimum of a masked region (2D).

For one sample the design variables are its design cells; every other cell is
pinned to the ground-truth density (load and support cells solid) and the
material budget is the ground-truth volume fraction of the whole grid
(:mod:`sphyr_jax.topopt.budget`).  The optimum is the stiffest design, scored
at p = 3, among

* cold SIMP runs at p = 1, 2, 3 and the warm continuation chain p = 1 -> 2 -> 3
  (and a second chain without the filter),
* the dataset answer and a p = 3 run warm-started from it,
* a budget-preserving 0/1 rounding of each of those,
* an exhaustive swap polish (:mod:`sphyr_jax.topopt.strong_polish`) of the best
  few rounded designs, then a tabu search from the best,

keeping only designs within budget.  The dataset answer is a candidate, so the
optimum is never worse than it; on the stored samples it is at least as stiff
as the published optimum (:mod:`sphyr_jax.topopt.yardstick`).  Many samples run
together: SIMP runs of all samples share a pool of slots
(:func:`run_simp_batch`) that refills as runs finish, and each stage is one
batched device call.  Settings: :class:`~sphyr_jax.topopt.options.StrongOptions`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence

import jax
import numpy as np

from sphyr_jax.fem import fea
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.sharding import batch_call
from sphyr_jax.topopt import simp, strong_polish
from sphyr_jax.topopt.budget import binarize, budget_limit, free_budget
from sphyr_jax.topopt.options import DEFAULT_STRONG, StrongOptions
from sphyr_jax.topopt.result import OptimumResult

HOPELESS = 10.0  # rounded designs this many times worse than the best are not polished


# ----------------------------------------------------------------------------
# SIMP run scheduling.


@dataclasses.dataclass(frozen=True)
class Run:
    """One SIMP run of a batch: sample index, penalty and start.

    ``start`` is ``"cold"`` (uniform budget), ``"seed"`` (the sample's seed
    design) or the index of an earlier run whose physical densities it starts
    from (continuation).  ``radius`` overrides the filter radius of the run.
    """

    sample: int
    penal: float
    start: str | int = "cold"
    radius: float | None = None


def _segment(load_case, penal, state, radius, *, options, steps):
    return simp.run_segment(load_case, penal, state, options, steps, radius)


def _finish(load_case, penal, state, radius, *, options):
    return simp.finish(load_case, penal, state, options, radius)


def _take(case_np: dict, idx) -> LoadCase:
    return LoadCase(**{name: a[idx] for name, a in case_np.items()})


def _host_physical(x, mask, pinned, radius):
    h = simp.filter_matrix(mask.shape[-2], mask.shape[-1], float(radius))
    flat = x.reshape(x.shape[:-2] + (-1,))
    phys = (flat @ h.T) / h.sum(axis=1)
    return np.where(mask, phys.reshape(x.shape), pinned)


def _host_init(case_np: dict, i: int, start_design):
    mask = case_np["design_mask"][i]
    pinned = case_np["pinned"][i]
    if start_design is None:
        free, _ = free_budget(mask, pinned, case_np["volume_fraction"][i], 2)
        start = float(free) / max(int(mask.sum()), 1)
    else:
        start = np.clip(start_design, 1e-3, 1.0)
    return np.where(mask, start, pinned).reshape(-1)


def run_simp_batch(load_case: LoadCase, runs: Sequence[Run], seeds=None,
                   options: simp.SimpOptions = simp.DEFAULT_OPTIONS, pool: int = 128,
                   segment: int = 25, progress=None,
                   num_devices: int | None = None) -> simp.SimpResult:
    """Run many SIMP runs over a slot pool that refills as runs finish.

    All runs advance together ``segment`` iterations at a time in one compiled
    loop; finished runs leave their slot to the next ready run (a
    continuation run becomes ready when its parent finishes), and the pool
    shrinks for the last stragglers.  Results equal running each run alone.

    Args:
        load_case: batched load cases (leading axis: samples).
        runs: the runs; continuation parents must come earlier in the list.
        seeds: (samples, nely, nelx) designs for runs with ``start="seed"``.
        options: SIMP settings.
        pool: number of slots.
        segment: iterations per device call.
        progress: optional callable(done_runs, total_runs).
        num_devices: devices the pool is split over (None: all local).

    Returns:
        A :class:`~sphyr_jax.topopt.simp.SimpResult` with one entry per run (NumPy).
    """
    fea.require_x64()
    case_np = {f.name: np.asarray(getattr(load_case, f.name))
               for f in dataclasses.fields(load_case)}
    shape = load_case.shape
    nel = shape[0] * shape[1]
    n_runs = len(runs)
    if n_runs == 0:
        raise ValueError("no runs")
    children: dict[int, list[int]] = {}
    ready: deque[int] = deque()
    for r, run in enumerate(runs):
        if isinstance(run.start, int):
            if not 0 <= run.start < r:
                raise ValueError(f"run {r}: parent {run.start} must be an earlier run")
            children.setdefault(run.start, []).append(r)
        else:
            ready.append(r)
    radii = np.array([options.filter_radius if run.radius is None else run.radius
                      for run in runs])
    final_x = np.zeros((n_runs, nel))
    final_its = np.zeros(n_runs, np.int32)
    final_change = np.full(n_runs, np.inf)

    sizes = sorted({max(8, min(pool, 1 << max(0, (n_runs - 1).bit_length()))) // d
                    for d in (1, 4, 16)} - {0}, reverse=True)
    sizes = [s for s in sizes if s >= 4] or [8]
    size = sizes[0]
    slot_run = [-1] * size
    x = np.zeros((size, nel))
    its = np.zeros(size, np.int32)
    change = np.full(size, np.inf)
    finished = 0

    def start_design(r):
        run = runs[r]
        if run.start == "cold":
            return None
        if run.start == "seed":
            if seeds is None:
                raise ValueError("a run starts from a seed but no seeds were given")
            return np.asarray(seeds[run.sample], np.float64)
        parent = run.start
        i = runs[parent].sample
        return _host_physical(final_x[parent].reshape(shape), case_np["design_mask"][i],
                              case_np["pinned"][i], radii[parent])

    while True:
        for k in range(size):
            if slot_run[k] < 0 and ready:
                r = ready.popleft()
                slot_run[k] = r
                x[k] = _host_init(case_np, runs[r].sample, start_design(r))
                its[k] = 0
                change[k] = np.inf
        active = [k for k in range(size) if slot_run[k] >= 0]
        if not active:
            break
        smaller = [s for s in sizes if s < size and s >= len(active)]
        if not ready and smaller:
            new = smaller[-1]
            x, its, change = x[active], its[active], change[active]
            slot_run = [slot_run[k] for k in active]
            pad = new - len(active)
            x = np.concatenate([x, np.repeat(x[:1], pad, 0)])
            its = np.concatenate([its, np.repeat(its[:1], pad)])
            change = np.concatenate([change, np.repeat(change[:1], pad)])
            slot_run += [-1] * pad
            size = new
            active = list(range(len(active)))
        idle = np.array([r < 0 for r in slot_run])
        filler = slot_run[active[0]]
        samples = np.array([runs[r if r >= 0 else filler].sample for r in slot_run])
        penal = np.array([runs[r if r >= 0 else filler].penal for r in slot_run])
        pool_case = _take(case_np, samples)
        state = simp.SimpState(x=x, iterations=its, done=idle, change=change)
        radius = np.array([radii[r if r >= 0 else filler] for r in slot_run])
        state = batch_call(_segment, pool_case, penal, state, radius, options=options,
                           steps=segment, num_devices=num_devices)
        x = np.array(state.x)
        its = np.array(state.iterations)
        change = np.array(state.change)
        done = np.array(state.done)
        for k in range(size):
            r = slot_run[k]
            if r >= 0 and done[k]:
                final_x[r] = x[k]
                final_its[r] = its[k]
                final_change[r] = change[k]
                slot_run[k] = -1
                finished += 1
                ready.extend(children.get(r, []))
                if progress is not None:
                    progress(finished, n_runs)

    cases = _take(case_np, np.array([run.sample for run in runs]))
    penal = np.array([run.penal for run in runs])
    state = simp.SimpState(x=final_x, iterations=final_its,
                           done=np.ones(n_runs, bool), change=final_change)
    res = batch_call(_finish, cases, penal, state, radii, options=options,
                     num_devices=num_devices)
    return jax.tree.map(np.asarray, res)


# ----------------------------------------------------------------------------
# The search.


def _standard_runs(n_samples: int, schedule: Sequence[float], penal: float,
                   extra_radius: float | None = None) -> list[Run]:
    runs: list[Run] = []
    for i in range(n_samples):
        base = len(runs)
        runs.extend(Run(i, p) for p in schedule)  # cold runs
        parent = base  # the chain's first stage is the cold run at schedule[0]
        for p in schedule[1:]:
            runs.append(Run(i, p, parent))
            parent = len(runs) - 1
        runs.append(Run(i, penal, "seed"))
        if extra_radius is not None:  # a second chain with another filter
            parent = base
            for p in schedule[1:]:
                runs.append(Run(i, p, parent, radius=extra_radius))
                parent = len(runs) - 1
    return runs


_score = jax.jit(fea.compliance, static_argnames=("solver",))
_binarize = jax.jit(binarize)


def strong_optimum_batch(load_case: LoadCase, seeds=None,
                         options: StrongOptions = DEFAULT_STRONG,
                         progress=None) -> OptimumResult:
    """Strong-search optima of many 2D samples (different loads, masks and budgets).

    Args:
        load_case: batched load cases (leading axis B); ``volume_fraction`` is
            each sample's budget and ``pinned`` its dataset answer.
        seeds: (B, nely, nelx) seed designs (default: the dataset answers,
            ``load_case.pinned``); each is a candidate and starts a SIMP run.
        options: static settings.
        progress: optional callable(stage, done, total).

    Returns:
        An :class:`~sphyr_jax.topopt.result.OptimumResult` (NumPy arrays).

    Raises:
        ValueError: a voxel load case (its yardstick is the reference recipe
            with voxel settings: :func:`sphyr_jax.topopt.optimum.optimum_batch`
            picks it).
    """
    fea.require_x64()
    if load_case.ndim != 2:
        raise ValueError("the strong search is for 2D grids; on voxel grids "
                         "optimum_batch(..., yardstick='strong') runs the voxel yardstick")
    case_np = jax.tree.map(np.asarray, load_case)
    nb = case_np.load_mask.shape[0]
    shape = load_case.shape
    nel = shape[0] * shape[1]
    mask = case_np.design_mask
    pinned = case_np.pinned
    seeds = pinned if seeds is None else np.where(mask, np.clip(seeds, 0.0, 1.0), pinned)
    solver = options.simp.solver

    runs = _standard_runs(nb, options.penal_schedule, options.penal, options.extra_chain_radius)
    per = len(runs) // nb
    sim = run_simp_batch(
        case_np, runs, seeds, options.simp, options.pool, options.segment,
        progress=None if progress is None else (lambda d, t: progress("simp", d, t)),
        num_devices=options.num_devices,
    )
    iterations = sim.iterations.reshape(nb, per).sum(axis=1)
    converged = sim.converged.reshape(nb, per).all(axis=1)

    # Candidates: every run's physical design and the seed, then their roundings.
    continuous = np.concatenate([sim.densities.reshape((nb, per) + shape),
                                 seeds[:, None]], axis=1)  # (B, K, ...)
    k = continuous.shape[1]
    free = np.asarray(free_budget(case_np.design_mask, case_np.pinned,
                                  case_np.volume_fraction, 2)[0])
    rounded = np.asarray(_binarize(continuous, mask[:, None], pinned[:, None],
                                   free[:, None]))
    candidates = np.concatenate([continuous, rounded], axis=1)  # (B, 2K, ...)
    scores = np.asarray(_score(case_np, candidates.transpose(1, 0, 2, 3),
                               options.penal, solver)).T  # (B, 2K)
    budget = budget_limit(case_np.volume_fraction, nel)
    within = candidates.sum(axis=(-2, -1)) <= budget[:, None]
    scores = np.where(within, scores, np.inf)
    best = np.argmin(scores, axis=1)
    best_c = scores[np.arange(nb), best]
    best_x = candidates[np.arange(nb), best]

    # Descent polish of the rounding of the best candidate and of the best
    # distinct rounded designs (hopeless ones skipped), then a tabu search
    # from each sample's best polished design.
    owner, starts = [], []
    for i in range(nb):
        chosen: list[np.ndarray] = []
        first = best[i] if best[i] >= k else best[i] + k  # rounding of the best
        limit = HOPELESS * np.min(scores[i, k:])
        for j in [first] + list(np.argsort(scores[i, k:]) + k):
            if len(chosen) >= options.polish_starts:
                break
            cand = candidates[i, j]
            if scores[i, j] <= limit and not any(np.array_equal(cand, c) for c in chosen):
                chosen.append(cand)
        owner += [i] * len(chosen)
        starts += chosen
    owner = np.asarray(owner, np.int64)
    best_x, best_c = _keep_best(best_x, best_c, owner, starts, case_np, budget, options,
                                solver, tabu=0)
    if progress is not None:
        progress("polish", nb, nb)
    if options.tabu_passes > 0:
        best_x, best_c = _keep_best(best_x, best_c, np.arange(nb), list(best_x), case_np,
                                    budget, options, solver, tabu=options.tabu_passes)
        if progress is not None:
            progress("tabu", nb, nb)
    return OptimumResult(
        densities=best_x,
        compliance=best_c,
        volume_fraction=best_x.mean(axis=(-2, -1)),
        iterations=iterations,
        converged=converged,
    )


def _keep_best(best_x, best_c, owner, starts, case_np, budget, options, solver, tabu):
    """Polish ``starts`` (of samples ``owner``) and keep any within-budget improvement."""
    if not len(starts):
        return best_x, best_c
    res = strong_polish.polish(
        jax.tree.map(lambda a: a[owner], case_np), np.stack(starts), options.polish_passes,
        solver, num_devices=options.num_devices, tabu=tabu, tenure=options.tabu_tenure,
    )
    best_x, best_c = best_x.copy(), best_c.copy()
    for j, i in enumerate(owner):
        x, c = res.densities[j], float(res.compliance[j])
        if c < best_c[i] and x.sum() <= budget[i]:
            best_x[i], best_c[i] = x, c
    return best_x, best_c


