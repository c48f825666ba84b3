"""Static (grid-only) metrics of completions: the published columns beside the physics.

The published benchmark scores every completion with twelve metrics that read
the token grids only (no simulation): agreement with the dataset answer,
graph connectivity between loads and supports, floating material, a
direction-weighted load-path cost and a difficulty weight of the masked cells.
This module computes them under their published names
(:data:`STATIC_METRIC_KEYS`, :class:`StaticMetrics`), batched: a whole batch of
records is read once, and every metric is a handful of NumPy operations over
all the grids of one shape at once (connected components with
:func:`scipy.ndimage.label`, the directed searches and the path costs as
frontier propagations over the batch).

Conventions.  Grids are token grids; "solid" means ``L``, ``S`` or a number
above 0; a "number" is an ASCII decimal literal
(:func:`sphyr_jax.problem.grids.parse_number`).  Text is read as the published
harness reads it (:func:`read_grid`): the last block of consecutive lines made
only of whitespace-separated tokens of digits, ``.``, ``L``, ``V`` and ``S``.
Neighbourhoods are the 8 cells around a cell in 2D and the 26 voxels around a
voxel in 3D (a voxel grid is a list of layers, layer 0 on top; its load
direction a (layer, row, col) step).  The load direction $g$ is normalised to
unit length first (the published unit directions are unchanged by that).

Definitions (output = the completion, answer = the dataset's ground truth):

* ``valid_output_grid``: the output has the answer's shape and every cell that
  is not ``L`` or ``S`` is a number in [0, 1] (a leftover ``V`` is invalid).
  An invalid output scores ``exact_match`` false, every ratio 0, both
  connectivity flags false, 0 clusters and a path ratio of 0;
  ``difficulty_score`` is computed all the same.  A record whose load
  direction is unusable (wrong length, zero, not finite) scores as invalid
  too, and one whose answer is not a non-empty rectangular grid scores 0 on
  everything.
* ``exact_match``: no cell differs as a string.
* ``difference_ratio`` $= 1 - n_{diff} / \\Sigma_{gt}$, with $n_{diff}$ the
  differing cells and $\\Sigma_{gt}$ the sum of the answer's numeric cells;
  1 when nothing differs; it can be negative; 0 when something differs and
  $\\Sigma_{gt} = 0$ (where the published code divides by zero).
  ``relative_difference_ratio``: the same with each differing pair counting
  $|a - b|$ in exact decimal arithmetic and a pair with a non-number (``L``,
  ``S``, ``V``) counting 1; ``penalized_difference_ratio``: such pairs count 3.
  The relative ratios are 1 when the summed difference is 0 (``1`` against
  ``1.0`` differs as a string but not in value).
* ``load_support_connected``: a breadth-first search from all ``L`` cells
  through solid cells reaches an ``S``.
* ``load_support_connected_force_directional``: a search from the ``L`` cells
  through solid cells, taking only steps $d$ with $d_i g_i \\ge 0$ on every
  axis, reaches an ``S`` (from some ``L``: the published search stops at the
  first that does).
* ``isolated_clusters_count``: connected groups of solid cells that contain
  no ``L`` and no ``S`` (groups of numeric cells, grown through solid cells).
* ``force_path_cost_average_efficiency_ratio``
  $= \\mathrm{clip}(\\mathrm{cost}(\\text{answer}) / \\mathrm{cost}(\\text{output}), 0, 1)$,
  0 when $\\mathrm{cost}(\\text{output}) = 0$.  $\\mathrm{cost}$ of a grid is
  the mean over its ``L`` cells of the cheapest path to any ``S`` through
  solid cells; a step $d$ with $d \\cdot g < -0.5$ is forbidden; a step into a
  cell on axis-0 index $r$ (the row in 2D, the layer in 3D) from a load on
  index $r_L$ costs $w(\\theta)\\,(1 + 0.05 |r - r_L|)$, where $\\theta$ is the
  angle between $d$ and $g$, $\\arccos(d \\cdot g / (|d||g| + 10^{-9}))$ in
  degrees, and $w$ is 1.0 below 15°, 1.2 below 45°, 1.5 below 100°, else 3.0
  (a diagonal step lands just above 45°).  Paths reaching 1000 are cut; a
  load with no path costs 1000; a grid without ``L`` or ``S`` costs 0.
* ``difficulty_score``: over the input's ``V`` cells, the mean of a weight
  from the answer's numeric neighbours: all 0 or all 1 and equal to the
  cell's answer (``L``/``S`` read as 1, anything else unparsable as 0) -> 1,
  all 0 or all 1 and otherwise -> 2, mixed -> 3; a cell without a numeric
  neighbour counts with weight 0; 0 without ``V`` cells or when every weight
  is 0, and when the input is missing or not of the answer's shape.
  ``difficulty_weighted_difference_ratio`` and
  ``difficulty_weighted_relative_difference_ratio`` are ``difficulty_score``
  times the two ratios.

The published code sums in row-major order; the ratios here do the same.  The
path costs are computed backwards from the supports (a multi-source search
per load row), which sums each path's step costs in the opposite order: the
costs agree with a forward Dijkstra search from each load to rounding
(~1e-15 relative).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

import numpy as np

from sphyr_jax.problem.grids import extract_grid, grid_ndim, last_plain_lines, parse_number
from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY

MAX_PATH_COST = 1000.0
"""Path costs are cut here; a load with no path to a support costs this much."""
DEPTH_PENALTY = 0.05
"""Extra step cost per row (layer in 3D) between the step's target and its load."""
MASKED_PAIR_PENALTY = 3.0
"""What a pair involving a non-number counts in ``penalized_difference_ratio``."""
FORBIDDEN_DOT = -0.5
"""Steps whose dot product with the unit load direction is below this are forbidden."""


