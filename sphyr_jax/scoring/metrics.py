"""Structural metrics of completed grids: simulate, re-optimise, compare.

A completion is scored physically: the load case comes from the ground-truth
grid (a completion cannot move loads or supports), the completion is solved
with finite elements, and its compliance is compared with the reference
optimum of the masked region at the dataset answer's material budget
(:mod:`sphyr_jax.topopt.optimum`).  Field names and meanings follow the reference
implementation; see :class:`StructuralMetrics`.

:func:`score_batch` scores many completions at once: analyses are batched per
grid shape; each distinct sample (answer, mask, direction) is read, its answer
analysed and its optimum looked up once per call however many completions
share it, a completion repeated for the same sample (common in a GRPO group)
is read and scored once, identical designs of a sample are analysed once, and
missing optima
are computed in one batch (or read from an
:class:`~sphyr_jax.topopt.optimum.OptimumCache`, or from the optimum a
record stores with its key, :attr:`ScoreItem.optimum`).  The cost of a call
is bounded by its distinct samples (one answer analysis and at most one
optimisation each) and its distinct designs (one finite-element solve each).

The yardstick (``optimum=``): ``"reference"`` (default) reproduces the
published figures; ``"strong"`` searches harder and is stricter (its optima
are never less stiff, so its scores are never higher; by how much is measured
in ``benchmarks/yardstick.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from sphyr_jax.fem import fea
from sphyr_jax.fem.solvers import result_name
from sphyr_jax.problem.grids import (
    GridReport,
    InvalidProblemError,
    densities_from_grid,
    extract_grid,
    fenced_grid,
    grid_key,
    grid_ndim,
    plain_grid,
    token_densities,
)
from sphyr_jax.problem.loadcase import (
    DEFAULT_GRAVITY,
    DEFAULT_GRAVITY_3D,
    LoadCase,
    load_case_from_grid,
    stack_load_cases,
    with_budget,
)
from sphyr_jax.progress import renamed
from sphyr_jax.runtime import bounded_cache
from sphyr_jax.scoring.static import StaticMetrics, static_metrics_batch
from sphyr_jax.sharding import batch_call, bucket_size, device_count
from sphyr_jax.topopt.optimum import OptimumCache, cache_for, stored_optimum
from sphyr_jax.topopt.options import Yardstick

STRUCTURAL_METRIC_KEYS = (
    "topology_score",
    "structural_efficiency",
    "material_efficiency",
    "compliance_efficiency_vs_ground_truth",
    "load_carrying",
    "volume_ratio",
)


@dataclasses.dataclass
class StructuralMetrics:
    """Physics-based scores of one completion.

    Ratios are in [0, 1] and higher is better (``structural_efficiency_raw``
    is unclipped); compliances are raw and lower is better.
    ``solver_result`` names how the completion's solve ended
    (:data:`sphyr_jax.fem.solvers.RESULTS`: ``"successful"``,
    ``"max_iterations_reached"``, ``"nonfinite_input"``, ``"no_load_path"``,
    ``"breakdown"``); None when nothing was solved (not physically valid).
    """

    physically_valid: bool = False
    load_carrying: bool = False
    compliance: float = math.inf
    ground_truth_compliance: float = math.inf
    optimal_compliance: float = math.inf
    own_budget_optimal_compliance: float | None = None
    topology_score: float = 0.0
    structural_efficiency: float = 0.0
    structural_efficiency_raw: float = 0.0
    design_efficiency: float | None = None
    material_efficiency: float = 0.0
    compliance_efficiency_vs_ground_truth: float = 0.0
    volume_fraction: float = 0.0
    ground_truth_volume_fraction: float = 0.0
    volume_ratio: float = 0.0
    max_displacement: float = 0.0
    unfilled_cells: int = 0
    unparsable_cells: int = 0
    invalid_reason: str | None = None
    solver_result: str | None = None

    def as_dict(self) -> dict:
        """JSON-ready fields; non-finite numbers become None."""
        out = _field_values(self)
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        return out


def _field_values(metrics) -> dict:
    """A metrics dataclass's fields in order (a shallow copy: the values are scalars)."""
    values = vars(metrics)
    if len(values) == len(metrics.__dataclass_fields__):  # set in field order by __init__
        return dict(values)
    return {name: getattr(metrics, name) for name in metrics.__dataclass_fields__}


