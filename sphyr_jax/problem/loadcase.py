"""Load cases: the boundary conditions of one sample as fixed-shape arrays.

A :class:`LoadCase` holds everything that varies between samples of one grid
shape as arrays (masks, pinned densities, force vector, free-DOF mask, load
direction, material budget), so load cases of one shape stack into a batch and
one compiled function serves them all.  DOF conventions:
:mod:`sphyr_jax.fem.structured` (node ``n`` owns DOFs ``d n + k``, in any dimension).

3D load cases have the same fields with a third grid axis: masks (nz, ny, nx)
in printed order (layer 0 on top), ``3 (nz+1)(ny+1)(nx+1)`` DOFs and a
3-vector ``gravity`` in (layer, row, col) steps, down = (1, 0, 0).  The
dimension of a load case is the length of its ``gravity``.
"""

from __future__ import annotations

import math
import numbers
import pathlib
from collections.abc import Mapping, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from sphyr_jax.problem.grids import (
    GridDim,
    InvalidProblemError,
    as_grid,
    check_rectangular,
    densities_from_grid,
    token_masks,
)

DEFAULT_GRAVITY = (1.0, 0.0)
DEFAULT_GRAVITY_3D = (1.0, 0.0, 0.0)

_ROTATION_GRAVITY = (
    ("3_rotations", (0.0, 1.0)),
    ("2_rotations", (-1.0, 0.0)),
    ("1_rotations", (0.0, -1.0)),
)


class LoadCase(eqx.Module):
    """Boundary conditions of one sample (or a batch: leading axes on every field).

    Shapes: ``shape`` is the batch shape followed by the grid's, ``(..., nely,
    nelx)`` (``(..., nz, ny, nx)`` in 3D).

    Attributes:
        load_mask: (..., nely, nelx) bool, ``L`` cells.
        support_mask: (..., nely, nelx) bool, ``S`` cells.
        design_mask: (..., nely, nelx) bool, cells the optimiser may change.
        pinned: (..., nely, nelx) float64, ground-truth densities (L/S solid);
            the value every non-design cell keeps.
        force: (..., n_dofs) float64, nodal load vector (zero on fixed DOFs).
        free_dofs: (..., n_dofs) bool.
        gravity: (..., 2) float64, unit load direction as a (row, col) step;
            (..., 3) as a (layer, row, col) step for 3D load cases, whose
            masks are (..., nz, ny, nx).
        volume_fraction: (...) float64, ground-truth volume fraction (the budget).
    """

    load_mask: Bool[Array, "*shape"]
    support_mask: Bool[Array, "*shape"]
    design_mask: Bool[Array, "*shape"]
    pinned: Float[Array, "*shape"]
    force: Float[Array, "*batch dofs"]
    free_dofs: Bool[Array, "*batch dofs"]
    gravity: Float[Array, "*batch dim"]
    volume_fraction: Float[Array, "*batch"]

    @property
    def ndim(self) -> int:
        """Spatial dimension: 2, or 3 for voxel load cases."""
        return int(np.shape(self.gravity)[-1])

    @property
    def shape(self) -> tuple[int, ...]:
        """Grid shape (nely, nelx), or (nz, ny, nx) in 3D."""
        return tuple(self.load_mask.shape[-self.ndim :])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.load_mask.shape[: -self.ndim])

    @property
    def structural_mask(self) -> jax.Array:
        return self.load_mask | self.support_mask


def gravity_from_folder(name: str) -> tuple[float, float]:
    """Load direction (row, col) encoded in a results folder name.

    ``3_rotations`` -> (0, 1), ``2_rotations`` -> (-1, 0), ``1_rotations`` ->
    (0, -1), anything else -> (1, 0) (down).
    """
    for key, direction in _ROTATION_GRAVITY:
        if key in name:
            return direction
    return DEFAULT_GRAVITY


_DIRECTION_WORDS = {
    (1, 0): "straight down", (-1, 0): "straight up", (0, 1): "to the right",
    (0, -1): "to the left", (1, 1): "down and to the right", (1, -1): "down and to the left",
    (-1, 1): "up and to the right", (-1, -1): "up and to the left",
}