@dataclasses.dataclass
class StaticMetrics:
    """The twelve grid-only metrics of one completion (see the module docstring).

    Ratios are higher-is-better (1 at best; the difference ratios can be
    negative); ``isolated_clusters_count`` is lower-is-better;
    ``difficulty_score`` (0..3) describes the sample, not the completion.
    The defaults are the scores of an invalid output.
    """

    valid_output_grid: bool = False
    exact_match: bool = False
    difference_ratio: float = 0.0
    relative_difference_ratio: float = 0.0
    penalized_difference_ratio: float = 0.0
    load_support_connected: bool = False
    load_support_connected_force_directional: bool = False
    isolated_clusters_count: int = 0
    force_path_cost_average_efficiency_ratio: float = 0.0
    difficulty_score: float = 0.0
    difficulty_weighted_difference_ratio: float = 0.0
    difficulty_weighted_relative_difference_ratio: float = 0.0

    def as_dict(self) -> dict:
        """JSON-ready fields, in :data:`STATIC_METRIC_KEYS` order."""
        return dataclasses.asdict(self)


STATIC_METRIC_KEYS = tuple(f.name for f in dataclasses.fields(StaticMetrics))
"""The published names of the static metrics, in the published order."""


# ----------------------------------------------------------------------------
# Reading grids.

def _cell(token) -> str:
    try:
        return str(token).strip()
    except ValueError:  # an int too long for str()
        return "?"


def _nested_rows(grid) -> list | None:
    """Rows of a 2D nested grid as token tuples (a row string is split); None if not one."""
    if not isinstance(grid, (list, tuple, np.ndarray)):
        return None
    rows = []
    for row in grid:
        if isinstance(row, str):
            rows.append(tuple(row.split()))
        elif isinstance(row, (list, tuple, np.ndarray)):
            rows.append(tuple(_cell(t) for t in row))
        else:
            return None
    return rows


def _rows(grid, ndim: int) -> list:
    """A grid as rows (2D) or layers of rows (3D); a row is a line of text or a
    tuple of tokens.  ``[]`` when nothing is found."""
    if isinstance(grid, str):
        if ndim == 2:
            return last_plain_lines(grid)
        found = extract_grid(grid, ndim=3)
        return [[tuple(row) for row in layer] for layer in found] if found else []
    if ndim == 2:
        return _nested_rows(grid) or []
    if not isinstance(grid, (list, tuple, np.ndarray)):
        return []
    layers = [_nested_rows(layer) for layer in grid]
    return [] if any(layer is None for layer in layers) else layers


def read_grid(grid, ndim: int = 2) -> list:
    """A grid as the published harness reads it.

    Text: the last block of consecutive lines that consist only of
    whitespace-separated tokens made of digits, ``.``, ``L``, ``V`` and ``S``
    (a blank line, a code fence or prose ends a block;
    :func:`sphyr_jax.problem.grids.last_plain_lines`).  With ``ndim=3``, text
    is read by :func:`sphyr_jax.problem.grids.extract_grid` (layers separated
    by blank lines).  Nested lists pass through as string tokens.

    Args:
        grid: text, nested token lists, or None.
        ndim: 2, or 3 for voxel grids.

    Returns:
        Token rows (layers of token rows for ``ndim=3``); ``[]`` when nothing
        is found.  Rows may be ragged: callers check shapes.
    """
    def tokens(row):
        return row.split() if isinstance(row, str) else list(row)

    rows = _rows(grid, ndim)
    if ndim == 3:
        return [[tokens(row) for row in layer] for layer in rows]
    return [tokens(row) for row in rows]