@dataclasses.dataclass
class ScoreItem:
    """One completion to score.

    Attributes:
        completion: raw model output or a token grid.
        ground_truth: the dataset answer (text or tokens).
        input_grid: the masked input grid (text, tokens, or a prompt containing
            it); None: every non-L/S cell is a design cell.
        gravity_dir: load direction as a (row, col) step, or a (layer, row,
            col) step for voxel samples (the 2D default means down there too);
            None means the default direction (down).
        optimum: the sample's stored optimum, a record's ``optimum`` field
            (:func:`~sphyr_jax.topopt.optimum.stored_optimum`), or None.  It
            is used only when its key is the sample's key under the scorer's
            yardstick (then nothing is optimised for the sample); a stale one
            (an edited answer, another yardstick or recipe) is ignored.
    """

    completion: object
    ground_truth: object
    input_grid: object = None
    gravity_dir: tuple | None = DEFAULT_GRAVITY
    optimum: dict | None = None


METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(StructuralMetrics))
"""Every field scoring adds to a record (``StructuralMetrics.as_dict``)."""


@dataclasses.dataclass
class CompletionMetrics(StructuralMetrics, StaticMetrics):
    """Every published metric of one completion: the static (grid-only) fields
    of :class:`~sphyr_jax.scoring.static.StaticMetrics` followed by the
    physical ones of :class:`StructuralMetrics` (what ``static=True`` returns)."""


ALL_METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(CompletionMetrics))
"""Every field scoring with ``static=True`` adds to a record, static ones first."""


def _clipped(reference: float, actual: float) -> float:
    if not math.isfinite(actual) or actual <= 0.0 or not math.isfinite(reference):
        return 0.0
    return float(min(max(reference / actual, 0.0), 1.0))


def _analyze_fn(load_case, densities, solid=None):
    return fea.analyze(load_case, densities, solid_compliance=solid)


def analyze_batch(load_case: LoadCase, densities, *, num_devices: int | None = None,
                  solid_compliance=None):
    """:func:`sphyr_jax.fem.fea.analyze` of a batch, split over devices (NumPy out).

    The batch is padded to its bucket here, in NumPy, and the padding cut off
    the NumPy results (slicing the devices' sharded outputs one by one costs
    more than the analysis of a thousand designs).  ``solid_compliance`` (B,),
    when known, spares the all-solid solves.
    """
    densities = np.asarray(densities, np.float64)
    nb = densities.shape[0]
    ndev = max(1, min(device_count(num_devices), nb))
    take = np.arange(bucket_size(nb, ndev)) % nb  # padding repeats real entries
    args = [jax.tree.map(lambda a: np.asarray(a)[take], load_case), densities[take]]
    if solid_compliance is not None:
        args.append(np.asarray(solid_compliance, np.float64)[take])
    res = batch_call(_analyze_fn, *args, num_devices=ndev)
    return jax.tree.map(lambda a: np.asarray(a)[:nb], res)


def _analyze_group(stacked: LoadCase, answers, designs, num_devices):
    """Analyses of one shape group's answers and designs, in one batched call.

    Every distinct design of a sample (identical ones are analysed once), each
    sample's answer and its all-solid grid are rows of one call of one
    program (whatever the mix, so a new mix never compiles again); the solid
    rows give the samples' solid compliances, and with them the designs'
    ``load_carrying``.

    Args:
        stacked: the group's distinct samples' load cases, batch-first (S, ...).
        answers: S dataset answers (densities).
        designs: ``(sample, densities)`` per completion.

    Returns:
        ``(answers', designs')``: :class:`~sphyr_jax.fem.fea.Analysis` of NumPy
        arrays, (S,) and (len(designs),).
    """
    rows: dict = {}
    owners, grids = [], []

    def row(sample, rho):
        key = (sample, rho.tobytes())
        if key not in rows:
            rows[key] = len(grids)
            owners.append(sample)
            grids.append(rho)
        return rows[key]

    of_designs = np.array([row(k, rho) for k, rho in designs], dtype=int)
    of_answers = np.array([row(k, rho) for k, rho in enumerate(answers)], dtype=int)
    of_solid = np.array([row(k, np.ones_like(rho)) for k, rho in enumerate(answers)], dtype=int)
    owners = np.array(owners)
    # The solid compliance is not known yet: +inf stands in, and load_carrying
    # is recomputed below from the solid rows.
    res = analyze_batch(jax.tree.map(lambda a: np.asarray(a)[owners], stacked), np.stack(grids),
                        num_devices=num_devices, solid_compliance=np.full(len(grids), np.inf))
    solid = res.compliance[of_solid][owners]
    res = dataclasses.replace(res, solid_compliance=solid,
                              load_carrying=fea.load_carrying(res.compliance, solid))
    return (jax.tree.map(lambda a: a[of_answers], res),
            jax.tree.map(lambda a: a[of_designs], res))