def check_gravity(value, *, ndim: GridDim | None = 2) -> tuple[float, ...]:
    """A load direction as stored in a record, checked: ``ndim`` finite numbers, not all zero.

    Args:
        value: a list or tuple (or 1-D array) of numbers, e.g. ``[1, -1]``.
        ndim: 2 ((row, col)), 3 ((layer, row, col)) or None (either).

    Returns:
        The numbers as floats (not normalised).

    Raises:
        InvalidProblemError: for anything else (a string, a ragged or nested
            list, a boolean or other non-number, NaN or infinity, the wrong
            length, the zero vector).
    """
    sizes = (2, 3) if ndim is None else (ndim,)
    what = " or ".join({2: "a [row, col] pair", 3: "a [layer, row, col] triple"}[n]
                       for n in sizes)
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    ok = (isinstance(value, (list, tuple)) and len(value) in sizes
          and all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))
                  for v in value))
    if not ok:
        raise InvalidProblemError(f"gravity_dir must be {what} of numbers, got {value!r}")
    out = tuple(float(v) for v in value)
    if not all(math.isfinite(v) for v in out):
        raise InvalidProblemError(f"gravity_dir must be finite, got {value!r}")
    if not any(out):
        raise InvalidProblemError(f"gravity_dir must be non-zero, got {value!r}")
    return out


def record_gravity(record, folder=None, *, ndim: GridDim | None = 2) -> tuple[float, ...]:
    """The load direction of a dataset or results record.

    The rule every consumer follows: the record's own ``gravity_dir``; else
    the direction its results folder's name encodes
    (:func:`gravity_from_folder`, 2D only); else down.

    Args:
        record: a mapping (dataset record or results record).
        folder: optional results folder (a name or a path; its last part is read).
        ndim: 2 or 3 (grid axes), or None (a stored 2- or 3-vector is taken as
            it is; without one, the 2D rule applies, whose down also means
            down on voxel grids, see :func:`unless_2d_default`).

    Returns:
        The direction as floats, (row, col) or (layer, row, col), not normalised.

    Raises:
        InvalidProblemError: the record is not a mapping, or its
            ``gravity_dir`` is malformed (see :func:`check_gravity`).
    """
    if not isinstance(record, Mapping):
        raise InvalidProblemError(f"a record must be a mapping, got {type(record).__name__}")
    value = record.get("gravity_dir")
    if value is not None:
        return check_gravity(value, ndim=ndim)
    if ndim == 3:
        return DEFAULT_GRAVITY_3D
    if folder is not None:
        return gravity_from_folder(pathlib.PurePath(folder).name)
    return DEFAULT_GRAVITY


def direction_words(gravity_dir) -> str:
    """Plain words for a (row, col) load direction along an axis or a diagonal.

    ``(1, 0)`` -> ``"straight down"``, ``(-1, 1)`` -> ``"up and to the right"``
    (rows grow downwards, columns to the right); any positive multiple of the
    eight steps has the same words.

    Raises:
        InvalidProblemError: a malformed direction, or one that is neither an
            axis nor a diagonal.
    """
    r, c = check_gravity(gravity_dir, ndim=2)
    if r and c and not math.isclose(abs(r), abs(c), rel_tol=1e-9):
        raise InvalidProblemError(
            f"no words for load direction {list(gravity_dir)!r}: only the axes and the "
            "diagonals have names")
    return _DIRECTION_WORDS[(int(np.sign(r)), int(np.sign(c)))]


def unless_2d_default(gravity_dir, ndim: GridDim):
    """``gravity_dir`` for a grid of ``ndim`` axes, None (down) for the 2D default on voxels.

    Records, folders and callers without a direction pass the 2D default
    (1, 0); on a voxel grid that means down.  Any other direction is returned
    as given (a 2D one is then rejected by :func:`normalise_gravity`).
    """
    if (ndim == 3 and gravity_dir is not None and np.size(gravity_dir) == 2
            and tuple(np.ravel(gravity_dir)) == DEFAULT_GRAVITY):
        return None
    return gravity_dir