# ----------------------------------------------------------------------------
# Token tables: every distinct token of a batch gets an id, and per-id
# properties turn grids of ids into masks with one indexing operation.

_NUMBER, _LOAD, _SUPPORT, _MASK, _OTHER = range(5)
_KINDS = {"L": _LOAD, "S": _SUPPORT, "V": _MASK}


class _Tokens:
    """Ids of the distinct tokens (and rows) of a batch and the tokens' properties."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.tokens: list[str] = []
        self._kind: list[int] = []
        self._value: list[float] = []
        self._row_ids: dict = {}
        self._arrays = None

    def _id(self, token: str) -> int:
        found = self.index.get(token)
        if found is not None:
            return found
        self.index[token] = len(self.tokens)
        self.tokens.append(token)
        kind = _KINDS.get(token)
        value = math.nan
        if kind is None:
            number = parse_number(token)
            kind, value = (_OTHER, math.nan) if number is None else (_NUMBER, number)
        self._kind.append(kind)
        self._value.append(value)
        self._arrays = None
        return self.index[token]

    def _row(self, row) -> tuple:
        ids = self._row_ids.get(row)
        if ids is None:
            tokens = row.split() if isinstance(row, str) else row
            ids = self._row_ids[row] = tuple(self._id(t) for t in tokens)
        return ids

    def encode(self, rows: list, ndim: int) -> np.ndarray | None:
        """Ids of a grid given by :func:`_rows`, an int32 array of its shape;
        None unless it is non-empty and rectangular."""
        if not rows:
            return None
        if ndim == 3:
            layers = [self.encode(layer, 2) for layer in rows]
            if any(layer is None for layer in layers) or len({a.shape for a in layers}) != 1:
                return None
            return np.stack(layers)
        ids = [self._row(row) for row in rows]
        width = len(ids[0])
        if width == 0 or any(len(r) != width for r in ids):
            return None
        return np.asarray(ids, dtype=np.int32)

    def arrays(self):
        """(kind, value, solid, valid cell) per id."""
        if self._arrays is None:
            kind = np.asarray(self._kind, dtype=np.int8)
            value = np.asarray(self._value, dtype=np.float64)
            number = kind == _NUMBER
            with np.errstate(invalid="ignore"):
                solid = (kind == _LOAD) | (kind == _SUPPORT) | (number & (value > 0.0))
                in_range = number & (value >= 0.0) & (value <= 1.0)
            valid = (kind == _LOAD) | (kind == _SUPPORT) | in_range
            self._arrays = (kind, value, solid, valid)
        return self._arrays


# ----------------------------------------------------------------------------
# Neighbourhood operations on batches: arrays (n, *shape), axis 0 the batch.


def _offsets(ndim: int) -> np.ndarray:
    """The 8 (2D) or 26 (3D) unit steps, (K, ndim) int."""
    steps = [d for d in itertools.product((-1, 0, 1), repeat=ndim) if any(d)]
    return np.asarray(steps, dtype=np.int64)


def _pair(step) -> tuple[tuple, tuple]:
    """(dst, src) index tuples with ``a[dst]`` the cells x whose ``x - step`` is
    inside the grid and ``a[src]`` those ``x - step``; axis 0 (the batch) whole."""
    dst = [slice(None)]
    src = [slice(None)]
    for d in step:
        d = int(d)
        if d > 0:
            dst.append(slice(d, None))
            src.append(slice(None, -d))
        elif d < 0:
            dst.append(slice(None, d))
            src.append(slice(-d, None))
        else:
            dst.append(slice(None))
            src.append(slice(None))
    return tuple(dst), tuple(src)


def _spatial(a: np.ndarray) -> tuple[int, ...]:
    return tuple(range(1, a.ndim))


def _unit_gravity(gravity, ndim: int) -> np.ndarray | None:
    """The unit load direction, or None if unusable (wrong length, zero, not finite)."""
    if gravity is None:
        gravity = DEFAULT_GRAVITY if ndim == 2 else (1.0, 0.0, 0.0)
    try:
        g = np.asarray(gravity, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return None
    if ndim == 3 and g.shape == (2,) and tuple(g) == DEFAULT_GRAVITY:
        g = np.array([1.0, 0.0, 0.0])  # the 2D default means down on voxels
    if g.shape != (ndim,) or not np.all(np.isfinite(g)):
        return None
    norm = float(np.sqrt(np.sum(g * g)))
    return g / norm if norm > 0.0 else None


def step_weights(gravity, ndim: int = 2) -> np.ndarray:
    """Cost weight of every unit step for a load direction (inf: forbidden).

    Args:
        gravity: the load direction, (row, col) or (layer, row, col).
        ndim: 2 or 3.

    Returns:
        (K,) float64 in the order of the 8 (26) unit steps
        ``itertools.product((-1, 0, 1), repeat=ndim)`` without the zero step:
        $w(\\theta)$ of the module docstring, inf where $d \\cdot g < -0.5$.

    Raises:
        ValueError: for an unusable direction.
    """
    g = _unit_gravity(gravity, ndim)
    if g is None:
        raise ValueError(f"unusable load direction {gravity!r}")
    return _step_weights(g)


def _step_weights(g: np.ndarray) -> np.ndarray:
    steps = _offsets(g.size).astype(np.float64)
    out = np.empty(len(steps))
    for k, d in enumerate(steps):
        dot = float(d @ g)
        if dot < FORBIDDEN_DOT:
            out[k] = np.inf
            continue
        cos = dot / (math.sqrt(float(d @ d)) * math.sqrt(float(g @ g)) + 1e-9)
        angle = math.degrees(math.acos(max(-1.0, min(1.0, cos))))
        out[k] = 1.0 if angle < 15 else 1.2 if angle < 45 else 1.5 if angle < 100 else 3.0
    return out


def _directional_steps(g: np.ndarray) -> np.ndarray:
    """(K,) bool: steps with $d_i g_i \\ge 0$ on every axis."""
    return np.all(_offsets(g.size) * g >= 0.0, axis=1)


def _components(solid: np.ndarray, load: np.ndarray, support: np.ndarray):
    """Undirected connectivity and isolated clusters of a batch, (n,) each."""
    from scipy import ndimage

    n = solid.shape[0]
    structure = np.zeros((3,) * solid.ndim, bool)
    structure[1] = True  # full neighbourhood in space, nothing across the batch
    labels, count = ndimage.label(solid, structure=structure)
    has_load = np.zeros(count + 1, bool)
    has_load[labels[load]] = True
    has_support = np.zeros(count + 1, bool)
    has_support[labels[support]] = True
    both = has_load & has_support
    both[0] = False
    connected = both[labels].reshape(n, -1).any(axis=1)
    record = np.zeros(count + 1, np.int64)
    record[labels.reshape(n, -1)] = np.arange(n)[:, None]
    isolated = ~(has_load | has_support)
    isolated[0] = False
    clusters = np.bincount(record[isolated], minlength=n)
    return connected, clusters


def _directional(solid, load, support, allowed: np.ndarray) -> np.ndarray:
    """Whether a search from the loads along allowed steps reaches a support, (n,)."""
    n = solid.shape[0]
    steps = _offsets(solid.ndim - 1)
    reached = np.zeros(n, bool)
    reach = load.copy()
    active = np.flatnonzero(load.reshape(n, -1).any(axis=1))
    while active.size:
        front = reach[active]
        ok = allowed[active]
        grow = np.zeros_like(front)
        for k, step in enumerate(steps):
            if ok[:, k].any():
                dst, src = _pair(step)  # a step d moves reach from x - d to x
                moved = front[src]
                if not ok[:, k].all():
                    moved = moved & ok[:, k].reshape((-1,) + (1,) * (front.ndim - 1))
                grow[dst] |= moved
        grow &= solid[active]
        grow &= ~front
        hit = (grow & support[active]).reshape(active.size, -1).any(axis=1)
        grew = grow.reshape(active.size, -1).any(axis=1)
        reach[active] = front | grow
        reached[active[hit]] = True
        active = active[grew & ~hit]
    return reached


def _path_costs(solid, load, support, weights: np.ndarray) -> np.ndarray:
    """Mean over the loads of the cheapest path to a support, (n,) (see module docs).

    Backwards from the supports: for every grid and every axis-0 index holding
    a load, a multi-source Bellman-Ford relaxation over the batch gives each
    cell's cheapest cost to a support under that index's depth penalty.
    """
    n = solid.shape[0]
    shape = solid.shape[1:]
    costs = np.zeros(n)
    has = load.reshape(n, -1).any(axis=1) & support.reshape(n, -1).any(axis=1)
    if not has.any():
        return costs
    loads = np.argwhere(load & has.reshape((-1,) + (1,) * len(shape)))  # row-major
    group_key, group_of_load = np.unique(loads[:, 0] * shape[0] + loads[:, 1],
                                         return_inverse=True)
    grid = group_key // shape[0]
    depth = group_key % shape[0]
    rows = np.arange(shape[0], dtype=np.float64)
    factor = (1.0 + DEPTH_PENALTY * np.abs(rows[None, :] - depth[:, None]))
    factor = factor.reshape((-1, shape[0]) + (1,) * (len(shape) - 1))
    dist = np.where(support[grid], 0.0, np.inf)
    blocked = np.where(solid[grid], 0.0, np.inf)
    steps = _offsets(len(shape))
    step_weights = weights[grid]
    # Working copies of the groups still changing; compacted when they thin out.
    active = np.arange(len(grid))
    work = dist
    work_blocked, work_factor, work_weights = blocked, factor, step_weights
    while active.size:
        best = work.copy()
        entering: dict = {}  # a cost array per distinct weight column (steps share them)
        for k, step in enumerate(steps):
            wk = work_weights[:, k]
            key = wk.tobytes()
            if key not in entering:
                finite = np.isfinite(wk)
                if not finite.any():
                    entering[key] = None
                else:
                    scale = np.where(finite, wk, 0.0).reshape((-1,) + (1,) * len(shape))
                    into = work + scale * work_factor  # cost of a path entering each cell
                    if not finite.all():
                        into[~finite] = np.inf
                    entering[key] = into
            into = entering[key]
            if into is None:
                continue
            dst, src = _pair(-step)  # best[x] against into[x + d]
            view = best[dst]
            np.minimum(view, into[src], out=view)
        best += work_blocked
        best[best >= MAX_PATH_COST] = np.inf
        changed = (best != work).reshape(active.size, -1).any(axis=1)
        work = best
        if changed.all():
            continue
        dist[active] = work
        if changed.mean() < 0.75:
            active = active[changed]
            work = work[changed]
            work_blocked = work_blocked[changed]
            work_factor = work_factor[changed]
            work_weights = work_weights[changed]
        elif not changed.any():
            break
    if active.size:
        dist[active] = work
    per_load = dist[(group_of_load,) + tuple(loads[:, 1:].T)]
    per_load = np.minimum(per_load, MAX_PATH_COST)
    totals = np.bincount(loads[:, 0], weights=per_load, minlength=n)
    counts = np.bincount(loads[:, 0], minlength=n)
    return np.where(has, totals / np.maximum(counts, 1), 0.0)


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.stack`` of equally shaped arrays (without its per-array checks)."""
    out = np.empty((len(arrays),) + arrays[0].shape, arrays[0].dtype)
    for k, a in enumerate(arrays):
        out[k] = a
    return out


