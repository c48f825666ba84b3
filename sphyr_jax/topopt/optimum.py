"""Optima of a masked region (the yardsticks) and their cache.

Two yardsticks share one interface (:func:`optimum_batch`,
:class:`OptimumCache`, ``optimum="reference"`` or ``"strong"``):

* ``reference`` (the default, :mod:`sphyr_jax.topopt.yardstick`) follows the
  published recipe step for step and reproduces the published
  ``optimal_compliance`` and ``topology_score``;
* ``strong`` (this module's :func:`reference_optimum_batch`, described below)
  searches harder: it is at least as stiff as the published optimum on every
  stored sample, so scores measured against it are stricter.

The strong search, for one sample:

For one sample the design variables are its design cells; every other cell is
pinned to the ground-truth density (load and support cells solid) and the
material budget is the ground-truth volume fraction of the whole grid.  The
optimum is the stiffest design, scored at p = 3, among

* cold SIMP runs at p = 1, 2, 3 and the warm continuation chain p = 1 -> 2 -> 3,
* the dataset answer and a p = 3 run warm-started from it,
* a budget-preserving 0/1 rounding of each of those,
* an exhaustive swap polish (:mod:`sphyr_jax.topopt.polish`) of the best few rounded
  designs,

keeping only designs within budget.  The dataset answer is a candidate, so the
optimum is never worse than it.  Many samples run together: SIMP runs of all
samples share a pool of slots (:func:`run_simp_batch`) that refills as runs
finish, and each stage is one batched device call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
from collections import deque
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import fea
from sphyr_jax.io import CorruptFileError, atomic_write_json, read_json
from sphyr_jax.problem.loadcase import LoadCase, index_load_case, stack_load_cases
from sphyr_jax.sharding import batch_call
from sphyr_jax.topopt import polish as polish_mod
from sphyr_jax.topopt import simp, yardstick

BUDGET_SLACK = 1e-9  # cells; a candidate may spend vf * nel + slack
HOPELESS = 10.0  # rounded designs this many times worse than the best are not polished
CACHE_VERSION = 2
OPTIMA = ("reference", "strong")  # the yardsticks, default first


@dataclasses.dataclass(frozen=True)
class OptimumOptions:
    """Static settings of the reference optimum.

    Attributes:
        simp: SIMP settings (filter radius, move limit, tolerance, iterations).
        penal_schedule: penalties of the cold runs and the continuation chain.
        penal: penalty every candidate is scored at.
        polish_starts: rounded designs polished per sample (best first).
        polish_passes: bound on passes per polished design.
        tabu_passes: passes without a new best the final tabu search may take
            (0: no tabu search).
        tabu_tenure: passes a moved cell stays tabu.
        extra_chain_radius: filter radius of a second continuation chain that
            starts from the cold p = schedule[0] run (None: no second chain);
            1.0 switches the filter off, which breaks symmetries the filtered
            runs keep and often leads to other 0/1 basins.
        pool: slots of the SIMP run pool.
        segment: SIMP iterations per pool step.
        num_devices: devices the batches are split over (None: all local).
    """

    simp: simp.SimpOptions = simp.DEFAULT_OPTIONS
    penal_schedule: tuple[float, ...] = (1.0, 2.0, 3.0)
    penal: float = 3.0
    polish_starts: int = 3
    polish_passes: int = polish_mod.DEFAULT_MAX_PASSES
    tabu_passes: int = 12
    tabu_tenure: int = polish_mod.DEFAULT_TENURE
    extra_chain_radius: float | None = 1.0
    pool: int = 128
    segment: int = 25
    num_devices: int | None = None

    def key(self) -> dict:
        s = self.simp
        return {
            "yardstick": "strong",
            "version": CACHE_VERSION,
            "filter_radius": s.filter_radius,
            "move_limit": s.move_limit,
            "tol": s.tol,
            "max_iterations": s.max_iterations,
            "solver": s.solver.kind,
            "penal_schedule": list(self.penal_schedule),
            "penal": self.penal,
            "polish_starts": self.polish_starts,
            "polish_passes": self.polish_passes,
            "tabu_passes": self.tabu_passes,
            "tabu_tenure": self.tabu_tenure,
            "extra_chain_radius": self.extra_chain_radius,
        }


DEFAULT_OPTIONS = OptimumOptions()


def optimum_options(optimum="reference", num_devices: int | None = None):
    """Settings of a yardstick by name (``"reference"`` or ``"strong"``).

    An :class:`OptimumOptions` or :class:`~sphyr_jax.topopt.yardstick.ReferenceOptions`
    is returned as it is (``num_devices`` then ignored).

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(optimum, (OptimumOptions, yardstick.ReferenceOptions)):
        return optimum
    if optimum == "reference":
        return dataclasses.replace(yardstick.DEFAULT_REFERENCE, num_devices=num_devices)
    if optimum == "strong":
        return dataclasses.replace(DEFAULT_OPTIONS, num_devices=num_devices)
    raise ValueError(f"unknown optimum {optimum!r}: use one of {', '.join(OPTIMA)}")