def normalise_gravity(gravity_dir, *, ndim: GridDim = 2) -> Float[np.ndarray, " dim"]:
    """Unit (row, col) direction — (layer, row, col) for ``ndim=3`` —; raises
    InvalidProblemError if unusable."""
    count = {2: "two", 3: "three"}[ndim]
    try:
        g = np.asarray(gravity_dir, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidProblemError(
            f"gravity_dir must be {count} numbers, got {gravity_dir!r}") from exc
    if g.shape != (ndim,) or not np.all(np.isfinite(g)):
        raise InvalidProblemError(
            f"gravity_dir must be {count} finite numbers, got {gravity_dir!r}")
    norm = math.hypot(*g)
    if norm == 0.0:
        raise InvalidProblemError("gravity_dir must be non-zero")
    return g / norm


def force_vector(load_mask: Bool[np.ndarray, "*cells"], gravity: Float[np.ndarray, " dim"]
                 ) -> Float[np.ndarray, " dofs"]:
    """Unit resultant split equally over the four nodes of every load cell.

    Each load cell gives $1 / (4 n_L)$ to each of its nodes (shared nodes
    accumulate): $f_{2v} \\mathrel{+}= \\text{share}\\, g_{col}$,
    $f_{2v+1} \\mathrel{+}= \\text{share}\\, g_{row}$.  In 3D every load
    voxel gives $1 / (8 n_L)$ to each of its 8 nodes and
    $f_{3v + k} \\mathrel{+}= \\text{share}\\, g_{2 - k}$ (component k along
    grid axis 2 - k: column, row, layer).
    """
    if np.ndim(load_mask) == 3:
        return _force_vector_nd(np.asarray(load_mask, bool), np.asarray(gravity, np.float64))
    nely, nelx = load_mask.shape
    count = int(load_mask.sum())
    node_share = np.zeros((nely + 1, nelx + 1))
    if count:
        share = 1.0 / (4.0 * count)
        cells = load_mask.astype(np.float64) * share
        for dr in (0, 1):
            for dc in (0, 1):
                node_share[dr : dr + nely, dc : dc + nelx] += cells
    f = np.zeros(((nely + 1) * (nelx + 1), 2))
    f[:, 0] = node_share.reshape(-1) * gravity[1]
    f[:, 1] = node_share.reshape(-1) * gravity[0]
    return f.reshape(-1)


def free_dof_mask(support_mask: Bool[np.ndarray, "*cells"]) -> Bool[np.ndarray, " dofs"]:
    """False on both DOFs of all four nodes of every support cell (in 3D: all
    three DOFs of all eight nodes of every support voxel)."""
    if np.ndim(support_mask) == 3:
        fixed = _node_any(np.asarray(support_mask, bool))
        return np.repeat(~fixed.reshape(-1), 3)
    nely, nelx = support_mask.shape
    fixed_nodes = np.zeros((nely + 1, nelx + 1), dtype=bool)
    for dr in (0, 1):
        for dc in (0, 1):
            fixed_nodes[dr : dr + nely, dc : dc + nelx] |= support_mask
    return np.repeat(~fixed_nodes.reshape(-1), 2)


def design_mask_from_input(input_grid, shape: tuple[int, ...],
                           structural: Bool[np.ndarray, "*cells"], *,
                           ndim: GridDim | None = None) -> Bool[np.ndarray, "*cells"]:
    """``V`` cells of the input grid; all non-L/S cells if it is missing or misfits."""
    mask = None
    if input_grid is not None:
        try:
            grid = as_grid(input_grid, ndim=ndim if ndim is not None else len(shape))
            if check_rectangular(grid, what="input grid") == tuple(shape):
                mask = token_masks(grid)[2]
        except InvalidProblemError:
            mask = None
    if mask is None:
        mask = np.ones(shape, dtype=bool)
    return mask & ~structural


def load_case_from_grid(
    gt_grid, input_grid=None, gravity_dir=None, *, ndim: GridDim | None = None
) -> LoadCase:
    """Boundary conditions of a sample, read from its ground-truth grid.

    Args:
        gt_grid: ground truth, as text or token lists.  Its ``L``/``S`` cells
            define the load and supports; its densities are the pinned values.
        input_grid: the masked input grid; its ``V`` cells (minus L/S) form the
            design region.  If missing or of another shape, every non-L/S cell
            is a design cell.
        gravity_dir: load direction as a (row, col) step — (layer, row, col)
            in 3D —, normalised; None means down ((1, 0) or (1, 0, 0)).
        ndim: 2 or 3; None: 3 for nested lists three deep, else 2 (text is
            read as 2D unless ``ndim=3``).

    Returns:
        A :class:`LoadCase` of NumPy float64/bool arrays (a valid JAX PyTree).

    Raises:
        InvalidProblemError: empty or ragged grid, no ``L`` cell, no ``S`` cell,
            or an unusable gravity direction.
    """
    grid = as_grid(gt_grid, ndim=ndim)
    shape = check_rectangular(grid, what="ground-truth grid")
    dim = len(shape)
    if gravity_dir is None:
        gravity_dir = DEFAULT_GRAVITY_3D if dim == 3 else DEFAULT_GRAVITY
    load, support, _ = token_masks(grid)
    if not load.any():
        raise InvalidProblemError("ground-truth grid contains no load ('L') cells")
    if not support.any():
        raise InvalidProblemError("ground-truth grid contains no support ('S') cells")
    gravity = normalise_gravity(gravity_dir, ndim=dim)
    pinned, _ = densities_from_grid(grid)
    design = design_mask_from_input(input_grid, shape, load | support, ndim=dim)
    free = free_dof_mask(support)
    force = force_vector(load, gravity) * free
    return LoadCase(
        load_mask=load,
        support_mask=support,
        design_mask=design,
        pinned=pinned,
        force=force,
        free_dofs=free,
        gravity=gravity,
        volume_fraction=np.float64(pinned.mean()),
    )


def stack_load_cases(cases: Sequence[LoadCase]) -> LoadCase:
    """Stack load cases of one grid shape along a new leading axis (NumPy)."""
    if not cases:
        raise ValueError("no load cases to stack")
    shapes = {c.shape for c in cases}
    if len(shapes) != 1:
        raise ValueError(f"load cases have different grid shapes: {sorted(shapes)}")
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *cases)