def _row_major_sum(values: np.ndarray) -> np.ndarray:
    """Per-record sums in row-major order, (n, ...) -> (n,) (as the published loops)."""
    flat = values.reshape(values.shape[0], -1)
    if flat.shape[1] == 0:
        return np.zeros(flat.shape[0])
    return np.cumsum(flat, axis=1)[:, -1]


def _decimal_gaps(tokens: list[str], pairs: np.ndarray) -> np.ndarray:
    """|a - b| in exact decimal arithmetic for (m, 2) id pairs of numeric tokens."""
    out = np.empty(len(pairs))
    for k, (a, b) in enumerate(pairs):
        try:
            out[k] = float(abs(Decimal(tokens[a]) - Decimal(tokens[b])))
        except (InvalidOperation, ValueError):
            out[k] = 1.0
    return out


def _ratio(count: np.ndarray, total: np.ndarray) -> np.ndarray:
    """$1 - count / total$; 1 where count is 0, 0 where count > 0 and total is 0."""
    safe = np.where(total != 0.0, total, 1.0)
    return np.where(count == 0, 1.0, np.where(total != 0.0, 1.0 - count / safe, 0.0))


def _difficulty(table: _Tokens, inputs: np.ndarray, answers: np.ndarray) -> np.ndarray:
    kind, value, _, _ = table.arrays()
    masked = kind[inputs] == _MASK
    gk = kind[answers]
    numeric = gk == _NUMBER
    gv = value[answers]
    zero = numeric & (gv == 0.0)
    one = numeric & (gv == 1.0)
    n = np.zeros(answers.shape, np.int32)
    z = np.zeros_like(n)
    o = np.zeros_like(n)
    for step in _offsets(answers.ndim - 1):
        dst, src = _pair(step)
        n[dst] += numeric[src]
        z[dst] += zero[src]
        o[dst] += one[src]
    own = np.where(numeric, gv, np.where((gk == _LOAD) | (gk == _SUPPORT), 1.0, 0.0))
    all_zero = (n > 0) & (z == n)
    all_one = (n > 0) & (o == n)
    same = (all_one & (own == 1.0)) | (all_zero & (own == 0.0))
    weight = np.where(n == 0, 0.0, np.where(all_zero | all_one, np.where(same, 1.0, 2.0), 3.0))
    total = _row_major_sum(np.where(masked, weight, 0.0))
    count = masked.reshape(masked.shape[0], -1).sum(axis=1)
    return np.where((count > 0) & (total > 0), total / np.maximum(count, 1), 0.0)