@dataclasses.dataclass(frozen=True)
class _Sample:
    """What scoring needs of one sample (shared by all its completions)."""

    case: LoadCase
    gt_rho: np.ndarray
    ndim: int
    structural: np.ndarray  # L or S cells (solid in every design)
    shape: tuple


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """One completion ready to analyse: its sample's place and its densities."""

    sample: int  # position of the item's sample in the call's distinct samples
    out_rho: np.ndarray
    report: GridReport


@dataclasses.dataclass(frozen=True)
class _Problem:
    """How a call reads one (answer, input, direction): shared by every item that has it.

    Attributes:
        sample: position in the call's distinct samples, or why it cannot be scored.
        ndim: the answer's dimension.
        direction: the direction the static metrics read (the physics' one).
        answer, masked: the answer and input of the first item that has it
            (the static metrics read them once).
    """

    sample: int | str
    ndim: int
    direction: object
    answer: object = None
    masked: object = None


@dataclasses.dataclass(frozen=True)
class _SampleReading:
    """A (answer, input, direction) read: its sample, or why it cannot be scored."""

    sample: _Sample | str
    ndim: int
    direction: object


@dataclasses.dataclass
class _Reading:
    """The items of one call, read.

    Attributes:
        samples: the call's distinct samples.
        problems: per item, its sample's reading.
        prepared: per item, its completion's arrays or why it cannot be scored.
        first: per item, the first item with the same sample and completion
            (itself for the first): only those are scored, the rest copied.
        stored: per sample, the first stored optimum its items carry (or None).
    """

    samples: list[_Sample]
    problems: list[_Problem]
    prepared: list[_Prepared | str]
    first: list[int]
    stored: list


def _fits(grid, shape) -> bool:
    """Whether nested token lists have exactly the given shape."""
    if not isinstance(grid, (list, tuple)) or len(grid) != shape[0]:
        return False
    if len(shape) == 2:  # rows of tokens: one pass over the row lengths
        return all(isinstance(row, (list, tuple)) for row in grid) and set(
            map(len, grid)) == {shape[1]}
    if len(shape) == 1:
        return True
    return all(_fits(g, shape[1:]) for g in grid)


DEFAULT_MAX_CELLS = 16_384
"""Cells per sample above which a record is reported invalid ("too large") instead
of scored: 128x128 in 2D, about 25^3 in 3D.  The published sets are 10x10,
20x20 and 10x10x10; pass ``max_cells`` to raise it knowingly."""


def _answer(ground_truth):
    """(the answer as read, its dimension): clean text becomes token rows (read fast,
    the same rows as the general reader's), voxel text (layers separated by blank
    lines) stays text with dimension 3."""
    if not isinstance(ground_truth, str):
        return ground_truth, grid_ndim(ground_truth)
    rows = plain_grid(ground_truth)
    if rows is not None:
        return rows, 2
    layers = extract_grid(ground_truth, ndim=3)
    return ground_truth, 3 if layers is not None and len(layers) > 1 else 2


def _plain_input(input_grid):
    """A clean text input as token rows (read fast); anything else as it is."""
    if isinstance(input_grid, str):
        rows = plain_grid(input_grid)
        if rows is not None:
            return rows
    return input_grid