def grid_options(options, ndim: int):
    """The yardstick settings used on grids of ``ndim`` axes.

    On voxel grids both yardsticks are the reference recipe with the voxel
    settings (:data:`sphyr_jax.topopt.yardstick.VOXEL_REFERENCE`): the strong search's
    polish and tabu moves need a factorisation to update, which 3D solves do
    not keep.
    """
    if ndim == 2:
        return options
    if isinstance(options, OptimumOptions):
        return dataclasses.replace(yardstick.VOXEL_REFERENCE, num_devices=options.num_devices)
    return yardstick.grid_options(options, ndim)


def optimum_name(options) -> str:
    """``"reference"`` or ``"strong"``: the yardstick a settings object selects."""
    return "reference" if isinstance(options, yardstick.ReferenceOptions) else "strong"


class OptimumResult(eqx.Module):
    """Reference optima of a batch of samples (NumPy arrays, batch-first).

    Attributes:
        densities: (B, nely, nelx) the optimal design.
        compliance: (B,) its compliance at p = 3.
        volume_fraction: (B,) its volume fraction.
        iterations: (B,) SIMP iterations spent on the sample (all runs).
        converged: (B,) every SIMP run of the sample converged.
    """

    densities: np.ndarray
    compliance: np.ndarray
    volume_fraction: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray


# ----------------------------------------------------------------------------
# Rounding.