# ----------------------------------------------------------------------------
# The batch.


@dataclasses.dataclass
class _Record:
    ndim: int
    shape: tuple | None  # the answer's shape (None: unusable answer)
    answer: np.ndarray | None = None
    inputs: np.ndarray | None = None
    output: np.ndarray | None = None
    direction: int | None = None  # index into the batch's distinct load directions


class _Directions:
    """The distinct usable load directions of a batch, with their step tables."""

    def __init__(self):
        self._ids: dict = {}
        self.unit: list[np.ndarray] = []
        self.weights: list[np.ndarray] = []
        self.allowed: list[np.ndarray] = []

    def id(self, gravity, ndim: int) -> int | None:
        """The id of a direction (None if unusable)."""
        try:
            key = (ndim, tuple(np.ravel(gravity).tolist()) if gravity is not None else None)
            hash(key)
        except (TypeError, ValueError):
            key = None
        if key is not None and key in self._ids:
            return self._ids[key]
        g = _unit_gravity(gravity, ndim)
        found = None
        if g is not None:
            unit_key = (ndim, tuple(g.tolist()))
            found = self._ids.get(unit_key)
            if found is None:
                found = len(self.unit)
                self.unit.append(g)
                self.weights.append(_step_weights(g))
                self.allowed.append(_directional_steps(g))
                self._ids[unit_key] = found
        if key is not None:
            self._ids[key] = found
        return found


