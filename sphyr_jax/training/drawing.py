"""Training problems drawn by the benchmark's own sampling rules (host side, NumPy).

A *source* is a generator family at a grid size, written ``"<family>:<n>"``:
``v1`` draws with :class:`sphyr_jax.data.generate.V1Rules` (one load run on an
edge, supports on the opposite edge, the four axis directions, a budget drawn
per sample), ``v2`` with :class:`sphyr_jax.data.generate_v2.V2Rules` (groups on
any edge, a second support group, eight directions, volume fraction 0.3).
Both are drawn by the rules' own ``draw(rng)`` and refused by the rules' own
``screen`` (a budget that leaves no material to place), so the trainer sees
exactly the problems the benchmark generators draw.

For each source, :class:`ProblemSet` holds

* a *bank* of drawn layouts (load, support, direction, budget), and
* a *pool*: the first ``pool_size`` of them solved by the family's own
  optimiser at cheap settings (:data:`sphyr_jax.data.generate.QUICK_OPTIONS`,
  :data:`sphyr_jax.data.generate_v2.QUICK_V2_OPTIONS`), with the easy and hard
  answers that family writes (v1: 0/1, its hard answer the same values; v2:
  the binarised, polished optimum and its densities to one decimal).

A training problem takes a mask variant and a format; a partial mask, or a
full mask with probability ``pool_fraction``, shows the known cells of a pool
answer, any other full mask a bank layout with empty known cells.  The mask is
drawn as the family's own sets draw it: v1 by
:func:`sphyr_jax.data.convert.mask_grid` in the canonical frame (then turned
with the sample; its cells may hide load or support cells), v2 by
:func:`sphyr_jax.data.generate_v2.v2_mask` among the free cells.  Its *target*
volume fraction is the answer's (pool) or the layout's budget (bank): the
loss's material term (:mod:`sphyr_jax.training.loop`) charges only material
above it, as the topology score's material efficiency does.

Training problems never come from a benchmark set.  :class:`Exclusion` holds
them apart from every benchmark sample (:mod:`sphyr_jax.data.exclusion`: the
embedded v1 set and its turns and ``dataset_v2`` at 10x10, ``dataset_v2_20`` at
20x20) by the v2 distances: a drawn layout within ``MIN_LAYOUT_DISTANCE`` (6)
cells of a benchmark layout is drawn again, and a pool answer whose easy
answer lies within ``MIN_STRUCTURE_DISTANCE`` (8) cells of a benchmark easy
answer is dropped from the pool.  Bank layouts have no answer (they are never
solved), so only the layout check applies to them.  Optionally
(``symmetric=True``) every turned and mirrored image of a candidate is
checked too.  The v1 rules' layouts are few (one run on each of two opposite
edges): at 10x10 nearly every one lies within 6 cells of a sample of the
embedded v1 set, so v1 problems are drawn at other grid sizes (e.g. 9 and 11;
the model is fully convolutional), where no benchmark sample exists.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from sphyr_jax.data import generate as v1_generation
from sphyr_jax.data import generate_v2
from sphyr_jax.data.convert import mask_grid
from sphyr_jax.data.datasets import VARIANTS
from sphyr_jax.problem.grids import MASK
from sphyr_jax.progress import Progress
from sphyr_jax.training.config import FAMILIES, parse_source

V1_DIRECTIONS = ("down", "right", "up", "left")

DRAW_CHUNK = 256  # candidates drawn and checked against the exclusion index at once
MAX_DRAWS_PER_LAYOUT = 100  # draws per wanted layout before drawing gives up


def _images(masks: np.ndarray) -> np.ndarray:
    """(8, K, n, n): the images of (K, n, n) square masks under the eight symmetries."""
    return np.stack([np.rot90(np.flip(masks, -1) if m else masks, k, axes=(-2, -1))
                     for m in (False, True) for k in range(4)])


class Exclusion:
    """Benchmark samples that training problems are held apart from, per grid size.

    Args:
        folders: ``{grid size: dataset folders}`` (default: the embedded
            benchmark sets, :func:`sphyr_jax.data.exclusion.default_exclusion_dirs`).
        symmetric: also refuse a candidate whose turned or mirrored image is too
            close (the eight symmetries of the square).
    """

    def __init__(self, folders: dict[int, Sequence[str]] | None = None, *,
                 symmetric: bool = False):
        self.folders = folders
        self.symmetric = symmetric
        self._indexes: dict[int, object] = {}

    def index(self, grid_size: int):
        """The :class:`~sphyr_jax.data.exclusion.BenchmarkIndex` of a grid size (built once)."""
        from sphyr_jax.data.exclusion import BenchmarkIndex, default_exclusion_dirs

        n = int(grid_size)
        if n not in self._indexes:
            dirs = (self.folders or {}).get(n, ()) if self.folders is not None else (
                default_exclusion_dirs(n))
            self._indexes[n] = BenchmarkIndex.from_dirs(dirs, n)
        return self._indexes[n]

    def _images(self, masks: np.ndarray) -> np.ndarray:
        return _images(masks) if self.symmetric else masks[None]

    def layouts_too_close(self, load: np.ndarray, support: np.ndarray) -> np.ndarray:
        """(K,) bool: a (K, n, n) layout (or, symmetric, one of its images) lies within
        the layout distance of a benchmark layout."""
        from sphyr_jax.data.exclusion import layout_bits

        index = self.index(load.shape[-1])
        bits = layout_bits(self._images(load), self._images(support))
        close = index.layout_too_close(bits.reshape(-1, bits.shape[-1]))
        return close.reshape(-1, len(load)).any(0)

    def structures_too_close(self, solid: np.ndarray) -> np.ndarray:
        """(K,) bool: a (K, n, n) easy answer's material (or, symmetric, one of its
        images) lies within the structure distance of a benchmark easy answer."""
        from sphyr_jax.data.exclusion import pack_cells

        index = self.index(solid.shape[-1])
        bits = pack_cells(self._images(solid))
        close = index.structure_too_close(bits.reshape(-1, bits.shape[-1]))
        return close.reshape(-1, len(solid)).any(0)


def family_rules(family: str, grid_size: int):
    """The sampling rules of a family (v1: every axis direction) at cheap optimiser settings."""
    if family == "v1":
        return v1_generation.V1Rules(grid_size=grid_size, gravity_dirs=V1_DIRECTIONS,
                                     options=v1_generation.QUICK_OPTIONS, batch_size=64)
    return generate_v2.V2Rules(grid_size=grid_size, options=generate_v2.QUICK_V2_OPTIONS)


@dataclasses.dataclass(frozen=True)
class Layouts:
    """Drawn layouts of one source (NumPy, batch-first).

    Attributes:
        load, support: (N, n, n) bool, in the drawn frame.
        gravity: (N, 2) unit load directions.
        budget: (N,) the rules' volume fraction (whole grid, L/S included).
        turns: (N,) quarter turns from the canonical v1 frame (v1 masks are
            drawn there); 0 for v2.
    """

    load: np.ndarray
    support: np.ndarray
    gravity: np.ndarray
    budget: np.ndarray
    turns: np.ndarray

    def __len__(self) -> int:
        return len(self.budget)


def draw_layouts(family: str, grid_size: int, count: int, rng: np.random.Generator,
                 exclusion: Exclusion | None = None) -> tuple[Layouts, list, int]:
    """Draw ``count`` layouts with the family's rules.

    A draw the rules fail (v2: too few support cells) or refuse (no material
    left for the design cells) is drawn again, and so is one the exclusion
    refuses (candidates are checked :data:`DRAW_CHUNK` at a time).

    Returns:
        (layouts, their candidates, how many the exclusion refused).

    Raises:
        ValueError: when ``MAX_DRAWS_PER_LAYOUT * count`` draws do not give
            ``count`` layouts (the exclusion refuses nearly every draw).
    """
    rules = family_rules(family, grid_size)
    candidates, refused, drawn = [], 0, 0
    while len(candidates) < count:
        if drawn >= MAX_DRAWS_PER_LAYOUT * max(count, DRAW_CHUNK):
            raise ValueError(
                f"{family}:{grid_size}: {refused} of {drawn} drawn layouts lie near a benchmark "
                f"sample, {len(candidates)} of {count} found; draw this family at another "
                "grid size")
        drawn += DRAW_CHUNK
        chunk = []
        while len(chunk) < DRAW_CHUNK:
            cand = rules.draw(rng)
            if not isinstance(cand, str) and rules.screen(cand, (), ()) is None:
                chunk.append(cand)
        if exclusion is not None:
            close = exclusion.layouts_too_close(np.stack([c.load_mask for c in chunk]),
                                                np.stack([c.support_mask for c in chunk]))
            refused += int(close.sum())
            chunk = [c for c, bad in zip(chunk, close, strict=True) if not bad]
        candidates.extend(chunk[: count - len(candidates)])
    gravity = np.asarray([c.gravity_dir for c in candidates], np.float64).reshape(-1, 2)
    gravity /= np.linalg.norm(gravity, axis=1, keepdims=True)
    turns = [v1_generation.quarter_turns(c.gravity) if family == "v1" else 0
             for c in candidates]
    empty = np.zeros((0, grid_size, grid_size), bool)
    layouts = Layouts(
        load=np.stack([c.load_mask for c in candidates]) if candidates else empty,
        support=np.stack([c.support_mask for c in candidates]) if candidates else empty,
        gravity=gravity, budget=np.asarray([c.volume_fraction for c in candidates], np.float64),
        turns=np.asarray(turns, np.int64))
    return layouts, candidates, refused


def solve_answers(family: str, candidates: Sequence, progress: Progress | None = None,
                  chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Easy and hard answers (each (N, n, n), L/S cells 1) of candidates, by the family's
    own optimiser at cheap settings, ``chunk`` candidates per batched call."""
    report = progress or (lambda stage, done, total: None)
    easy, hard = [], []
    total = len(candidates)
    report("pool", 0, total)
    for lo in range(0, total, chunk):
        part = list(candidates[lo:lo + chunk])
        if family == "v1":
            out = v1_generation.optimise_candidates(part, v1_generation.QUICK_OPTIONS)
            easy.append(out.designs)
            hard.append(out.designs)  # v1 writes its 0/1 answer in the hard format too
        else:
            out = generate_v2.optimise_v2(part, generate_v2.QUICK_V2_OPTIONS)
            easy.append(out.easy)
            hard.append(out.hard)
        report("pool", min(lo + chunk, total), total)
    return np.concatenate(easy), np.concatenate(hard)


