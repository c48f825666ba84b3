"""SPhyR-v2 samples: boundary conditions far apart, on any edge, in eight load directions.

The published SPhyR (v1) sweeps loads and supports one cell at a time along
fixed edges, so most samples have a near-twin a cell away with the same optimal
structure.  v2 changes the sampling, not the task (same 16 subjects, tokens and
record schema), and works at any grid size ``n`` (10 and 20 are the published
sets, ``v2`` and ``v2-20``).  One sample:

* **Loads.** One group of 1-3 contiguous cells on a random edge.
* **Supports.** One group of 2-5 contiguous cells on another edge; with
  probability 0.35 a second group of 2-4 cells on any edge but the load edge
  (it may overlap the first).  Support cells that coincide with load cells (a
  shared corner) are dropped; a draw left with fewer than 2 support cells is
  drawn again.
* **Direction.** Uniform over the eight (row, col) steps of
  :data:`LOAD_DIRECTIONS` (the four axes and the four diagonals); the scorer
  normalises it, so the load is a unit resultant spread evenly over the load
  cells' nodes whatever the direction.  Every record stores it as
  ``gravity_dir``.
* **Answers.** Budget $V = \\mathrm{round}(0.3\\,n^2)$ cells, load and support
  cells included (the optimiser's volume fraction is $V / n^2$).  The optimum
  is the stiffest (at p = 3) of the SIMP runs of :class:`V2Options` over every
  non-L/S cell (default: the continuation chain p = 1 -> 2 -> 3 from a
  uniform start, filter radius 1.2, stopping at a largest design change of
  1e-2 or 200 iterations per stage): the design variables of the run's last
  stage, scored as they are (unfiltered, as the scorer scores a completion;
  they are crisper and stiffer than the filtered field).  The *easy* answer
  is that optimum binarised to exactly $V$ solid cells (its densest design
  cells), then improved by single material swaps that keep the count, with
  the reference yardstick's moves (the least strained solid cells against
  the empty cells beside the most strained ones, until a pass finds no
  improving swap); the *hard* answer is the optimum's densities rounded to
  one decimal.
  A problem whose optimum is degenerate (compliance not finite or above
  :data:`DEGENERATE_COMPLIANCE`), or either of whose answers is not load
  carrying, is dropped.
* **Separation.** A candidate is rejected unless its load/support layout
  differs in at least :data:`MIN_LAYOUT_DISTANCE` cells, and its easy answer
  (0/1 material, L/S solid) in at least :data:`MIN_STRUCTURE_DISTANCE` cells,
  from every sample already accepted.  Candidates are solved in batches: the
  layout is checked when a candidate is drawn, against the accepted samples
  and the candidates already waiting in the batch (so a batch never solves
  two candidates too close to each other); the structure is checked after the
  batch is solved, in draw order.  A candidate refused because of a waiting
  rival stays refused if the rival is dropped later (rare: the kept samples
  satisfy every separation either way).

Masks never cover load or support cells ("free" cells are all the others):
``full`` masks every free cell; ``<k>_random_cell`` masks
$\\max(1, \\mathrm{round}(k\\,n^2/100))$ distinct free cells; ``<k>_random_row``
and ``<k>_random_column`` mask every free cell of $\\max(1,
\\mathrm{round}(k\\,n/10))$ distinct lines drawn among the lines holding free
cells (counts capped at what exists; Python's round, halves to even).  Each
subject draws its masks from its own ``numpy`` generator seeded with
``[seed, crc32(subject)]`` (:func:`sphyr_jax.data.datasets.subject_rng`), over
the samples in order, so adding a subject or changing another never changes a
subject's masks.

Files: the 16 ``<subject>.jsonl`` files (records ``index``, ``input_grid``,
``ground_truth``, ``gravity_dir``), written together or not at all.  The
candidate stream is one ``numpy.random.default_rng(seed)``; the same seed gives
the same bytes on the same device setup (the optimiser's floating point can
differ on another device kind or device count).  These rules are
:class:`V2Rules` (drawing, screening, solving, judging, files), run by the
driver every generator shares (:func:`sphyr_jax.data.generation.generate`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import pathlib
from collections.abc import Sequence
from typing import Literal

import jax
import numpy as np

from sphyr_jax.data.convert import render_subject
from sphyr_jax.data.datasets import VARIANTS, list_subjects, subject_rng
from sphyr_jax.data.exclusion import MIN_LAYOUT_DISTANCE, MIN_STRUCTURE_DISTANCE
from sphyr_jax.data.generation import (
    Kept,
    Progress,
    RoundSize,
    SamplingRules,
    analyze_designs,
    candidate_load_case,
    candidate_tokens,
    check_num_samples,
    design_tokens,
    generate,
)
from sphyr_jax.fem import fea
from sphyr_jax.problem.grids import MASK
from sphyr_jax.problem.loadcase import LoadCase, stack_load_cases
from sphyr_jax.sharding import batch_call
from sphyr_jax.topopt import yardstick_polish
from sphyr_jax.topopt.budget import binarize
from sphyr_jax.topopt.options import ReferenceOptions
from sphyr_jax.topopt.simp import SimpOptions
from sphyr_jax.topopt.strong import Run, run_simp_batch

Edge = Literal["top", "bottom", "left", "right"]
EDGES = ("top", "bottom", "left", "right")
LOAD_DIRECTIONS = ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1))
V2_VOLUME_FRACTION = 0.3
LOAD_GROUP = (1, 3)  # cells, inclusive
SUPPORT_GROUP = (2, 5)
SECOND_SUPPORT_GROUP = (2, 4)
SECOND_SUPPORT_PROBABILITY = 0.35
MIN_SUPPORT_CELLS = 2
DEGENERATE_COMPLIANCE = 1e6
MIN_GRID_SIZE = 5  # a support group of 5 cells must fit on an edge
POLISH_CHUNK = 4  # swap passes per device call of the polish


@dataclasses.dataclass(frozen=True)
class V2Options:
    """Static settings of the v2 optimiser.

    Attributes:
        simp: SIMP settings of every run (filter, move limit, tolerance, bound).
        schedules: penalty schedules of the SIMP runs of each candidate; a
            schedule of several penalties is a continuation chain (each stage
            starts from the previous one's physical densities).
        polish_passes: bound on swaps of the easy answer's polish (0: none).
        source_limit: least strained solid cells offered per polish pass.
        target_limit: empty cells beside the most strained ones offered per pass.
    """

    simp: SimpOptions = SimpOptions(tol=1e-2, max_iterations=200)
    schedules: tuple[tuple[float, ...], ...] = ((1.0, 2.0, 3.0),)
    polish_passes: int = 50
    source_limit: int = 16
    target_limit: int = 24

    def polish_static(self) -> tuple:
        """The swap polish's settings as the yardstick's static tuple (p = 3 scores)."""
        ref = ReferenceOptions(polish_passes=self.polish_passes, source_limit=self.source_limit,
                               target_limit=self.target_limit)
        return ref.static()


DEFAULT_V2_OPTIONS = V2Options()
QUICK_V2_OPTIONS = V2Options(simp=SimpOptions(tol=2e-2, max_iterations=80), polish_passes=10)
"""Cheap settings for tests and previews."""
REJECTION_REASONS = ("supports", "budget", "layout", "degenerate", "structure")


@dataclasses.dataclass(frozen=True, eq=False)
class V2Candidate:
    """One drawn v2 problem (row 0 = top).

    Attributes:
        load_mask: (n, n) bool load cells.
        support_mask: (n, n) bool support cells (never on a load cell).
        gravity_dir: (row, col) load direction, one of :data:`LOAD_DIRECTIONS`.
        load_edge: edge of the load group (one of :data:`EDGES`).
        support_edges: edges of the support groups, in drawing order.
        support_groups: the drawn support groups as (row, col) cells, before
            cells shared with loads are dropped.
    """

    load_mask: np.ndarray
    support_mask: np.ndarray
    gravity_dir: tuple[int, int]
    load_edge: Edge
    support_edges: tuple[Edge, ...]
    support_groups: tuple[tuple[tuple[int, int], ...], ...] = ()

    @property
    def grid_size(self) -> int:
        return int(self.load_mask.shape[0])

    @property
    def solid_cells(self) -> int:
        """$\\mathrm{round}(0.3\\,n^2)$: solid cells of the easy answer, L/S included."""
        return solid_budget(self.grid_size)

    @property
    def volume_fraction(self) -> float:
        """The optimiser's budget: ``solid_cells / n^2``."""
        return self.solid_cells / self.load_mask.size

    def layout(self) -> np.ndarray:
        """(n, n) layout codes: 1 on load cells, 2 on support cells, 0 elsewhere."""
        return self.load_mask.astype(np.int8) + 2 * self.support_mask.astype(np.int8)


def solid_budget(grid_size: int, volume_fraction: float = V2_VOLUME_FRACTION) -> int:
    """Solid cells of an answer on an n x n grid: ``round(volume_fraction * n * n)``."""
    return int(round(volume_fraction * grid_size * grid_size))


def edge_cells(edge: Edge, n: int) -> list[tuple[int, int]]:
    """The (row, col) cells of one edge of an n x n grid, in increasing order."""
    if edge == "top":
        return [(0, c) for c in range(n)]
    if edge == "bottom":
        return [(n - 1, c) for c in range(n)]
    if edge == "left":
        return [(r, 0) for r in range(n)]
    if edge == "right":
        return [(r, n - 1) for r in range(n)]
    raise ValueError(f"unknown edge {edge!r}; edges are {EDGES}")


def _group(rng: np.random.Generator, edge: Edge, sizes: tuple[int, int], n: int):
    """A contiguous run of a random size in ``sizes`` at a random place on ``edge``."""
    size = int(rng.integers(sizes[0], sizes[1] + 1))
    start = int(rng.integers(0, n - size + 1))
    return edge_cells(edge, n)[start : start + size]


def draw_v2_candidate(rng: np.random.Generator, grid_size: int = 10) -> V2Candidate | None:
    """Draw one v2 problem; None when fewer than two support cells survive.

    Draw order (fixed, so a seed reproduces the stream): load edge, support
    edge, load group, support group, whether a second support group exists
    (and its edge and cells), load direction.

    Args:
        rng: the candidate stream (advanced in place).
        grid_size: n of the n x n grid (at least :data:`MIN_GRID_SIZE`).
    """
    n = int(grid_size)
    if n < MIN_GRID_SIZE:
        raise ValueError(f"v2 grids must be at least {MIN_GRID_SIZE} cells wide, got {n}")
    load_edge = EDGES[int(rng.integers(len(EDGES)))]
    others = [e for e in EDGES if e != load_edge]
    support_edges = [others[int(rng.integers(len(others)))]]
    loads = _group(rng, load_edge, LOAD_GROUP, n)
    groups = [_group(rng, support_edges[0], SUPPORT_GROUP, n)]
    if rng.random() < SECOND_SUPPORT_PROBABILITY:
        support_edges.append(others[int(rng.integers(len(others)))])
        groups.append(_group(rng, support_edges[1], SECOND_SUPPORT_GROUP, n))
    direction = LOAD_DIRECTIONS[int(rng.integers(len(LOAD_DIRECTIONS)))]
    return make_v2_candidate(n, loads, groups, direction, load_edge, tuple(support_edges))


def make_v2_candidate(n: int, load_cells, support_groups, gravity_dir, load_edge: Edge,
                      support_edges: tuple[Edge, ...]) -> V2Candidate | None:
    """A candidate from drawn groups: support cells on load cells dropped, None if < 2 remain.

    Args:
        n: grid size.
        load_cells: (row, col) cells of the load group.
        support_groups: one or two sequences of (row, col) support cells.
        gravity_dir: (row, col) load direction.
        load_edge: the edge the load group was drawn on.
        support_edges: the edges the support groups were drawn on.
    """
    load = np.zeros((n, n), bool)
    support = np.zeros((n, n), bool)
    for r, c in load_cells:
        load[r, c] = True
    for group in support_groups:
        for r, c in group:
            support[r, c] = True
    support &= ~load
    if int(support.sum()) < MIN_SUPPORT_CELLS:
        return None
    groups = tuple(tuple((int(r), int(c)) for r, c in g) for g in support_groups)
    return V2Candidate(load, support, tuple(int(v) for v in gravity_dir), load_edge,
                       tuple(support_edges), groups)


def layout_distance(a: V2Candidate, b: V2Candidate) -> int:
    """Cells whose load/support role differs between two candidates."""
    return int(np.count_nonzero(a.layout() != b.layout()))


# ----------------------------------------------------------------------------
# Optimisation.


@dataclasses.dataclass(frozen=True)
class V2Answers:
    """Answers of a batch of candidates (NumPy, batch-first).

    Attributes:
        optimum: (B, n, n) design densities of the stiffest SIMP run (L/S cells 1).
        optimum_compliance: (B,) its compliance at p = 3.
        easy: (B, n, n) 0/1 easy answers (L/S cells 1), ``solid_cells`` each.
        hard: (B, n, n) hard answers: the optimum rounded to one decimal.
        easy_compliance, hard_compliance: (B,) compliance of each answer.
        easy_carrying, hard_carrying: (B,) bool, whether each answer carries
            the load (:func:`sphyr_jax.fem.fea.analyze`).
        swaps: (B,) cells of material the polish moved (cells where the easy
            answer and the rounded optimum differ, halved).
    """

    optimum: np.ndarray
    optimum_compliance: np.ndarray
    easy: np.ndarray
    hard: np.ndarray
    easy_compliance: np.ndarray
    hard_compliance: np.ndarray
    easy_carrying: np.ndarray
    hard_carrying: np.ndarray
    swaps: np.ndarray

    def degenerate(self) -> np.ndarray:
        """(B,) bool: optimum not finite or above the bound, or an answer not carrying."""
        c = self.optimum_compliance
        return (~np.isfinite(c) | (c > DEGENERATE_COMPLIANCE)
                | ~self.easy_carrying | ~self.hard_carrying)


def round_one_decimal(densities) -> np.ndarray:
    """Densities rounded to one decimal (halves to even, like Python's ``round``)."""
    return np.round(np.asarray(densities, np.float64), 1) + 0.0  # + 0.0: no negative zeros


def _simp_runs(batch: LoadCase, schedules, options: SimpOptions, num_devices, progress):
    """Design densities (B, R, n, n) and their p = 3 compliance (B, R) at the end of each
    schedule (R = len(schedules)).

    The designs are the SIMP design variables on the design cells (L/S cells
    solid), scored as given, unfiltered, as the scorer scores any completion;
    a non-finite compliance reads inf.
    """
    nb = batch.batch_shape[0]
    runs: list[Run] = []
    finals: list[int] = []  # the last run of every schedule, sample by sample
    for i in range(nb):
        for schedule in schedules:
            parent: str | int = "cold"
            for penal in schedule:
                runs.append(Run(i, float(penal), parent))
                parent = len(runs) - 1
            finals.append(parent)
    sim = run_simp_batch(batch, runs, options=options, progress=progress,
                         num_devices=num_devices)
    owner = np.array([runs[r].sample for r in finals])
    cases = jax.tree.map(lambda a: np.asarray(a)[owner], batch)
    design = np.where(cases.design_mask, np.asarray(sim.design)[finals], cases.pinned)
    res = analyze_designs(cases, design, num_devices=num_devices)
    comp = np.asarray(res.compliance).reshape(nb, len(schedules))
    return (design.reshape((nb, len(schedules)) + batch.shape),
            np.where(np.isfinite(comp), comp, np.inf))


def _polish_fn(case, x, mask, *, static):
    return yardstick_polish.polish(case, x, mask, static=static)


def _polish(batch: LoadCase, designs, design_mask, options: V2Options, num_devices, report):
    """The swap polish of 0/1 designs, :data:`POLISH_CHUNK` passes per device call.

    A pass starts from an exact solve of the current design, so calls can be
    chained; a design a call left unchanged has no improving swap and leaves
    the batch, so a few long polishes do not keep the whole batch busy.
    """
    nb = len(designs)
    out = designs.reshape(nb, -1).copy()
    mask = design_mask.reshape(nb, -1)
    active = np.arange(nb)
    done_passes = 0
    while len(active) and done_passes < options.polish_passes:
        chunk = min(POLISH_CHUNK, options.polish_passes - done_passes)
        static = dataclasses.replace(options, polish_passes=chunk).polish_static()
        part = jax.tree.map(lambda a, idx=active: np.asarray(a)[idx], batch)
        moved = np.asarray(batch_call(_polish_fn, part, out[active], mask[active],
                                      static=static, num_devices=num_devices)[0])
        changed = np.any(moved != out[active], axis=1)
        out[active] = moved
        active = active[changed]  # an unchanged design has no improving swap left
        done_passes += chunk
        report("polish", nb - len(active), nb)
    report("polish", nb, nb)
    return out.reshape(designs.shape)


def optimise_v2(candidates: Sequence[V2Candidate], options: V2Options = DEFAULT_V2_OPTIONS,
                num_devices: int | None = None, progress=None) -> V2Answers:
    """Optimise a batch of candidates and derive their easy and hard answers.

    Every candidate gets the SIMP runs of ``options.schedules`` (all candidates
    share one slot pool, :func:`sphyr_jax.topopt.optimum.run_simp_batch`); its
    optimum is the design field (the SIMP design variables, unfiltered) of
    lowest p = 3 compliance.  The optimum is binarised
    to ``solid_cells`` cells (:func:`sphyr_jax.topopt.optimum.binarize`: its
    densest design cells) and polished by single material swaps with the
    reference yardstick's moves (:func:`sphyr_jax.topopt.yardstick_polish.polish`:
    the least strained solid cells against the empty cells beside the most
    strained ones, the first improving pair per pass, until a pass finds none
    or ``polish_passes``); the hard answer is the optimum rounded to one
    decimal.  Both answers are analysed in one batched call.

    Args:
        candidates: problems of one grid size.
        options: optimiser settings (:data:`QUICK_V2_OPTIONS` for a cheap run).
        num_devices: devices the batches are split over (None: all local).
        progress: optional callable(stage, done, total); stages ``"simp"``
            and ``"polish"``.

    Returns:
        :class:`V2Answers`.
    """
    fea.require_x64()
    if not candidates:
        raise ValueError("no candidates to optimise")
    report = progress or (lambda stage, done, total: None)
    batch = stack_load_cases([candidate_load_case(c) for c in candidates])
    nb = len(candidates)
    dens, comp = _simp_runs(batch, options.schedules, options.simp, num_devices,
                            lambda d, t: report("simp", d, t))
    best = np.argmin(comp, axis=1)  # the stiffest run (the first on ties)
    optimum, optimum_c = dens[np.arange(nb), best], comp[np.arange(nb), best]
    design = np.asarray(batch.design_mask)
    structural = np.asarray(batch.load_mask | batch.support_mask)
    free = np.array([c.solid_cells for c in candidates], np.float64) - structural.sum((-2, -1))
    rounded = np.asarray(binarize(optimum, design, np.asarray(batch.pinned), free))
    easy = _polish(batch, rounded, design, options, num_devices, report)
    swaps = np.sum(easy != rounded, axis=(-2, -1)) // 2
    hard = np.where(design, round_one_decimal(optimum), 1.0)
    both = jax.tree.map(lambda a: np.concatenate([a, a]), batch)
    res = analyze_designs(both, np.concatenate([easy, hard]), num_devices=num_devices)
    c = np.asarray(res.compliance)
    carrying = np.asarray(res.load_carrying, bool)
    return V2Answers(optimum=optimum, optimum_compliance=optimum_c, easy=easy, hard=hard,
                     easy_compliance=c[:nb], hard_compliance=c[nb:],
                     easy_carrying=carrying[:nb], hard_carrying=carrying[nb:], swaps=swaps)


# ----------------------------------------------------------------------------
# Answers and masks as tokens.


def hard_tokens(candidate: V2Candidate, hard) -> list[list[str]]:
    """The hard ground truth: one-decimal densities (``"0.0"`` .. ``"1.0"``), L/S tokens."""
    values = np.vectorize(lambda v: f"{v:.1f}", otypes=[object])(round_one_decimal(hard))
    return candidate_tokens(candidate, values)


def mask_count(variant: str, grid_size: int) -> int:
    """Cells (``*_random_cell``) or lines (rows, columns) a variant masks on an n x n grid.

    ``k_random_cell``: $\\max(1, \\mathrm{round}(k\\,n^2/100))$; ``k_random_row`` and
    ``k_random_column``: $\\max(1, \\mathrm{round}(k\\,n/10))$; ``full``: 0 (every
    free cell, no count).
    """
    if variant == "full":
        return 0
    k_text, _, kind = variant.partition("_random_")
    if not k_text.isdigit() or kind not in ("cell", "row", "column"):
        raise ValueError(f"unknown mask variant {variant!r}")
    k, n = int(k_text), int(grid_size)
    return max(1, round(k * n * n / 100) if kind == "cell" else round(k * n / 10))


def v2_mask(variant: str, free: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n, n) bool mask of one variant, drawn among the free (non-L/S) cells.

    Args:
        variant: one of :data:`sphyr_jax.data.datasets.VARIANTS`.
        free: (n, n) bool, the cells a mask may cover.
        rng: the subject's generator (advanced in place).
    """
    free = np.asarray(free, bool)
    if variant == "full":
        return free.copy()
    count = mask_count(variant, free.shape[0])
    kind = variant.partition("_random_")[2]
    mask = np.zeros_like(free)
    if kind == "cell":
        cells = np.flatnonzero(free)
        chosen = rng.choice(len(cells), size=min(count, len(cells)), replace=False)
        mask.reshape(-1)[cells[np.sort(chosen)]] = True
        return mask
    axis_free = free if kind == "row" else free.T
    lines = np.flatnonzero(axis_free.any(axis=1))
    chosen = np.sort(lines[rng.choice(len(lines), size=min(count, len(lines)), replace=False)])
    if kind == "row":
        mask[chosen] = free[chosen]
    else:
        mask[:, chosen] = free[:, chosen]
    return mask


def build_v2_subjects(samples: Sequence[tuple[V2Candidate, np.ndarray, np.ndarray]],
                      seed: int) -> dict[str, list[dict]]:
    """The 16 subjects of kept samples ``(candidate, easy, hard)``, in sample order.

    Returns:
        ``{subject: records}`` in :func:`sphyr_jax.data.datasets.list_subjects`
        order; records ``{"index", "input_grid", "ground_truth", "gravity_dir"}``.
    """
    truths = [(design_tokens(c, e), hard_tokens(c, h)) for c, e, h in samples]
    subjects: dict[str, list[dict]] = {}
    for variant in VARIANTS:
        for level, pick in (("easy", 0), ("hard", 1)):
            name = f"{variant}_{level}"
            rng = subject_rng(seed, name)
            records = []
            for index, ((cand, _, _), truth) in enumerate(zip(samples, truths, strict=True)):
                mask = v2_mask(variant, ~(cand.load_mask | cand.support_mask), rng)
                answer = truth[pick]
                masked = np.where(mask, MASK, np.asarray(answer, dtype=object)).tolist()
                records.append({"index": index, "input_grid": masked, "ground_truth": answer,
                                "gravity_dir": list(cand.gravity_dir)})
            subjects[name] = records
    return {name: subjects[name] for name in list_subjects()}


# ----------------------------------------------------------------------------
# Whole datasets.


def _batch_size(remaining: int, largest: int) -> int:
    """Candidates solved for ``remaining`` samples: 1.15x, a multiple of 8, at most ``largest``."""
    return min(largest, 8 * math.ceil(max(8, math.ceil(1.15 * remaining)) / 8))


@dataclasses.dataclass(frozen=True, eq=False)
class V2Answer:
    """The answers of one candidate (one row of :class:`V2Answers`).

    Attributes:
        easy: (n, n) 0/1 easy answer (L/S cells 1).
        hard: (n, n) hard answer, one-decimal densities.
        easy_compliance, hard_compliance, optimum_compliance: at p = 3.
        swaps: cells of material the polish moved.
        degenerate: see :meth:`V2Answers.degenerate`.
    """

    easy: np.ndarray
    hard: np.ndarray
    easy_compliance: float
    hard_compliance: float
    optimum_compliance: float
    swaps: int
    degenerate: bool

    @functools.cached_property
    def solid(self) -> np.ndarray:
        """(n, n) bool: the easy answer's solid cells (L/S included)."""
        return self.easy >= 0.5

    def info(self) -> dict:
        """The compliances and swaps, as the summary lists them."""
        return {"easy_compliance": self.easy_compliance, "hard_compliance": self.hard_compliance,
                "optimum_compliance": self.optimum_compliance, "swaps": self.swaps}


@dataclasses.dataclass(frozen=True)
class V2Rules(SamplingRules):
    """The SPhyR-v2 sampling rules (see the module docstring).

    Attributes:
        grid_size: n of the n x n grid (at least :data:`MIN_GRID_SIZE`).
        options: optimiser settings.
        num_devices: devices a batch is split over (None: all local).
        largest_batch: most candidates solved per batch.
        mask_seed: seed of the subjects' masks (the generation's own seed).
    """

    grid_size: int = 10
    options: V2Options = DEFAULT_V2_OPTIONS
    num_devices: int | None = None
    largest_batch: int = 256
    mask_seed: int = 0

    rejection_reasons = REJECTION_REASONS
    advice = "use a larger grid"

    def draw(self, rng: np.random.Generator) -> V2Candidate | str:
        candidate = draw_v2_candidate(rng, self.grid_size)
        return "supports" if candidate is None else candidate

    def screen(self, candidate: V2Candidate, kept: Sequence[Kept], waiting) -> str | None:
        if candidate.solid_cells - int((candidate.load_mask | candidate.support_mask).sum()) < 1:
            return "budget"
        others = itertools.chain((k.candidate for k in kept), waiting)
        if any(layout_distance(candidate, o) < MIN_LAYOUT_DISTANCE for o in others):
            return "layout"
        return None

    def round_size(self, remaining: int) -> RoundSize:
        return RoundSize(admitted=_batch_size(remaining, self.largest_batch))

    def solve(self, candidates: Sequence[V2Candidate], progress: Progress) -> list[V2Answer]:
        answers = optimise_v2(candidates, self.options, self.num_devices, progress)
        degenerate = answers.degenerate()
        return [V2Answer(answers.easy[j], answers.hard[j], float(answers.easy_compliance[j]),
                         float(answers.hard_compliance[j]),
                         float(answers.optimum_compliance[j]), int(answers.swaps[j]),
                         bool(degenerate[j]))
                for j in range(len(candidates))]

    def judge(self, candidate: V2Candidate, answer: V2Answer, kept: Sequence[Kept]
              ) -> str | None:
        if answer.degenerate:
            return "degenerate"
        if any(int(np.count_nonzero(answer.solid != k.answer.solid)) < MIN_STRUCTURE_DISTANCE
               for k in kept):
            return "structure"
        return None

    def files(self, output: pathlib.Path, kept: Sequence[Kept]) -> dict[pathlib.Path, str]:
        subjects = build_v2_subjects([(k.candidate, k.answer.easy, k.answer.hard)
                                      for k in kept], self.mask_seed)
        return {output / f"{name}.jsonl": render_subject(records, "jsonl")
                for name, records in subjects.items()}


def _sample_summary(index: int, kept: Kept) -> dict:
    c = kept.candidate
    return {"index": index, "gravity_dir": list(c.gravity_dir), "load_edge": c.load_edge,
            "support_edges": list(c.support_edges), "load_cells": int(c.load_mask.sum()),
            "support_cells": int(c.support_mask.sum()), **kept.answer.info()}


def generate_v2_dataset(output_dir, num_samples: int, *, seed: int = 0, grid_size: int = 10,
                        num_devices: int | None = None, progress: Progress | None = None,
                        options: V2Options = DEFAULT_V2_OPTIONS, batch_size: int | None = None,
                        max_attempts: int | None = None) -> dict:
    """Generate a SPhyR-v2 set and write its 16 subject files.

    Nothing is written until every sample is kept; then the 16
    ``<subject>.jsonl`` files replace any earlier ones together.

    Args:
        output_dir: target folder (created if missing).
        num_samples: samples to keep.
        seed: seed of the candidate stream and of the subjects' masks.
        grid_size: n of the n x n grid (10: ``v2``, 20: ``v2-20``).
        num_devices: devices the batches are split over (None: all local).
        progress: optional callable(stage, done, total); stages ``"simp"``,
            ``"polish"`` (per batch), ``"kept"`` and ``"write"``.
        options: optimiser settings (:data:`QUICK_V2_OPTIONS` for a cheap run).
        batch_size: most candidates solved per batch (default: 1.15 x the
            samples still missing, a multiple of 8, at most 256).
        max_attempts: bound on drawn candidates (default 50 x ``num_samples``
            + 100).

    Returns:
        Summary (the same fields for every generator version,
        :meth:`sphyr_jax.data.generation.Outcome.summary`): ``kept``,
        ``drawn``, ``solved``, ``unused`` (solved after the last sample was
        kept), ``rejected`` (by reason: ``supports`` redrawn, ``budget``,
        ``layout``, ``degenerate``, ``structure``), ``batches``, ``seconds``,
        ``seconds_per_solve``, ``device``, ``subjects`` and ``samples`` (per
        sample: ``index``, ``gravity_dir``, edges, cells, compliances, ``swaps``).

    Raises:
        GenerationError: if ``max_attempts`` draws do not give enough samples.
        ValueError: for bad arguments.
    """
    fea.require_x64()
    check_num_samples(num_samples)
    if isinstance(grid_size, bool) or not isinstance(grid_size, int) or grid_size < MIN_GRID_SIZE:
        raise ValueError(f"grid_size must be an integer >= {MIN_GRID_SIZE}, got {grid_size!r}")
    rules = V2Rules(grid_size=grid_size, options=options, num_devices=num_devices,
                    largest_batch=batch_size or 256, mask_seed=seed)
    outcome = generate(rules, output_dir, num_samples,
                       max_attempts=max_attempts or 50 * num_samples + 100, seed=seed,
                       progress=progress)
    return outcome.summary(
        output_dir, dataset_version="v2", seed=seed, grid_size=grid_size,
        samples=[_sample_summary(i, k) for i, k in enumerate(outcome.kept)])