def _ndim_of(gravity, answer) -> int:
    """3 for a 3-vector load direction or an answer nested three deep, else 2."""
    try:
        if gravity is not None and np.size(gravity) == 3:
            return 3
    except (TypeError, ValueError):  # ragged nonsense: an unusable direction later
        pass
    return grid_ndim(answer)


def static_metrics_batch(
    output_grids: Sequence,
    gt_grids: Sequence,
    input_grids: Sequence | None = None,
    gravity_dirs: Sequence | None = None,
) -> list[StaticMetrics]:
    """The static metrics of many completions; never raises for a bad record.

    Records of one grid shape are scored together; answers and inputs given
    as the same text are read once.  A record with an unusable answer or
    load direction, or an invalid output, gets the invalid scores (see the
    module docstring).  The grids come in the order of
    :func:`sphyr_jax.scoring.metrics.get_structural_metrics`: output, answer,
    input.

    Args:
        output_grids: the completions (raw model text or token lists).
        gt_grids: the dataset answers (text or token lists).
        input_grids: the masked inputs (text, such as a prompt, or token
            lists; None: no difficulty), one per record; None: none at all.
        gravity_dirs: load directions, (row, col) or (layer, row, col) for
            voxel grids, one per record; None: down for every record.

    Returns:
        One :class:`StaticMetrics` per record, in order.
    """
    count = len(gt_grids)
    if input_grids is None:
        input_grids = [None] * count
    if len(input_grids) != count or len(output_grids) != count:
        raise ValueError("output_grids, gt_grids and input_grids must have one entry per record")
    if gravity_dirs is None:
        gravity_dirs = [None] * count
    elif len(gravity_dirs) != count:
        raise ValueError("gravity_dirs must have one entry per record")
    table = _Tokens()
    directions = _Directions()
    records = _read_records(table, directions, input_grids, output_grids, gt_grids,
                            gravity_dirs)
    results = [StaticMetrics() for _ in range(count)]
    by_shape: dict[tuple, list[int]] = {}
    for i, rec in enumerate(records):
        if rec.shape is not None:
            by_shape.setdefault(rec.shape, []).append(i)
    for idx in by_shape.values():
        _score_shape(table, directions, [records[i] for i in idx], [results[i] for i in idx])
    return results


def _read_records(table: _Tokens, directions: _Directions, input_grids: Sequence,
                  output_grids: Sequence, gt_grids: Sequence, gravity_dirs: Sequence
                  ) -> list[_Record]:
    """Every record's grids as token ids (text read once per distinct text) and its
    direction's id; an input or output of another shape than the answer is dropped."""
    memo: dict = {}

    def encoded(grid, ndim):
        """(ids or None, shape or None) of a grid, memoised for text."""
        key = (grid, ndim) if isinstance(grid, str) else None
        if key is not None and key in memo:
            return memo[key]
        ids = table.encode(_rows(grid, ndim), ndim)
        result = (ids, None if ids is None else ids.shape)
        if key is not None:
            memo[key] = result
        return result

    records = []
    for inp, out, gt, gravity in zip(input_grids, output_grids, gt_grids, gravity_dirs,
                                     strict=True):
        ndim = _ndim_of(gravity, gt)
        answer, shape = encoded(gt, ndim)
        rec = _Record(ndim, shape, answer, direction=directions.id(gravity, ndim))
        if shape is not None:
            if inp is not None:
                ids, in_shape = encoded(inp, ndim)
                rec.inputs = ids if in_shape == shape else None
            ids, out_shape = encoded(out, ndim)
            rec.output = ids if out_shape == shape else None
        records.append(rec)
    return records