@dataclasses.dataclass(frozen=True)
class ProblemSet:
    """A source's bank of layouts and its pool of solved ones (see the module docstring).

    Attributes:
        family: ``"v1"`` or ``"v2"``.
        grid_size: n.
        bank: every drawn layout.
        pool: (P,) indices into the bank of the solved layouts.
        easy, hard: (P, n, n) their answers.
        refused: ``{"layout": drawn layouts the exclusion refused, "structure":
            pool answers it dropped}``.
    """

    family: str
    grid_size: int
    bank: Layouts
    pool: np.ndarray
    easy: np.ndarray
    hard: np.ndarray
    refused: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, source: str, *, bank_size: int, pool_size: int, seed: int,
              exclusion: Exclusion | None = None, progress: Progress | None = None
              ) -> ProblemSet:
        """Draw ``max(bank_size, pool_size)`` layouts and solve the first ``pool_size``
        (pool answers the exclusion calls too close to a benchmark answer are dropped)."""
        family, n = parse_source(source)
        rng = np.random.default_rng([seed, FAMILIES.index(family), n])
        bank, candidates, refused = draw_layouts(family, n, max(bank_size, pool_size), rng,
                                                 exclusion)
        pool = np.arange(pool_size)
        if pool_size:
            easy, hard = solve_answers(family, candidates[:pool_size], progress)
        else:
            easy = hard = np.zeros((0, n, n))
        dropped = 0
        if exclusion is not None and pool_size:
            keep = ~exclusion.structures_too_close(easy >= 0.5)
            dropped = int((~keep).sum())
            pool, easy, hard = pool[keep], easy[keep], hard[keep]
        return cls(family, n, bank, pool, easy, hard,
                   {"layout": refused, "structure": dropped})