def _gravity_for(gravity_dir, ndim: int):
    """The record's direction checked against the grid's dimension, or a reason string.

    A missing direction is the default (down); a direction with the wrong number
    of components, or components that are not finite numbers, is never
    reinterpreted: the record is invalid, with a reason.
    """
    if gravity_dir is None:
        return None
    try:
        g = np.asarray(gravity_dir, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return f"gravity_dir {gravity_dir!r} is not a list of numbers"
    if g.size == 2 and ndim == 3 and tuple(g) == DEFAULT_GRAVITY:
        return None  # the 2D default means down on voxels too
    if g.size != ndim:
        return (f"gravity_dir {gravity_dir!r} has {g.size} components but the grid is "
                f"{ndim}D (expected {ndim})")
    if not np.all(np.isfinite(g)) or not np.any(g):
        return f"gravity_dir {gravity_dir!r} must be finite and non-zero"
    return tuple(float(v) for v in g)


def _static_direction(gravity_dir, gravity, ndim: int):
    """The direction the static metrics read: the physics' (down for none, in the
    answer's dimension), or the unusable one as given (the record is invalid there too)."""
    if isinstance(gravity, str):
        return gravity_dir
    if gravity is None:
        return DEFAULT_GRAVITY_3D if ndim == 3 else None
    return gravity


def _read_problem(item: ScoreItem, max_cells: int | None) -> _SampleReading:
    """Read an item's answer, input and direction (a pure function of them)."""
    answer, ndim = _answer(item.ground_truth)
    gravity = _gravity_for(item.gravity_dir, ndim)
    direction = _static_direction(item.gravity_dir, gravity, ndim)
    if isinstance(gravity, str):
        return _SampleReading(gravity, ndim, direction)
    try:
        case = load_case_from_grid(answer, _plain_input(item.input_grid), gravity, ndim=ndim)
    except (InvalidProblemError, TypeError, IndexError, ValueError) as exc:
        return _SampleReading(f"ground truth unusable: {exc}", ndim, direction)
    cells = int(np.prod(case.shape))
    if max_cells is not None and cells > max_cells:
        return _SampleReading(f"too large: {cells} cells > max_cells={max_cells}", ndim,
                              direction)
    structural = np.asarray(case.load_mask | case.support_mask)
    gt_rho = np.asarray(case.pinned).copy()
    gt_rho[structural] = 1.0
    structural.setflags(write=False)  # shared by later calls (:data:`MAX_CACHED_SAMPLES`)
    gt_rho.setflags(write=False)
    return _SampleReading(_Sample(case=case, gt_rho=gt_rho, ndim=ndim, structural=structural,
                                  shape=tuple(case.shape)), ndim, direction)


MAX_CACHED_SAMPLES = 1024
"""Samples whose reading (load case, answer densities) is kept between calls, least
recently used dropped first: a sample scored again in a later call is not read again
(the registered cache ``sphyr_jax.scoring.metrics._remembered_reading``:
:func:`sphyr_jax.runtime.set_cache_limit` changes its bound, :func:`sphyr_jax.clear_caches`
empties it)."""


class _Keyed:
    """A score item under its content key: equal and hashed by the key alone, and the item
    released once read (the cache keeps the key, not the completion)."""

    __slots__ = ("key", "item")

    def __init__(self, key, item):
        self.key, self.item = key, item

    def __eq__(self, other):
        return isinstance(other, _Keyed) and self.key == other.key

    def __hash__(self):
        return hash(self.key)


@bounded_cache(maxsize=MAX_CACHED_SAMPLES)
def _remembered_reading(keyed: _Keyed, max_cells: int | None) -> _SampleReading:
    reading = _read_problem(keyed.item, max_cells)
    keyed.item = None
    return reading


def _sample_reading(key, item: ScoreItem, max_cells: int | None) -> _SampleReading:
    """:func:`_read_problem`, remembered by the item's content key (None: not remembered)."""
    if key is None:
        return _read_problem(item, max_cells)
    return _remembered_reading(_Keyed(key, item), max_cells)


def _prepare(item: ScoreItem, problem: _Problem, samples: list) -> _Prepared | str:
    """The completion's densities, or the reason it cannot be scored."""
    if isinstance(problem.sample, str):
        return problem.sample
    sample = samples[problem.sample]
    grid = None
    if sample.ndim == 2 and isinstance(item.completion, str):
        # a clean grid, bare or in a closing code fence, read fast (the same rows)
        grid = plain_grid(item.completion) or fenced_grid(item.completion)
    if grid is None:
        grid = extract_grid(item.completion, ndim=sample.ndim)
    if grid is None:
        return "no grid found in the completion"
    shape = sample.shape
    if not _fits(grid, shape):
        return f"completion does not have the answer's shape {'x'.join(map(str, shape))}"
    if sample.ndim == 2:  # rows as read: stripped tokens
        out_rho, report = token_densities(grid)
    else:
        out_rho, report = densities_from_grid(grid, ndim=sample.ndim)
    out_rho[sample.structural] = 1.0
    return _Prepared(sample=problem.sample, out_rho=out_rho, report=report)


def _read_problems(items: Sequence[ScoreItem], max_cells: int | None,
                   samples: list) -> list[_Problem]:
    """Every item's problem; each distinct (answer, input, direction) read once per call
    (and kept between calls, :data:`MAX_CACHED_SAMPLES`); usable samples join ``samples``."""
    seen: dict = {}
    problems = []
    for item in items:
        try:
            key = (grid_key(item.ground_truth), grid_key(item.input_grid),
                   grid_key(item.gravity_dir))
        except (TypeError, ValueError):
            key = None  # unhashable inputs: read this sample on its own
        problem = seen.get(key) if key is not None else None
        if problem is None:
            reading = _sample_reading(key, item, max_cells)
            sample = reading.sample
            if not isinstance(sample, str):
                samples.append(sample)
                sample = len(samples) - 1
            problem = _Problem(sample, reading.ndim, reading.direction, item.ground_truth,
                               item.input_grid)
            if key is not None:
                seen[key] = problem
        problems.append(problem)
    return problems


def _read_items(items: Sequence[ScoreItem], max_cells: int | None) -> _Reading:
    """Every item read: its sample (shared) and its completion's densities (an item
    repeating an earlier one's sample and completion shares its reading)."""
    samples: list[_Sample] = []
    problems = _read_problems(items, max_cells, samples)
    stored: list = [None] * len(samples)
    seen: dict = {}
    first, prepared = [], []
    for i, (item, problem) in enumerate(zip(items, problems, strict=True)):
        k = problem.sample
        if not isinstance(k, str) and stored[k] is None and item.optimum is not None:
            stored[k] = item.optimum
        try:
            key = (id(problem), grid_key(item.completion))
        except (TypeError, ValueError):
            key = None  # an unhashable completion: read on its own
        j = i if key is None else seen.setdefault(key, i)
        first.append(j)
        prepared.append(prepared[j] if j != i else _prepare(item, problem, samples))
    return _Reading(samples, problems, prepared, first, stored)


def _structural_fields(c: float, c_gt: float, c_opt: float, vf: float, vf_gt: float,
                       carrying: bool, max_displacement: float, solver_result: str,
                       report: GridReport, c_own: float | None) -> dict:
    """Every :class:`StructuralMetrics` field of one analysed completion (a pure function).

    Args:
        c, c_gt, c_opt: compliance of the completion, the answer and the optimum.
        vf, vf_gt: volume fraction of the completion and the answer.
        carrying: whether the completion carries the load.
        max_displacement: its largest nodal displacement.
        solver_result: how its solve ended.
        report: its unfilled and unparsable cells.
        c_own: the optimum's compliance at the completion's own budget (None: not asked).
    """
    fields = {
        "physically_valid": True, "load_carrying": carrying, "compliance": c,
        "ground_truth_compliance": c_gt, "optimal_compliance": c_opt,
        "own_budget_optimal_compliance": c_own, "volume_fraction": vf,
        "ground_truth_volume_fraction": vf_gt, "volume_ratio": vf / vf_gt if vf_gt > 0 else 0.0,
        "max_displacement": max_displacement, "unfilled_cells": int(report.unfilled_cells),
        "unparsable_cells": int(report.unparsable_cells), "solver_result": solver_result,
    }
    if carrying:
        structural = _clipped(c_opt, c)
        material = min(1.0, vf_gt / vf) if vf > 0 else 0.0
        fields.update(
            structural_efficiency=structural,
            compliance_efficiency_vs_ground_truth=_clipped(c_gt, c),
            structural_efficiency_raw=c_opt / c if math.isfinite(c_opt) and c > 0 else 0.0,
            design_efficiency=None if c_own is None else _clipped(c_own, c),
            material_efficiency=material,
            topology_score=structural * material)
    return fields


def _group_fields(idx: list[int], reading: _Reading, cache: OptimumCache, own_budget: bool,
                  num_devices, progress) -> list[dict]:
    """The structural fields of one shape group's items (analyses and optima batched).

    Each distinct sample's answer is analysed, and its optimum looked up, once
    however many completions share it (the first stored optimum its items
    carry is offered to the cache, which uses it if its key matches).
    """
    prepared = [reading.prepared[i] for i in idx]
    local: dict[int, int] = {}
    for p in prepared:
        local.setdefault(p.sample, len(local))
    distinct = [reading.samples[s] for s in local]
    stored = [reading.stored[s] for s in local]
    owner = np.array([local[p.sample] for p in prepared])
    cases = [s.case for s in distinct]
    seeds = [s.gt_rho for s in distinct]
    if progress is not None:
        progress("analysis", 0, len(idx))
    gt, out = _analyze_group(stack_load_cases(cases), seeds,
                             [(local[p.sample], p.out_rho) for p in prepared], num_devices)
    if progress is not None:
        progress("analysis", len(idx), len(idx))
    optima = cache.get_many(cases, seeds, progress=progress, stored=stored)
    own = [None] * len(idx)
    if own_budget:
        own_cases = [with_budget(cases[k], v)
                     for k, v in zip(owner, out.volume_fraction, strict=True)]
        own = cache.get_many(own_cases, [seeds[k] for k in owner],
                             progress=renamed(progress, "optima", "own-budget optima")
                             ).compliance.tolist()
    return [
        _structural_fields(c, c_gt, c_opt, vf, vf_gt, carrying, disp, result_name(code),
                           p.report, c_own)
        for p, c, c_gt, c_opt, vf, vf_gt, carrying, disp, code, c_own in zip(
            prepared, out.compliance.tolist(), gt.compliance[owner].tolist(),
            np.asarray(optima.compliance)[owner].tolist(), out.volume_fraction.tolist(),
            gt.volume_fraction[owner].tolist(), out.load_carrying.tolist(),
            out.max_displacement.tolist(), out.result, own, strict=True)]


def score_batch(
    items: Sequence[ScoreItem],
    *,
    cache: OptimumCache | None = None,
    include_own_budget_reference: bool = False,
    num_devices: int | None = None,
    progress=None,
    optimum: Yardstick | None = None,
    max_cells: int | None = DEFAULT_MAX_CELLS,
    static: bool = False,
) -> list[StructuralMetrics]:
    """Score many completions; never raises for a bad completion.

    Args:
        items: completions with their ground truths, inputs, gravity and
            (optionally) stored optima.
        cache: optimum cache (default: a fresh in-memory one for ``optimum``);
            optima are computed once per distinct sample and budget.
        include_own_budget_reference: also optimise at each completion's own
            volume fraction (``design_efficiency``).
        num_devices: devices batches are split over (None: all local).
        progress: optional callable(stage, done, total) for long work.
        optimum: the yardstick, ``"reference"`` (the published optimum, the
            default) or ``"strong"`` (a harder search: stricter scores); None:
            the cache's, else ``"reference"``.
        max_cells: samples with more cells are invalid ("too large") rather
            than optimised for minutes (None: no limit).
        static: also compute the twelve static (grid-only) metrics
            (:mod:`sphyr_jax.scoring.static`), with the same input grid and
            load direction as the physics.

    Returns:
        One :class:`StructuralMetrics` per item, in order (with ``static=True``
        a :class:`CompletionMetrics`: both sets of fields); an item that cannot
        be scored is ``physically_valid`` false with ``invalid_reason`` set.

    Raises:
        ValueError: ``optimum`` is unknown or differs from the cache's.
    """
    fea.require_x64()
    cache = cache_for(cache, optimum, num_devices)
    reading = _read_items(items, max_cells)
    unique = [i for i, j in enumerate(reading.first) if i == j]
    fields: dict[int, dict] = {}
    by_shape: dict[tuple, list[int]] = {}
    for i in unique:
        p = reading.prepared[i]
        if isinstance(p, str):
            fields[i] = {"invalid_reason": p}
        else:
            by_shape.setdefault(reading.samples[p.sample].shape, []).append(i)
    for idx in by_shape.values():
        fields.update(zip(idx, _group_fields(idx, reading, cache, include_own_budget_reference,
                                             num_devices, progress), strict=True))
    if static:
        statics = _static_of([items[i] for i in unique], [reading.problems[i] for i in unique])
        scored = {i: CompletionMetrics(**_field_values(s), **fields[i])
                  for i, s in zip(unique, statics, strict=True)}
    else:
        scored = {i: StructuralMetrics(**fields[i]) for i in unique}
    return [scored[i] if i == j else copy.copy(scored[j])  # fields are scalars
            for i, j in enumerate(reading.first)]


def _static_of(items: Sequence[ScoreItem], problems: Sequence[_Problem]) -> list[StaticMetrics]:
    # the answer and input objects of each problem's first item: read once by the static
    # metrics however many items share them
    return static_metrics_batch([item.completion for item in items],
                                [p.answer for p in problems], [p.masked for p in problems],
                                [p.direction for p in problems])


def static_of(items: Sequence[ScoreItem]) -> list[StaticMetrics]:
    """The static metrics of score items, read with the physics' input grid and
    load direction (a voxel answer's missing direction is down in 3D)."""
    return _static_of(items, _read_problems(items, None, []))


def get_structural_metrics(
    output_grid,
    gt_grid,
    input_grid=None,
    gravity_dir=DEFAULT_GRAVITY,
    *,
    include_own_budget_reference: bool = False,
    cache: OptimumCache | None = None,
    optimum: Yardstick | None = None,
    static: bool = False,
) -> StructuralMetrics:
    """Score one completion (see :func:`score_batch`).

    Args:
        output_grid: the completion, as raw text or a token grid.
        gt_grid: the dataset answer; its L/S cells define the load case.
        input_grid: the masked input grid (its V cells are the design region).
        gravity_dir: load direction (row, col); None: down.
        include_own_budget_reference: also compute ``design_efficiency``.
        cache: optional optimum cache shared between calls.
        optimum: ``"reference"`` (default: the published yardstick) or
            ``"strong"`` (stricter); see :func:`score_batch`.
        static: also compute the twelve static metrics.

    Returns:
        :class:`StructuralMetrics` (:class:`CompletionMetrics` with
        ``static=True``); a wrong-shaped or unreadable completion, or an
        unusable ground truth, gets the defaults.
    """
    item = ScoreItem(output_grid, gt_grid, input_grid, gravity_dir)
    return score_batch([item], cache=cache,
                       include_own_budget_reference=include_own_budget_reference,
                       optimum=optimum, static=static)[0]


def stored_optima(items: Sequence[ScoreItem], *, cache: OptimumCache | None = None,
                  optimum: Yardstick | None = None,
                  max_cells: int | None = DEFAULT_MAX_CELLS) -> list[dict | None]:
    """The ``optimum`` field each item's record may carry (its sample's optimum and key).

    Optima are looked up in (or computed into) ``cache``, once per distinct
    sample; a record carrying the field is later scored without optimising
    (:attr:`ScoreItem.optimum`).  Completions are not read.

    Args:
        items: the samples (answers, inputs, directions; completions ignored).
        cache: optimum cache (default: a fresh in-memory one for ``optimum``).
        optimum: the yardstick (None: the cache's, else ``"reference"``).
        max_cells: samples with more cells get None (see :func:`score_batch`).

    Returns:
        One field per item (:func:`~sphyr_jax.topopt.optimum.stored_optimum`),
        None for an item whose sample cannot be scored.
    """
    cache = cache_for(cache, optimum)
    samples: list[_Sample] = []
    problems = _read_problems(items, max_cells, samples)
    by_shape: dict[tuple, list[int]] = {}
    for k, sample in enumerate(samples):
        by_shape.setdefault(sample.shape, []).append(k)
    fields: list[dict | None] = [None] * len(samples)
    for ks in by_shape.values():
        cases = [samples[k].case for k in ks]
        seeds = [samples[k].gt_rho for k in ks]
        found = cache.get_many(cases, seeds)
        for j, k in enumerate(ks):
            fields[k] = stored_optimum(cases[j], seeds[j], jax.tree.map(lambda a, j=j: a[j], found),
                                       cache.options)
    return [None if isinstance(p.sample, str) else fields[p.sample] for p in problems]