def _score_shape(table: _Tokens, directions: _Directions, records: list[_Record],
                 results: list[StaticMetrics]) -> None:
    """Fill ``results`` for records whose answers share one shape."""
    _fill_difficulty(table, records, results)
    scored, out = _valid_outputs(table, records)
    if not scored:
        return
    gt = _stack([records[j].answer for j in scored])
    agreement = _agreement(table, out, gt)
    graph = _Graph.of(table, out)
    direction = np.asarray([records[j].direction for j in scored])
    used, which = np.unique(direction, return_inverse=True)  # one grid rank: one step set
    allowed = np.stack([directions.allowed[d] for d in used])[which.reshape(-1)]
    weights = np.stack([directions.weights[d] for d in used])[which.reshape(-1)]
    directional = np.zeros(len(scored), bool)
    c = graph.connected
    if c.any():
        directional[c] = _directional(graph.solid[c], graph.load[c], graph.support[c],
                                      allowed[c])
    answer_cost = _answer_costs(table, [records[j].answer for j in scored], direction, weights)
    path_ratio = _path_ratio(graph, weights, answer_cost)
    for k, j in enumerate(scored):
        m = results[j]
        m.valid_output_grid = True
        m.exact_match = bool(agreement.n_diff[k] == 0)
        m.difference_ratio = float(agreement.difference[k])
        m.relative_difference_ratio = float(agreement.relative[k])
        m.penalized_difference_ratio = float(agreement.penalized[k])
        m.load_support_connected = bool(graph.connected[k])
        m.load_support_connected_force_directional = bool(directional[k])
        m.isolated_clusters_count = int(graph.clusters[k])
        m.force_path_cost_average_efficiency_ratio = float(path_ratio[k])
        m.difficulty_weighted_difference_ratio = m.difficulty_score * m.difference_ratio
        m.difficulty_weighted_relative_difference_ratio = (
            m.difficulty_score * m.relative_difference_ratio)


def _fill_difficulty(table: _Tokens, records: list[_Record],
                     results: list[StaticMetrics]) -> None:
    """``difficulty_score`` of every record with a usable input."""
    with_input = [j for j, r in enumerate(records) if r.inputs is not None]
    if with_input:
        difficulty = _difficulty(table, _stack([records[j].inputs for j in with_input]),
                                 _stack([records[j].answer for j in with_input]))
        for j, d in zip(with_input, difficulty, strict=True):
            results[j].difficulty_score = float(d)


def _valid_outputs(table: _Tokens, records: list[_Record]) -> tuple[list[int], np.ndarray]:
    """Positions of the records with a valid output and a usable direction, and their
    outputs' ids stacked (n, *shape)."""
    scored = [j for j, r in enumerate(records)
              if r.output is not None and r.direction is not None]
    if not scored:
        return [], np.zeros((0,))
    valid_of = table.arrays()[3]
    out = _stack([records[j].output for j in scored])
    valid = valid_of[out].reshape(len(scored), -1).all(axis=1)
    return [j for j, ok in zip(scored, valid, strict=True) if ok], out[valid]


@dataclasses.dataclass(frozen=True)
class _Agreement:
    """Per output: differing cells and the three difference ratios."""

    n_diff: np.ndarray
    difference: np.ndarray
    relative: np.ndarray
    penalized: np.ndarray