@dataclasses.dataclass(frozen=True)
class DrawnProblems:
    """A batch of drawn problems (NumPy), the inputs of
    :func:`sphyr_jax.training.problems.build_problem`.

    Attributes:
        load, support: (B, n, n) bool, the true load / support cells.
        masked: (B, n, n) bool, the ``V`` cells.
        known: (B, n, n) densities shown on unmasked non-L/S cells.
        gravity: (B, 2) unit load directions.
        hard: (B,) bool, one-decimal format.
        target: (B,) the answer's volume fraction (bank layouts: their budget).
        variant: (B,) index into ``VARIANTS``.
        source: (B,) index of the problem's source.
    """

    load: np.ndarray
    support: np.ndarray
    masked: np.ndarray
    known: np.ndarray
    gravity: np.ndarray
    hard: np.ndarray
    target: np.ndarray
    variant: np.ndarray
    source: np.ndarray


def draw_mask(family: str, variant: str, load: np.ndarray, support: np.ndarray, turns: int,
              rng: np.random.Generator) -> np.ndarray:
    """(n, n) bool mask of one variant, drawn as the family's sets draw it.

    v1: :func:`sphyr_jax.data.convert.mask_grid` on the canonical frame (the
    layout turned back by ``turns``), then turned with the sample; v2:
    :func:`sphyr_jax.data.generate_v2.v2_mask` among the free cells.
    """
    if family == "v2":
        return generate_v2.v2_mask(variant, ~(load | support), rng)
    n = load.shape[0]
    stream = random.Random(int(rng.integers(2**63)))
    canonical = mask_grid([["0"] * load.shape[1] for _ in range(n)], variant, stream)
    return np.rot90(np.asarray(canonical) == MASK, turns).copy()


