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
import math
from collections import deque
from collections.abc import Callable, Sequence

import jax
import numpy as np

from sphyr_jax.fem import fea
from sphyr_jax.fem.array_types import Densities
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.sharding import batch_call
from sphyr_jax.topopt import simp, strong_polish
from sphyr_jax.topopt.budget import binarize, budget_limit, free_budget
from sphyr_jax.topopt.options import DEFAULT_STRONG, Progress, StrongOptions
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
    return simp.run_segment(load_case, penal, state, options=options, steps=steps,
                            radius=radius)


def _finish(load_case, penal, state, radius, *, options):
    return simp.finish(load_case, penal, state, options=options, radius=radius)


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
        free, _ = free_budget(mask, pinned, case_np["volume_fraction"][i], ndim=2)
        start = float(free) / max(int(mask.sum()), 1)
    else:
        start = np.clip(start_design, 1e-3, 1.0)
    return np.where(mask, start, pinned).reshape(-1)


def _dependencies(runs: Sequence[Run]) -> tuple[dict[int, list[int]], deque[int]]:
    """The continuation runs of each run, and the runs ready from the start."""
    children: dict[int, list[int]] = {}
    ready: deque[int] = deque()
    for r, run in enumerate(runs):
        if isinstance(run.start, int):
            if not 0 <= run.start < r:
                raise ValueError(f"run {r}: parent {run.start} must be an earlier run")
            children.setdefault(run.start, []).append(r)
        else:
            ready.append(r)
    return children, ready


def _pool_ladder(n_runs: int, pool: int) -> list[int]:
    """Slot counts the pool moves through, largest first (a power of two, /4, /16)."""
    sizes = sorted({max(8, min(pool, 1 << max(0, (n_runs - 1).bit_length()))) // d
                    for d in (1, 4, 16)} - {0}, reverse=True)
    return [s for s in sizes if s >= 4] or [8]


@dataclasses.dataclass
class _SlotPool:
    """The host's view of the slot pool: the run in each slot and its state.

    Attributes:
        run: the run index of each slot (-1: idle).
        x: (slots, nel) design variables; its, change: (slots,) iterations and
            last design change.
    """

    run: list[int]
    x: np.ndarray
    its: np.ndarray
    change: np.ndarray

    @classmethod
    def empty(cls, size: int, nel: int) -> _SlotPool:
        return cls([-1] * size, np.zeros((size, nel)), np.zeros(size, np.int32),
                   np.full(size, np.inf))

    def fill(self, ready: deque[int], start) -> None:
        """Idle slots take the ready runs in order; ``start(r)`` is run r's first design."""
        for k in range(len(self.run)):
            if self.run[k] < 0 and ready:
                r = ready.popleft()
                self.run[k] = r
                self.x[k] = start(r)
                self.its[k] = 0
                self.change[k] = np.inf

    def busy(self) -> list[int]:
        return [k for k in range(len(self.run)) if self.run[k] >= 0]

    def shrink(self, size: int) -> None:
        """Busy slots first, padded to ``size`` slots with copies of the first."""
        busy = self.busy()
        pad = size - len(busy)
        self.x = np.concatenate([self.x[busy], np.repeat(self.x[busy][:1], pad, 0)])
        self.its = np.concatenate([self.its[busy], np.repeat(self.its[busy][:1], pad)])
        self.change = np.concatenate([self.change[busy],
                                      np.repeat(self.change[busy][:1], pad)])
        self.run = [self.run[k] for k in busy] + [-1] * pad

    def runs_or_filler(self) -> list[int]:
        """Each slot's run; idle slots repeat the first busy slot's (a well-posed filler)."""
        filler = self.run[self.busy()[0]]
        return [r if r >= 0 else filler for r in self.run]

    def state(self) -> simp.SimpState:
        idle = np.array([r < 0 for r in self.run])
        return simp.SimpState(x=self.x, iterations=self.its, done=idle, change=self.change)

    def advance(self, state: simp.SimpState) -> list[int]:
        """Take the state after a segment; return the slots whose runs finished."""
        self.x = np.array(state.x)
        self.its = np.array(state.iterations)
        self.change = np.array(state.change)
        done = np.array(state.done)
        return [k for k in range(len(self.run)) if self.run[k] >= 0 and done[k]]