def _agreement(table: _Tokens, out: np.ndarray, gt: np.ndarray) -> _Agreement:
    """Agreement of outputs with their answers (ids, (n, *shape) each)."""
    kind, value = table.arrays()[:2]
    n = len(out)
    differs = out != gt
    n_diff = differs.reshape(n, -1).sum(axis=1)
    gt_kind = kind[gt]
    gt_sum = _row_major_sum(np.where(gt_kind == _NUMBER, value[gt], 0.0))
    numeric_pair = differs & (kind[out] == _NUMBER) & (gt_kind == _NUMBER)
    gaps = np.zeros(out.shape)
    if numeric_pair.any():
        span = len(table.tokens)
        keys = out[numeric_pair].astype(np.int64) * span + gt[numeric_pair]
        unique, inverse = np.unique(keys, return_inverse=True)
        pairs = np.stack([unique // span, unique % span], axis=1)
        gaps[numeric_pair] = _decimal_gaps(table.tokens, pairs)[inverse.reshape(-1)]
    other_pair = differs & ~numeric_pair
    relative = _row_major_sum(np.where(other_pair, 1.0, gaps))
    penalized = _row_major_sum(np.where(other_pair, MASKED_PAIR_PENALTY, gaps))
    return _Agreement(n_diff, _ratio(n_diff, gt_sum), _ratio(relative, gt_sum),
                      _ratio(penalized, gt_sum))


@dataclasses.dataclass(frozen=True)
class _Graph:
    """The outputs' solid, load and support masks, connectivity and floating clusters."""

    solid: np.ndarray
    load: np.ndarray
    support: np.ndarray
    connected: np.ndarray
    clusters: np.ndarray

    @classmethod
    def of(cls, table: _Tokens, out: np.ndarray) -> _Graph:
        kind, _, solid_of, _ = table.arrays()
        solid = solid_of[out]
        out_kind = kind[out]
        load = out_kind == _LOAD
        support = out_kind == _SUPPORT
        connected, clusters = _components(solid, load, support)
        return cls(solid, load, support, connected, clusters)


def _answer_costs(table: _Tokens, answers: list[np.ndarray], direction: np.ndarray,
                  weights: np.ndarray) -> np.ndarray:
    """Path cost of every record's answer, computed once per distinct answer and direction."""
    kind, _, solid_of, _ = table.arrays()
    first: dict[tuple, int] = {}
    rows = []
    index = []
    for k, (answer, d) in enumerate(zip(answers, direction.tolist(), strict=True)):
        key = (id(answer), d)
        if key not in first:
            first[key] = len(rows)
            rows.append(k)
        index.append(first[key])
    stacked = _stack([answers[k] for k in rows])
    stacked_kind = kind[stacked]
    return _path_costs(solid_of[stacked], stacked_kind == _LOAD, stacked_kind == _SUPPORT,
                       weights[rows])[index]


def _path_ratio(graph: _Graph, weights: np.ndarray, answer_cost: np.ndarray) -> np.ndarray:
    """``force_path_cost_average_efficiency_ratio`` of every output."""
    n = len(graph.load)
    out_cost = np.zeros(n)
    # A grid whose loads reach no support at all costs the cut-off: no search needed.
    has_both = (graph.load.reshape(n, -1).any(axis=1)
                & graph.support.reshape(n, -1).any(axis=1))
    c = graph.connected
    out_cost[has_both & ~c] = MAX_PATH_COST
    if c.any():
        out_cost[c] = _path_costs(graph.solid[c], graph.load[c], graph.support[c], weights[c])
    safe = np.where(out_cost > 0.0, out_cost, 1.0)
    return np.where(out_cost > 0.0, np.clip(answer_cost / safe, 0.0, 1.0), 0.0)


def static_metrics(output_grid, gt_grid, input_grid=None,
                   gravity_dir=DEFAULT_GRAVITY) -> StaticMetrics:
    """The static metrics of one completion (see :func:`static_metrics_batch`).

    Args:
        output_grid: the completion (raw model text or token lists).
        gt_grid: the dataset answer.
        input_grid: the masked input (text such as the prompt, or token
            lists); None: no difficulty score.
        gravity_dir: the load direction, (row, col), or (layer, row, col) for
            a voxel grid.

    Returns:
        :class:`StaticMetrics`.
    """
    return static_metrics_batch([output_grid], [gt_grid], [input_grid], [gravity_dir])[0]


def force_path_cost(grid, gravity_dir=DEFAULT_GRAVITY) -> float:
    """$\\mathrm{cost}$ of one grid: the mean over its ``L`` cells of the cheapest
    path to an ``S`` (see the module docstring; 0 without ``L`` or ``S``).

    Args:
        grid: text or token lists (layers of rows with a 3-vector direction).
        gravity_dir: the load direction.

    Raises:
        ValueError: for a grid that is not rectangular or an unusable direction.
    """
    ndim = _ndim_of(gravity_dir, grid)
    g = _unit_gravity(gravity_dir, ndim)
    if g is None:
        raise ValueError(f"unusable load direction {gravity_dir!r}")
    table = _Tokens()
    ids = table.encode(_rows(grid, ndim), ndim)
    if ids is None:
        raise ValueError("the grid is empty or not rectangular")
    kind, _, solid, _ = table.arrays()
    return float(_path_costs(solid[ids][None], (kind[ids] == _LOAD)[None],
                             (kind[ids] == _SUPPORT)[None], _step_weights(g)[None])[0])