def draw_problems(sets: Sequence[ProblemSet], weights: Sequence[float], batch_size: int,
                  rng: np.random.Generator, *, variant_weights: Sequence[float],
                  hard_fraction: float, pool_fraction: float,
                  source_ids: Sequence[int] | None = None) -> DrawnProblems:
    """A batch of problems from problem sets of one grid size.

    Args:
        sets: the problem sets (one grid size).
        weights: relative frequency of each set.
        batch_size: problems.
        rng: the draw's stream (advanced in place).
        variant_weights: relative frequency of the mask variants of ``VARIANTS``.
        hard_fraction: share of one-decimal problems.
        pool_fraction: share of full masks that show a pool answer's known cells.
        source_ids: the label of each set in ``DrawnProblems.source`` (default 0, 1, ...).
    """
    w = np.asarray(weights, np.float64)
    vw = np.asarray(variant_weights, np.float64)
    ids = list(range(len(sets))) if source_ids is None else list(source_ids)
    full = VARIANTS.index("full")
    rows = []
    for _ in range(batch_size):
        s = int(rng.choice(len(sets), p=w / w.sum()))
        ps = sets[s]
        variant = int(rng.choice(len(VARIANTS), p=vw / vw.sum()))
        hard = bool(rng.random() < hard_fraction)
        pooled = len(ps.easy) > 0 and (variant != full or rng.random() < pool_fraction)
        if pooled:
            a = int(rng.integers(len(ps.easy)))
            i = int(ps.pool[a])
            answer = (ps.hard if hard else ps.easy)[a]
            target = float(answer.mean())
        else:
            i = int(rng.integers(len(ps.bank)))
            answer = np.zeros((ps.grid_size, ps.grid_size))
            target = float(ps.bank.budget[i])
        load, support = ps.bank.load[i], ps.bank.support[i]
        masked = draw_mask(ps.family, VARIANTS[variant], load, support, int(ps.bank.turns[i]),
                           rng)
        rows.append((load, support, masked, np.where(masked, 0.0, answer), ps.bank.gravity[i],
                     hard, target, variant, ids[s]))
    cols = list(zip(*rows, strict=True))
    return DrawnProblems(
        load=np.stack(cols[0]), support=np.stack(cols[1]), masked=np.stack(cols[2]),
        known=np.stack(cols[3]).astype(np.float64), gravity=np.stack(cols[4]),
        hard=np.asarray(cols[5], bool), target=np.asarray(cols[6], np.float64),
        variant=np.asarray(cols[7], np.int64), source=np.asarray(cols[8], np.int64))