def index_load_case(case: LoadCase, index) -> LoadCase:
    """Select entries of a batched load case."""
    return jax.tree.map(lambda x: x[index], case)


def with_budget(case: LoadCase, volume_fraction: Float[ArrayLike, "*batch"]) -> LoadCase:
    """The same load case with another material budget."""
    return eqx.tree_at(lambda c: c.volume_fraction, case,
                       jnp.asarray(volume_fraction, dtype=jnp.float64)
                       if isinstance(case.volume_fraction, jax.Array)
                       else np.asarray(volume_fraction, dtype=np.float64))


def fix_samples(case: LoadCase, keep: Bool[ArrayLike, " batch"]) -> LoadCase:
    """Batched load cases with every DOF of the samples not ``keep`` (B,) fixed.

    Such a sample's system is the identity with a zero load: solvers skip it
    (the host factorisation) or stop at once (CG), so samples a batch carries
    but no longer needs cost no solve.
    """
    return eqx.tree_at(lambda c: c.free_dofs, case, case.free_dofs & keep[:, None])


def _node_any(cells: np.ndarray) -> np.ndarray:
    """Nodes touching at least one marked cell, (*cells + 1)."""
    out = np.zeros(tuple(n + 1 for n in cells.shape), dtype=bool)
    for off in np.ndindex(*(2,) * cells.ndim):
        out[tuple(slice(o, o + n) for o, n in zip(off, cells.shape, strict=True))] |= cells
    return out


def _force_vector_nd(load_mask: np.ndarray, gravity: np.ndarray) -> np.ndarray:
    """Dimension-generic :func:`force_vector` (used for 3D)."""
    dim = load_mask.ndim
    count = int(load_mask.sum())
    node_share = np.zeros(tuple(n + 1 for n in load_mask.shape))
    if count:
        cells = load_mask.astype(np.float64) / (2**dim * count)
        for off in np.ndindex(*(2,) * dim):
            node_share[tuple(slice(o, o + n)
                             for o, n in zip(off, load_mask.shape, strict=True))] += cells
    f = node_share.reshape(-1, 1) * gravity[::-1][None, :]
    return f.reshape(-1)
