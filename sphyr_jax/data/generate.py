"""New SPhyR samples from the project's own optimiser.

A sample is drawn in a *canonical frame* like the published data: one run of
load cells on the top edge, one run of support cells on the bottom edge, random
run positions and lengths, and a material budget (volume fraction of the whole
grid, load and support cells included).  For another gravity direction the
canonical picture is turned by quarter turns (``np.rot90``) so that the load
still pushes towards the supports: ``"down"`` = (1, 0) keeps it, ``"right"`` =
(0, 1) puts the loads on the left edge and the supports on the right edge,
``"up"`` = (-1, 0) turns it upside down and ``"left"`` = (0, -1) puts the loads
on the right edge.

Candidates are optimised in batches with
:func:`sphyr_jax.topopt.strong.strong_optimum_batch` (design region = every
non-L/S cell), and only load-carrying, non-degenerate answers that differ from
every earlier one in at least ``min_difference`` cells, even after mirroring
or sliding it along the load edge, are kept.  These rules are
:class:`V1Rules`, run by the driver every generator shares
(:func:`sphyr_jax.data.generation.generate`).

Files: raw CSVs ``<n>_SPhyR_2D.csv`` in the reference layout, always in the
canonical frame (so static cells on ``y = 0`` are the supports), numbered from
0 with zero padding so name and number order agree; for datasets with a
non-default gravity a side file ``gravity.json`` maps each sample number to
its ``[row, col]`` direction, and the subject records are turned back into the
generation frame and carry ``gravity_dir``.  Masks are drawn in the canonical
frame (so ``full`` masks keep the load and support edges visible).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import tempfile
from collections.abc import Sequence
from typing import Literal

import numpy as np

from sphyr_jax.data.convert import (
    RAW_SUFFIX,
    Format,
    build_subjects,
    convert_raw_dir,
    list_raw_files,
    raw_file_number,
    read_raw_csv,
    write_subjects,
)
from sphyr_jax.data.datasets import list_subjects
from sphyr_jax.data.generation import (
    Kept,
    Progress,
    RoundSize,
    SamplingRules,
    analyze_designs,
    candidate_load_case,
    check_num_samples,
    design_tokens,
    generate,
)
from sphyr_jax.errors import UserInputError
from sphyr_jax.fem import fea
from sphyr_jax.io import atomic_write_json, atomic_write_text, read_json
from sphyr_jax.problem.grids import grid_to_text
from sphyr_jax.problem.loadcase import stack_load_cases
from sphyr_jax.problem.symmetry import AXIS_DIRECTIONS
from sphyr_jax.topopt.budget import binarize, free_budget
from sphyr_jax.topopt.options import StrongOptions
from sphyr_jax.topopt.simp import SimpOptions
from sphyr_jax.topopt.strong import strong_optimum_batch

GRAVITY_FILE = "gravity.json"
RAW_FOLDER = "raw"
Direction = Literal["down", "right", "up", "left"]
DIRECTIONS = {"down": (1, 0), "right": (0, 1), "up": (-1, 0), "left": (0, -1)}
VOLUME_FRACTION_RANGE = (0.2, 0.4)
MIN_DIFFERENCE = 3  # an answer this close (in cells) to an earlier one is a near-copy
SEED_NOISE = 0.1  # amplitude of the perturbation of the uniform seed design
DEFAULT_OPTIONS = StrongOptions()
QUICK_OPTIONS = StrongOptions(
    simp=SimpOptions(tol=1e-2, max_iterations=200), penal_schedule=(3.0,),
    polish_starts=0, tabu_passes=0, extra_chain_radius=None, pool=8,
)  # a cheap optimiser for tests and previews: one SIMP run, rounding, no polish


@dataclasses.dataclass(frozen=True)
class BoundarySpec:
    """How load and support runs are drawn on the canonical edges.

    Attributes:
        load_groups: (min, max) number of load runs on the top edge.
        support_groups: (min, max) number of support runs on the bottom edge.
        load_length: (min, max) run length as a fraction of the edge.
        support_length: (min, max) run length as a fraction of the edge.
    """

    load_groups: tuple[int, int] = (1, 1)
    support_groups: tuple[int, int] = (1, 1)
    load_length: tuple[float, float] = (0.3, 0.6)
    support_length: tuple[float, float] = (0.3, 0.5)


DEFAULT_BOUNDARY = BoundarySpec()


@dataclasses.dataclass(frozen=True, eq=False)
class Candidate:
    """One drawn problem, in the generation frame (row 0 = top).

    Attributes:
        gravity: direction name (a key of :data:`DIRECTIONS`).
        load_mask: (n, n) bool load cells.
        support_mask: (n, n) bool support cells.
        volume_fraction: material budget as a fraction of the whole grid.
        seed: (n, n) start design of the seeded SIMP run (L/S cells 1, design
            cells the uniform budget level plus a small random perturbation).
    """

    gravity: Direction
    load_mask: np.ndarray
    support_mask: np.ndarray
    volume_fraction: float
    seed: np.ndarray

    @property
    def gravity_dir(self) -> tuple[int, int]:
        return DIRECTIONS[self.gravity]

    @property
    def free_budget(self) -> float:
        """Material (in cells) left for the design cells."""
        structural = self.load_mask | self.support_mask
        return self.volume_fraction * structural.size - float(structural.sum())


def gravity_name(direction) -> str:
    """Name of an axis direction given as a name or a (row, col) pair.

    Raises:
        ValueError: for anything but down/up/left/right.
    """
    if isinstance(direction, str):
        name = direction.strip().lower()
        if name in DIRECTIONS:
            return name
    else:
        try:
            pair = tuple(float(v) for v in direction)
        except (TypeError, ValueError):
            pair = None
        for name, vec in DIRECTIONS.items():
            if pair == tuple(float(v) for v in vec):
                return name
    raise UserInputError(f"gravity direction must be one of {sorted(DIRECTIONS)}, "
                         f"got {direction!r}")


def quarter_turns(direction) -> int:
    """``np.rot90`` turns taking the canonical frame (gravity down) to ``direction``."""
    return AXIS_DIRECTIONS.index(DIRECTIONS[gravity_name(direction)])


def _runs(rng: np.random.Generator, n: int, groups: tuple[int, int],
          length: tuple[float, float]) -> np.ndarray:
    """A row of ``n`` cells holding separated runs of random lengths and positions."""
    k = int(rng.integers(groups[0], groups[1] + 1))
    lo = max(1, round(length[0] * n))
    hi = max(lo, round(length[1] * n))
    lengths = rng.integers(lo, hi + 1, size=k)
    while lengths.sum() + k - 1 > n:  # shrink until the runs and their gaps fit
        lengths[np.argmax(lengths)] -= 1
        if lengths.min() < 1:
            raise ValueError(f"{k} runs do not fit on an edge of {n} cells")
    slack = n - int(lengths.sum()) - (k - 1)
    gaps = rng.multinomial(slack, np.full(k + 1, 1.0 / (k + 1)))
    row = np.zeros(n, bool)
    pos = int(gaps[0])
    for i, run in enumerate(lengths):
        row[pos : pos + run] = True
        pos += int(run) + 1 + int(gaps[i + 1])
    return row


def draw_boundary_conditions(rng: np.random.Generator, grid_size: int = 10,
                             gravity: str = "down",
                             spec: BoundarySpec = DEFAULT_BOUNDARY):
    """Load and support runs on the grid edges for one gravity direction.

    Args:
        rng: seeded generator (advanced in place).
        grid_size: n of the n x n grid (at least 3).
        gravity: direction name or (row, col) pair.
        spec: run counts and lengths.

    Returns:
        (load_mask, support_mask), (n, n) bool arrays in the generation frame.
    """
    if grid_size < 3:
        raise ValueError(f"grid_size must be at least 3, got {grid_size}")
    load = np.zeros((grid_size, grid_size), bool)
    support = np.zeros_like(load)
    load[0] = _runs(rng, grid_size, spec.load_groups, spec.load_length)
    support[-1] = _runs(rng, grid_size, spec.support_groups, spec.support_length)
    k = quarter_turns(gravity)
    return np.rot90(load, k).copy(), np.rot90(support, k).copy()


def draw_candidate(rng: np.random.Generator, grid_size: int = 10,
                   gravity_dirs: Sequence = ("down",), volume_fraction: float | None = None,
                   spec: BoundarySpec = DEFAULT_BOUNDARY,
                   volume_fraction_range: tuple[float, float] = VOLUME_FRACTION_RANGE
                   ) -> Candidate:
    """Draw one problem: direction, boundary conditions, budget and seed design.

    A drawn budget (``volume_fraction=None``) is uniform in the range, rounded
    to 0.01 and raised where needed so the design cells get at least
    ``grid_size`` cells of material plus the horizontal offset between the
    load and support runs (room for a connecting path); a given budget is used
    as it is.
    """
    gravity = gravity_name(gravity_dirs[int(rng.integers(len(gravity_dirs)))])
    load, support = draw_boundary_conditions(rng, grid_size, gravity, spec)
    nel = grid_size * grid_size
    structural = load | support
    if volume_fraction is None:
        vf = round(float(rng.uniform(*volume_fraction_range)), 2)
        k = quarter_turns(gravity)  # columns of the runs in the canonical frame
        cols_l = np.flatnonzero(np.rot90(load, -k)[0])
        cols_s = np.flatnonzero(np.rot90(support, -k)[-1])
        offset = max(0, cols_s.min() - cols_l.max(), cols_l.min() - cols_s.max())
        need = structural.sum() + grid_size + offset  # room for a path from load to support
        vf = max(vf, math.ceil(100 * need / nel) / 100)
    else:
        vf = float(volume_fraction)
    free = vf * nel - structural.sum()
    level = min(max(free, 0.0) / max(nel - structural.sum(), 1), 1.0)
    noise = rng.uniform(-SEED_NOISE, SEED_NOISE, size=load.shape)
    seed = np.where(structural, 1.0, np.clip(level + noise, 1e-3, 1.0))
    return Candidate(gravity, load, support, vf, seed)


@dataclasses.dataclass(frozen=True)
class Optimised:
    """Answers of a batch of candidates (NumPy, batch-first).

    Attributes:
        designs: (B, n, n) 0/1 densities (L/S cells 1).
        compliance: (B,) compliance of each design at p = 3.
        load_carrying: (B,) bool.
    """

    designs: np.ndarray
    compliance: np.ndarray
    load_carrying: np.ndarray


def optimise_candidates(candidates: Sequence[Candidate],
                        options: StrongOptions = DEFAULT_OPTIONS,
                        num_devices: int | None = None, progress=None) -> Optimised:
    """Optimise candidates in one batch with the strong search.

    Args:
        candidates: problems of one grid size.
        options: optimiser settings (:data:`QUICK_OPTIONS` for a cheap run).
        num_devices: devices the batch is split over (None: the options' choice).
        progress: optional callable(stage, done, total) forwarded to the optimiser.

    Returns:
        :class:`Optimised` answers; a design that is not 0/1 on its design
        cells is rounded within budget before it is analysed.
    """
    fea.require_x64()
    if num_devices is not None:
        options = dataclasses.replace(options, num_devices=num_devices)
    batch = stack_load_cases([candidate_load_case(c) for c in candidates])
    seeds = np.stack([c.seed for c in candidates])
    result = strong_optimum_batch(batch, seeds=seeds, options=options, progress=progress)
    designs = np.asarray(result.densities, np.float64)
    free = np.asarray(free_budget(batch.design_mask, batch.pinned, batch.volume_fraction,
                                  ndim=2)[0])
    binary = np.all((designs == 0.0) | (designs == 1.0), axis=(-2, -1))
    if not binary.all():
        rounded = np.asarray(binarize(designs, batch.design_mask, batch.pinned, free))
        designs = np.where(binary[:, None, None], designs, rounded)
    analysis = analyze_designs(batch, designs, num_devices=options.num_devices)
    return Optimised(designs, np.asarray(analysis.compliance),
                     np.asarray(analysis.load_carrying, bool))


def _slide(grid: np.ndarray, shift: int) -> np.ndarray | None:
    """Columns moved by ``shift`` (None if a non-``"0"`` cell would leave the grid)."""
    n = grid.shape[1]
    gone = grid[:, n - shift:] if shift > 0 else grid[:, :-shift]
    if shift and np.any(gone != "0"):
        return None
    return np.roll(grid, shift, axis=1)


def is_near_copy(grid, other, gravity: str = "down", other_gravity: str = "down",
                 min_difference: int = MIN_DIFFERENCE) -> bool:
    """Whether two token grids of one direction are (nearly) the same sample.

    Both are turned into the canonical frame; ``grid`` is a near-copy when it
    differs in fewer than ``min_difference`` cells from ``other``, its mirror
    image, or either slid along the load edge (through empty columns only).
    Grids of different directions are never near-copies.
    """
    if gravity_name(gravity) != gravity_name(other_gravity):
        return False
    k = quarter_turns(gravity)
    a = np.rot90(np.asarray(grid, dtype=object), -k)
    b = np.rot90(np.asarray(other, dtype=object), -k)
    if a.shape != b.shape:
        return False
    for base in (b, b[:, ::-1]):
        for shift in range(1 - a.shape[1], a.shape[1]):
            moved = _slide(base, shift)
            if moved is not None and int(np.sum(a != moved)) < min_difference:
                return True
    return False


# ----------------------------------------------------------------------------
# Raw CSVs.


def render_raw_csv(density, load_mask, support_mask) -> str:
    """Text of a raw CSV in the reference layout (canonical frame).

    Lines ``index,x,y,z,density,is_static,[neighbours]`` with ``index = y *
    nelx + x``, cell centres ``x + 0.5``/``y + 0.5`` (``y = 0`` is the bottom,
    i.e. the last printed row), ``z = 0.0`` and, for every solid cell (density
    >= 0.5 or static), its solid 8-neighbours in ascending order (empty for
    other cells).

    Args:
        density: (nely, nelx) densities in printed orientation (row 0 = top).
        load_mask: (nely, nelx) bool; never on the last printed row.
        support_mask: (nely, nelx) bool; only on the last printed row.

    Raises:
        ValueError: for boundary conditions the CSV cannot express.
    """
    density = np.asarray(density, np.float64)
    load = np.asarray(load_mask, bool)
    support = np.asarray(support_mask, bool)
    nely, nelx = density.shape
    if support[:-1].any() or load[-1].any() or (load & support).any():
        raise ValueError("raw CSVs need supports on the bottom row only and loads elsewhere")
    static = load | support
    solid = static | (density >= 0.5)
    lines = []
    for y in range(nely):
        r = nely - 1 - y
        for x in range(nelx):
            near = []
            if solid[r, x]:
                near = [yy * nelx + xx for yy in range(max(y - 1, 0), min(y + 2, nely))
                        for xx in range(max(x - 1, 0), min(x + 2, nelx))
                        if (yy, xx) != (y, x) and solid[nely - 1 - yy, xx]]
            value = 1.0 if static[r, x] else float(density[r, x])
            lines.append(f"{y * nelx + x},{x + 0.5},{y + 0.5},0.0,{value!r},{static[r, x]},"
                         f"[{', '.join(map(str, near))}]")
    return "\n".join(lines) + "\n"


def write_raw_csv(path, density, load_mask, support_mask) -> None:
    """Write :func:`render_raw_csv` atomically to ``path``."""
    atomic_write_text(path, render_raw_csv(density, load_mask, support_mask))


def raw_name(number: int, count: int) -> str:
    """``<n>_SPhyR_2D.csv`` with ``n`` zero-padded to the width of ``count - 1``."""
    return f"{number:0{len(str(max(count - 1, 0)))}d}{RAW_SUFFIX}"


def read_gravity_file(raw_dir) -> dict[int, list[int]] | None:
    """``{sample number: [row, col]}`` from ``gravity.json``, or None if absent."""
    path = pathlib.Path(raw_dir) / GRAVITY_FILE
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object mapping sample numbers to directions")
    out = {}
    for key, value in data.items():
        if not str(key).isdigit():
            raise ValueError(f"{path}: sample number {key!r} is not a number")
        out[int(key)] = list(DIRECTIONS[gravity_name(value)])
    return out


def write_subjects_from_raw(raw_dir, output_dir, seed: int = 42, fmt: Format = "jsonl"):
    """The 16 subject files of a raw folder, honouring an optional ``gravity.json``.

    Without the side file this is :func:`sphyr_jax.data.convert.convert_raw_dir`
    in number order.  With it, masks are drawn in the canonical frame and each
    record's grids are turned into the sample's frame and get ``gravity_dir``.

    Returns:
        ``{subject: number of records}``.
    """
    gravity = read_gravity_file(raw_dir)
    if gravity is None:
        return convert_raw_dir(raw_dir, output_dir, seed=seed, fmt=fmt, order="number")
    samples = [read_raw_csv(p) for p in list_raw_files(raw_dir, "number")]
    missing = [s.index for s in samples if s.index not in gravity]
    if missing:
        raise ValueError(f"{GRAVITY_FILE} has no direction for samples {missing}")
    samples = [dataclasses.replace(s, gravity_dir=tuple(gravity[s.index])) for s in samples]
    subjects = build_subjects(samples, seed)
    for records in subjects.values():
        for record in records:
            k = quarter_turns(samples[record["index"]].gravity_dir)
            for key in ("input_grid", "ground_truth"):
                record[key] = np.rot90(np.array(record[key], dtype=object), k).tolist()
    return write_subjects(subjects, output_dir, fmt)


# ----------------------------------------------------------------------------
# Whole datasets.


def _default_batch(num_samples: int) -> int:
    return min(256, 8 * math.ceil(max(8, math.ceil(1.25 * num_samples)) / 8))


def _check_raw_folder(raw_dir: pathlib.Path, planned: set[str]) -> None:
    if not raw_dir.is_dir():
        return
    foreign = sorted(p.name for p in raw_dir.iterdir() if p.is_file()
                     and (raw_file_number(p) is not None or p.name == GRAVITY_FILE
                          or p.name.endswith(RAW_SUFFIX)) and p.name not in planned)
    if foreign:
        raise UserInputError(f"{raw_dir} holds files of another dataset "
                             f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); "
                             "remove them or use another output folder")


@dataclasses.dataclass(frozen=True, eq=False)
class Answer:
    """The optimiser's answer to one candidate.

    Attributes:
        design: (n, n) 0/1 densities (L/S cells 1).
        compliance: its compliance at p = 3.
        load_carrying: whether it carries the load.
    """

    design: np.ndarray
    compliance: float
    load_carrying: bool
    candidate: Candidate

    @functools.cached_property
    def grid(self) -> np.ndarray:
        """(n, n) tokens of the answer: ``"1"``/``"0"``, L/S."""
        return np.array(design_tokens(self.candidate, self.design), dtype=object)


@dataclasses.dataclass(frozen=True)
class V1Rules(SamplingRules):
    """The v1-style sampling rules (see the module docstring).

    Attributes:
        grid_size: n of the n x n grid.
        gravity_dirs: direction names drawn from per sample.
        volume_fraction: fixed budget of every sample (None: drawn).
        boundary: how load and support runs are drawn.
        volume_fraction_range: range of drawn budgets.
        options: optimiser settings.
        num_devices: devices a batch is split over (None: the options' choice).
        batch_size: candidates drawn per round (one batched solve).
        min_difference: near-copy threshold in cells (:func:`is_near_copy`).
        mask_seed: seed of the subject masks.
    """

    grid_size: int = 10
    gravity_dirs: tuple[Direction, ...] = ("down",)
    volume_fraction: float | None = None
    boundary: BoundarySpec = DEFAULT_BOUNDARY
    volume_fraction_range: tuple[float, float] = VOLUME_FRACTION_RANGE
    options: StrongOptions = DEFAULT_OPTIONS
    num_devices: int | None = None
    batch_size: int = 8
    min_difference: int = MIN_DIFFERENCE
    mask_seed: int = 42

    rejection_reasons = ("budget", "not_load_carrying", "degenerate", "duplicate")
    advice = "relax the volume fraction"

    @property
    def default_gravity(self) -> bool:
        """Whether every sample is loaded downwards (no ``gravity.json`` then)."""
        return set(self.gravity_dirs) == {"down"}

    def draw(self, rng: np.random.Generator) -> Candidate:
        return draw_candidate(rng, self.grid_size, self.gravity_dirs, self.volume_fraction,
                              self.boundary, self.volume_fraction_range)

    def screen(self, candidate: Candidate, kept, waiting) -> str | None:
        return "budget" if candidate.free_budget < 1.0 else None

    def round_size(self, remaining: int) -> RoundSize:
        return RoundSize(draws=self.batch_size)

    def solve(self, candidates: Sequence[Candidate], progress: Progress) -> list[Answer]:
        result = optimise_candidates(candidates, self.options, self.num_devices,
                                     progress=progress)
        return [Answer(result.designs[j], float(result.compliance[j]),
                       bool(result.load_carrying[j]), c) for j, c in enumerate(candidates)]

    def judge(self, candidate: Candidate, answer: Answer, kept: Sequence[Kept]) -> str | None:
        if not answer.load_carrying:
            return "not_load_carrying"
        region = ~(candidate.load_mask | candidate.support_mask)
        solid = int(np.sum(answer.design[region] >= 0.5))
        if solid == 0 or solid == int(region.sum()):
            return "degenerate"
        if any(is_near_copy(answer.grid, k.answer.grid, candidate.gravity, k.candidate.gravity,
                            self.min_difference) for k in kept):
            return "duplicate"
        return None

    def check_output(self, output: pathlib.Path, num_samples: int) -> None:
        planned = {raw_name(i, num_samples) for i in range(num_samples)}
        _check_raw_folder(output / RAW_FOLDER,
                          planned if self.default_gravity else planned | {GRAVITY_FILE})

    def files(self, output: pathlib.Path, kept: Sequence[Kept]) -> dict[pathlib.Path, str]:
        """Raw CSVs (+ ``gravity.json``) and the 16 subjects, staged in a temporary
        folder through the converter, as ``raw/`` and ``<subject>.jsonl`` texts."""
        count = len(kept)
        texts: dict[pathlib.Path, str] = {}
        with tempfile.TemporaryDirectory(prefix="sphyr_generate_") as tmp:
            stage_raw = pathlib.Path(tmp) / RAW_FOLDER
            stage_raw.mkdir()
            gravity = {}
            for i, k in enumerate(kept):
                cand = k.candidate
                turns = quarter_turns(cand.gravity)
                write_raw_csv(stage_raw / raw_name(i, count), np.rot90(k.answer.design, -turns),
                              np.rot90(cand.load_mask, -turns),
                              np.rot90(cand.support_mask, -turns))
                gravity[str(i)] = list(cand.gravity_dir)
            if not self.default_gravity:
                atomic_write_json(stage_raw / GRAVITY_FILE, gravity, indent=None)
            stage_out = pathlib.Path(tmp) / "subjects"
            write_subjects_from_raw(stage_raw, stage_out, seed=self.mask_seed)
            for path in sorted(stage_raw.iterdir()):
                texts[output / RAW_FOLDER / path.name] = path.read_text(encoding="utf-8")
            for name in list_subjects():
                texts[output / f"{name}.jsonl"] = (stage_out / f"{name}.jsonl").read_text("utf-8")
        return texts


def _sample_summary(index: int, kept: Kept) -> dict:
    cand, answer = kept.candidate, kept.answer
    return {"index": index, "gravity_dir": list(cand.gravity_dir),
            "budget": cand.volume_fraction, "volume_fraction": float(answer.design.mean()),
            "compliance": answer.compliance, "grid": grid_to_text(answer.grid)}


def generate_dataset(output_dir, num_samples: int, *, seed: int = 0, grid_size: int = 10,
                     volume_fraction: float | None = None, gravity_dirs=("down",),
                     num_devices: int | None = None, progress: Progress | None = None,
                     options: StrongOptions = DEFAULT_OPTIONS,
                     batch_size: int | None = None, max_attempts: int | None = None,
                     min_difference: int = MIN_DIFFERENCE, mask_seed: int = 42,
                     boundary: BoundarySpec = DEFAULT_BOUNDARY,
                     volume_fraction_range: tuple[float, float] = VOLUME_FRACTION_RANGE) -> dict:
    """Generate ``num_samples`` new samples and write raw CSVs and the 16 subjects.

    Layout: ``<output_dir>/raw/<n>_SPhyR_2D.csv`` (+ ``raw/gravity.json``
    unless every direction is ``"down"``) and ``<output_dir>/<subject>.jsonl``.
    Nothing is written until every sample is kept; then all files are
    replaced together, so on any failure the folder is left as it was.

    Args:
        output_dir: target folder (created if missing).
        num_samples: samples to keep.
        seed: seed of the ``numpy.random.Generator`` drawing the problems.
        grid_size: n of the n x n grid.
        volume_fraction: fixed budget for every sample (None: drawn per sample).
        gravity_dirs: directions drawn from per sample (names or (row, col),
            or one comma-separated string of names).
        num_devices: devices the batches are split over (None: all local).
        progress: optional callable(stage, done, total); stages ``"simp"``,
            ``"polish"``, ``"tabu"`` (per batch), ``"kept"`` and ``"write"``.
        options: optimiser settings.
        batch_size: candidates optimised per batch (default about 1.25 x
            ``num_samples``, a multiple of 8, at most 256).
        max_attempts: bound on drawn candidates (default 10 x ``num_samples``
            + one batch).
        min_difference: an answer must differ from every kept one (and its
            mirror image and shifts along the load edge) in at least this many
            cells; see :func:`is_near_copy`.
        mask_seed: seed of the subject masks (42 as in the published data).
        boundary: how load and support runs are drawn.
        volume_fraction_range: range of drawn budgets.

    Returns:
        Summary (the same fields for every generator version,
        :meth:`sphyr_jax.data.generation.Outcome.summary`): ``kept``,
        ``drawn``, ``solved``, ``unused``, ``rejected`` (by reason: ``budget``,
        ``not_load_carrying``, ``degenerate``, ``duplicate``), ``batches``,
        ``batch_size``, ``seconds``, ``samples_per_second``, ``device``,
        ``subjects`` and ``samples`` (per sample: ``index``, ``gravity_dir``,
        ``budget``, ``volume_fraction``, ``compliance`` and ``grid``, the
        easy answer as text in the generation frame).

    Raises:
        GenerationError: if ``max_attempts`` candidates do not give enough samples.
        ValueError: for bad arguments or a raw folder holding another dataset.
    """
    fea.require_x64()
    check_num_samples(num_samples)
    if volume_fraction is not None and not 0.0 < float(volume_fraction) <= 1.0:
        raise UserInputError(f"volume_fraction must lie in (0, 1], got {volume_fraction!r}")
    if isinstance(gravity_dirs, str):
        gravity_dirs = [g for g in gravity_dirs.split(",") if g.strip()]
    names = tuple(gravity_name(g) for g in gravity_dirs)
    if not names:
        raise UserInputError("gravity_dirs is empty")
    batch_size = batch_size or _default_batch(num_samples)
    rules = V1Rules(grid_size=grid_size, gravity_dirs=names, volume_fraction=volume_fraction,
                    boundary=boundary, volume_fraction_range=volume_fraction_range,
                    options=options, num_devices=num_devices, batch_size=batch_size,
                    min_difference=min_difference, mask_seed=mask_seed)
    outcome = generate(rules, output_dir, num_samples,
                       max_attempts=max_attempts or 10 * num_samples + batch_size, seed=seed,
                       progress=progress)
    return outcome.summary(
        output_dir, dataset_version="v1", seed=seed, grid_size=grid_size,
        batch_size=batch_size,
        samples=[_sample_summary(i, k) for i, k in enumerate(outcome.kept)])