def binarize(densities, design_mask, pinned, target_solid, ndim: int = 2):
    """Budget-preserving 0/1 rounding of design cells (pure JAX, batched).

    The ``floor(target_solid)`` densest design cells become solid (ties broken
    by cell order), every other design cell empty, every other cell keeps its
    pinned value; rounding is downwards, so a design never overspends.

    Args:
        densities: (..., *cells).
        design_mask: (..., *cells) bool.
        pinned: (..., *cells) values off the design mask.
        target_solid: (...) material (in cells) available to the design cells.
        ndim: number of grid axes (2, or 3 for voxels).
    """
    densities = jnp.asarray(densities)
    batch = jnp.broadcast_shapes(densities.shape, jnp.shape(design_mask), jnp.shape(pinned))
    densities = jnp.broadcast_to(densities, batch)
    lead = batch[: len(batch) - ndim]
    flat = densities.reshape(lead + (-1,))
    mask = jnp.broadcast_to(jnp.asarray(design_mask), batch).reshape(flat.shape)
    pinned = jnp.broadcast_to(jnp.asarray(pinned), batch)
    # Stable order: density descending, then cell index; non-design cells last.
    key = jnp.where(mask, -flat, jnp.inf)
    order = jnp.argsort(key, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    count = jnp.broadcast_to(jnp.floor(jnp.asarray(target_solid) + 1e-9), lead)
    solid = mask & (rank < count[..., None])
    out = jnp.where(mask, solid.astype(flat.dtype),
                    pinned.reshape(flat.shape))
    return out.reshape(batch)


def _free_budget(load_case: LoadCase):
    return simp.budget_split(jnp.asarray(load_case.design_mask), jnp.asarray(load_case.pinned),
                             jnp.asarray(load_case.volume_fraction))[1]


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
        _, free_budget = simp.budget_split(mask, pinned, case_np["volume_fraction"][i])
        start = float(free_budget) / max(int(mask.sum()), 1)
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
# The reference optimum.


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


def reference_optimum_batch(load_case: LoadCase, seeds=None,
                            options: OptimumOptions = DEFAULT_OPTIONS,
                            progress=None) -> OptimumResult:
    """Reference optima of many samples (different loads, masks and budgets).

    Args:
        load_case: batched load cases (leading axis B); ``volume_fraction`` is
            each sample's budget and ``pinned`` its dataset answer.
        seeds: (B, nely, nelx) seed designs (default: the dataset answers,
            ``load_case.pinned``); each is a candidate and starts a SIMP run.
        options: static settings.
        progress: optional callable(stage, done, total).

    Returns:
        An :class:`OptimumResult` (NumPy arrays).  Voxel load cases get the
        voxel yardstick (see :func:`grid_options`).
    """
    fea.require_x64()
    if load_case.ndim != 2:
        return optimum_batch(load_case, seeds, options, progress)
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
    free_budget = np.asarray(_free_budget(case_np))
    rounded = np.asarray(_binarize(continuous, mask[:, None], pinned[:, None],
                                   free_budget[:, None]))
    candidates = np.concatenate([continuous, rounded], axis=1)  # (B, 2K, ...)
    scores = np.asarray(_score(case_np, candidates.transpose(1, 0, 2, 3),
                               options.penal, solver)).T  # (B, 2K)
    budget = case_np.volume_fraction * nel + BUDGET_SLACK
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
    res = polish_mod.polish(
        jax.tree.map(lambda a: a[owner], case_np), np.stack(starts), options.polish_passes,
        solver, num_devices=options.num_devices, tabu=tabu, tenure=options.tabu_tenure,
    )
    best_x, best_c = best_x.copy(), best_c.copy()
    for j, i in enumerate(owner):
        x, c = res.densities[j], float(res.compliance[j])
        if c < best_c[i] and x.sum() <= budget[i]:
            best_x[i], best_c[i] = x, c
    return best_x, best_c


def optimum_batch(load_case: LoadCase, seeds=None, optimum="reference",
                  progress=None) -> OptimumResult:
    """Optima of many samples with either yardstick.

    Args:
        load_case: batched load cases (leading axis B).
        seeds: optional (B, nely, nelx) seed designs (default: the answers).
        optimum: ``"reference"`` (the published recipe, default), ``"strong"``
            or a settings object of either.
        progress: optional callable(stage, done, total).

    Returns:
        An :class:`OptimumResult` (NumPy arrays).
    """
    options = grid_options(optimum_options(optimum), load_case.ndim)
    if isinstance(options, yardstick.ReferenceOptions):
        return yardstick.reference_optimum_batch(load_case, seeds, options, progress)[0]
    return reference_optimum_batch(load_case, seeds, options, progress)


def reference_optimum(load_case: LoadCase, seed=None,
                      options: OptimumOptions = DEFAULT_OPTIONS) -> OptimumResult:
    """Reference optimum of one sample (see :func:`reference_optimum_batch`).

    Returns:
        An :class:`OptimumResult` of scalars / a single design.
    """
    batch = stack_load_cases([load_case])
    seeds = None if seed is None else np.asarray(seed)[None]
    res = reference_optimum_batch(batch, seeds, options)
    return jax.tree.map(lambda a: a[0], res)


# ----------------------------------------------------------------------------
# Cache.


def optimum_key(load_case: LoadCase, seed=None, options=None) -> str:
    """Content hash of everything an optimum depends on (one sample), the
    yardstick included (``options.key()`` names it; default: ``reference``)."""
    options = optimum_options("reference" if options is None else options)
    h = hashlib.sha256()
    h.update(json.dumps(options.key(), sort_keys=True).encode())
    h.update(repr(load_case.shape).encode())
    for name in ("load_mask", "support_mask", "design_mask"):
        h.update(np.asarray(getattr(load_case, name), bool).tobytes())
    h.update(np.round(np.asarray(load_case.pinned, np.float64), 9).tobytes())
    h.update(np.round(np.asarray(load_case.gravity, np.float64), 12).tobytes())
    h.update(np.round(np.asarray(load_case.volume_fraction, np.float64), 12).tobytes())
    if seed is not None:
        h.update(np.round(np.asarray(seed, np.float64), 9).tobytes())
    return h.hexdigest()


class OptimumCache:
    """Optima keyed by :func:`optimum_key`, in memory and optionally on disk.

    One cache serves one yardstick: ``optimum`` (``"reference"``, the default,
    or ``"strong"``) or explicit ``options`` of either (they win); the keys
    include the yardstick, so both can share a directory.  With a directory
    every optimum is also stored as ``<key>.json`` (written atomically), so
    re-runs and other processes reuse it.  An unreadable cache file is reported
    in ``corrupt`` and left exactly as found (never deleted or overwritten);
    its optimum is recomputed and kept in memory.
    """

    def __init__(self, directory: str | os.PathLike | None = None, options=None,
                 max_batch: int = 64, optimum: str = "reference",
                 num_devices: int | None = None):
        self.options = optimum_options(optimum if options is None else options, num_devices)
        self.optimum = optimum_name(self.options)
        self.max_batch = max(1, int(max_batch))  # samples optimised per batch (memory)
        self.directory = pathlib.Path(directory) if directory else None
        self._memory: dict[str, dict] = {}
        self.hits = 0
        self.misses = 0
        self.computed = 0
        self.corrupt: list[str] = []
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def _load(self, key: str) -> dict | None:
        if key in self._memory:
            return self._memory[key]
        if self.directory is None:
            return None
        path = self.directory / f"{key}.json"
        if not path.exists():
            return None
        try:
            entry = read_json(path)
            entry = {
                "densities": np.asarray(entry["densities"], np.float64),
                "compliance": float("inf") if entry["compliance"] is None
                else float(entry["compliance"]),
                "iterations": int(entry["iterations"]),
                "converged": bool(entry["converged"]),
            }
        except (CorruptFileError, KeyError, TypeError, ValueError):
            self.corrupt.append(str(path))
            return None
        self._memory[key] = entry
        return entry

    def put(self, case: LoadCase, seed, result: OptimumResult) -> None:
        """Store the optimum ``result`` (one sample) of ``case`` and ``seed``."""
        self._store(optimum_key(case, seed, grid_options(self.options, case.ndim)),
                    _entry(result))

    def _store(self, key: str, entry: dict) -> dict:
        self._memory[key] = entry
        path = None if self.directory is None else self.directory / f"{key}.json"
        if path is not None and str(path) not in self.corrupt:  # corrupt files stay as found
            c = entry["compliance"]
            atomic_write_json(path, {
                "densities": entry["densities"].tolist(),
                "compliance": c if np.isfinite(c) else None,
                "iterations": entry["iterations"],
                "converged": entry["converged"],
            })
        return entry

    def get_many(self, cases: Sequence[LoadCase], seeds=None, progress=None) -> OptimumResult:
        """Optima of many samples; computes the missing ones in one batch."""
        keys = [optimum_key(c, None if seeds is None else seeds[i],
                            grid_options(self.options, c.ndim)) for i, c in enumerate(cases)]
        entries: dict[str, dict] = {}
        missing: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in entries or key in missing:
                self.hits += 1
                continue
            found = self._load(key)
            if found is None:
                missing[key] = i
                self.misses += 1
            else:
                entries[key] = found
                self.hits += 1
        pending = list(missing.items())
        # Even batches of at most max_batch samples (bounds memory: ~3 GB peak
        # at 50 full-mask samples on CPU).
        step = max(1, math.ceil(len(pending) / max(1, math.ceil(len(pending) / self.max_batch))))
        for lo in range(0, len(pending), step):
            part = pending[lo: lo + step]
            idx = [i for _, i in part]
            batch = stack_load_cases([cases[i] for i in idx])
            sd = None if seeds is None else np.stack([np.asarray(seeds[i]) for i in idx])
            res = optimum_batch(batch, sd, self.options, progress)
            self.computed += len(idx)
            if progress is not None:
                progress("optima", lo + len(part), len(pending))
            for j, (key, _) in enumerate(part):
                entries[key] = self._store(key, _entry(jax.tree.map(lambda a, j=j: a[j], res)))
        got = [entries[k] for k in keys]
        return OptimumResult(
            densities=np.stack([e["densities"] for e in got]),
            compliance=np.array([e["compliance"] for e in got]),
            volume_fraction=np.array([e["densities"].mean() for e in got]),
            iterations=np.array([e["iterations"] for e in got]),
            converged=np.array([e["converged"] for e in got]),
        )

    def get(self, case: LoadCase, seed=None) -> OptimumResult:
        res = self.get_many([case], None if seed is None else [seed])
        return jax.tree.map(lambda a: a[0], res)


def _entry(result: OptimumResult) -> dict:
    """A cache entry from the optimum of one sample."""
    return {
        "densities": np.asarray(result.densities, np.float64),
        "compliance": float(result.compliance),
        "iterations": int(result.iterations),
        "converged": bool(result.converged),
    }


def unstack(load_case: LoadCase) -> list[LoadCase]:
    """Split a batched load case into a list."""
    return [index_load_case(load_case, i) for i in range(load_case.load_mask.shape[0])]