def run_simp_batch(load_case: LoadCase, runs: Sequence[Run], seeds: Densities | None = None,
                   *, options: simp.SimpOptions = simp.DEFAULT_OPTIONS, pool: int = 128,
                   segment: int = 25, progress: Callable[[int, int], None] | None = None,
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
    children, ready = _dependencies(runs)
    radii = np.array([options.filter_radius if run.radius is None else run.radius
                      for run in runs])
    final_x = np.zeros((n_runs, nel))  # by run, once finished
    final_its = np.zeros(n_runs, np.int32)
    final_change = np.full(n_runs, np.inf)

    def start_design(r):
        run = runs[r]
        if run.start == "cold":
            design = None
        elif run.start == "seed":
            if seeds is None:
                raise ValueError("a run starts from a seed but no seeds were given")
            design = np.asarray(seeds[run.sample], np.float64)
        else:
            parent = run.start
            i = runs[parent].sample
            design = _host_physical(final_x[parent].reshape(shape), case_np["design_mask"][i],
                                    case_np["pinned"][i], radii[parent])
        return _host_init(case_np, run.sample, design)

    sizes = _pool_ladder(n_runs, pool)
    slots = _SlotPool.empty(sizes[0], nel)
    finished = 0
    while True:
        slots.fill(ready, start_design)
        busy = slots.busy()
        if not busy:
            break
        smaller = [s for s in sizes if s < len(slots.run) and s >= len(busy)]
        if not ready and smaller:
            slots.shrink(smaller[-1])
        ids = slots.runs_or_filler()
        state = batch_call(_segment, _take(case_np, np.array([runs[r].sample for r in ids])),
                           np.array([runs[r].penal for r in ids]), slots.state(),
                           np.array([radii[r] for r in ids]), options=options, steps=segment,
                           num_devices=num_devices)
        for k in slots.advance(state):
            r = slots.run[k]
            final_x[r], final_its[r], final_change[r] = slots.x[k], slots.its[k], slots.change[k]
            slots.run[k] = -1
            finished += 1
            ready.extend(children.get(r, []))
            if progress is not None:
                progress(finished, n_runs)

    cases = _take(case_np, np.array([run.sample for run in runs]))
    penal = np.array([run.penal for run in runs])
    state = simp.SimpState(x=final_x, iterations=final_its, done=np.ones(n_runs, bool),
                           change=final_change)
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


def strong_optimum_batch(load_case: LoadCase, seeds: Densities | None = None, *,
                         options: StrongOptions = DEFAULT_STRONG,
                         progress: Progress | None = None) -> OptimumResult:
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
    mask, pinned = case_np.design_mask, case_np.pinned
    seeds = pinned if seeds is None else np.where(mask, np.clip(seeds, 0.0, 1.0), pinned)

    runs = _standard_runs(nb, options.penal_schedule, options.penal, options.extra_chain_radius)
    sim = run_simp_batch(
        case_np, runs, seeds, options=options.simp, pool=options.pool,
        segment=options.segment,
        progress=None if progress is None else (lambda d, t: progress("simp", d, t)),
        num_devices=options.num_devices,
    )
    per = len(runs) // nb
    budget = budget_limit(case_np.volume_fraction, math.prod(load_case.shape))
    candidates, scores = _scored_candidates(case_np, sim, seeds, budget, options)
    best = np.argmin(scores, axis=1)
    best_c = scores[np.arange(nb), best]
    best_x = candidates[np.arange(nb), best]

    # Descent polish of the rounding of the best candidate and of the best
    # distinct rounded designs (hopeless ones skipped), then a tabu search
    # from each sample's best polished design.
    owner, starts = _polish_starts(candidates, scores, best, options.polish_starts)
    best_x, best_c = _keep_best(best_x, best_c, owner, starts, case_np, budget, options, tabu=0)
    if progress is not None:
        progress("polish", nb, nb)
    if options.tabu_passes > 0:
        best_x, best_c = _keep_best(best_x, best_c, np.arange(nb), list(best_x), case_np,
                                    budget, options, tabu=options.tabu_passes)
        if progress is not None:
            progress("tabu", nb, nb)
    return OptimumResult(
        densities=best_x,
        compliance=best_c,
        volume_fraction=best_x.mean(axis=(-2, -1)),
        iterations=sim.iterations.reshape(nb, per).sum(axis=1),
        converged=sim.converged.reshape(nb, per).all(axis=1),
    )


def _scored_candidates(case_np: LoadCase, sim: simp.SimpResult, seeds, budget,
                       options: StrongOptions):
    """Every run's physical design and the seed, then their 0/1 roundings, (B, 2K, ...),
    and their compliances at ``options.penal`` (B, 2K), +inf over ``budget`` (B,)."""
    nb = case_np.load_mask.shape[0]
    shape = case_np.load_mask.shape[1:]
    mask, pinned = case_np.design_mask, case_np.pinned
    continuous = np.concatenate([sim.densities.reshape((nb, -1) + shape),
                                 seeds[:, None]], axis=1)  # (B, K, ...)
    free = np.asarray(free_budget(mask, pinned, case_np.volume_fraction, ndim=2)[0])
    rounded = np.asarray(_binarize(continuous, mask[:, None], pinned[:, None],
                                   free[:, None]))
    candidates = np.concatenate([continuous, rounded], axis=1)  # (B, 2K, ...)
    scores = np.asarray(_score(case_np, candidates.transpose(1, 0, 2, 3),
                               penal=options.penal, solver=options.simp.solver)).T  # (B, 2K)
    within = candidates.sum(axis=(-2, -1)) <= budget[:, None]
    return candidates, np.where(within, scores, np.inf)


def _polish_starts(candidates, scores, best, count: int):
    """The designs each sample's polish starts from: the rounding of its best
    candidate, then its best distinct rounded candidates, at most ``count``,
    none :data:`HOPELESS`-ly worse than the best rounding.

    Returns:
        (owner (P,): the sample of each start, starts: list of P designs).
    """
    k = candidates.shape[1] // 2  # candidates [k:] are the roundings of [:k]
    owner, starts = [], []
    for i in range(candidates.shape[0]):
        chosen: list[np.ndarray] = []
        first = best[i] if best[i] >= k else best[i] + k  # rounding of the best
        limit = HOPELESS * np.min(scores[i, k:])
        for j in [first] + list(np.argsort(scores[i, k:]) + k):
            if len(chosen) >= count:
                break
            cand = candidates[i, j]
            if scores[i, j] <= limit and not any(np.array_equal(cand, c) for c in chosen):
                chosen.append(cand)
        owner += [i] * len(chosen)
        starts += chosen
    return np.asarray(owner, np.int64), starts


def _keep_best(best_x, best_c, owner, starts, case_np, budget, options, tabu):
    """Polish ``starts`` (of samples ``owner``) and keep any within-budget improvement."""
    if not len(starts):
        return best_x, best_c
    res = strong_polish.polish(
        jax.tree.map(lambda a: a[owner], case_np), np.stack(starts),
        max_passes=options.polish_passes, solver=options.simp.solver,
        num_devices=options.num_devices, tabu=tabu, tenure=options.tabu_tenure,
    )
    best_x, best_c = best_x.copy(), best_c.copy()
    for j, i in enumerate(owner):
        x, c = res.densities[j], float(res.compliance[j])
        if c < best_c[i] and x.sum() <= budget[i]:
            best_x[i], best_c[i] = x, c
    return best_x, best_c
