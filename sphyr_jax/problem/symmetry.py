"""Symmetries of a SPhyR problem: quarter turns and mirrors of a grid with its load.

Turning a grid by a quarter turn (``np.rot90``: counter-clockwise on the
printed grid) together with its load direction, or mirroring both, gives an
equivalent problem: the same structure, the same compliance, the same optimum
up to the optimiser's tie-breaking.  The published rotated result folders are
such turns of the canonical data (loads on the top edge, supports on the bottom
edge, gravity down): ``<model>_<n>_rotations`` holds the records turned
*clockwise* n times, i.e. ``np.rot90(grid, k)`` with ``k = (4 - n) % 4``.

Directions are (row, col) steps, row down and col right.  A counter-clockwise
quarter turn maps a step (r, c) to (-c, r): down (1, 0) -> right (0, 1) ->
up (-1, 0) -> left (0, -1).

Grid functions work on text or token grids and return token rows; array
functions (:func:`turn_planes`, :func:`mirror_planes`, :func:`transform_planes`)
act on the last two axes and take traced turn counts, so a batch of problems
can be turned by different amounts inside one compiled call.

The eight symmetries of a square grid (the dihedral group $D_4$) are written
``(mirror, k)``: mirror left-right first when ``mirror`` is set, then turn by k
counter-clockwise quarter turns; ``(True, 1)`` is the transpose (the
reflection across the main diagonal).  A rectangular grid keeps the four
with an even k.  :func:`canonical_element` picks, for a load direction, the
symmetry taking it into the fundamental sector $r \\ge c \\ge 0$ (an axis
direction to down, a diagonal to down-right), and :func:`stabiliser` the
reflection that leaves that canonical direction unchanged: averaging a map
over it makes the map exactly equivariant (see
:class:`sphyr_jax.training.model.DensityNet`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Shaped

from sphyr_jax.problem.grids import as_grid, check_rectangular

Axis = Literal[0, 1]
"""A mirror axis, as ``np.flip`` takes it: 0 up-down, 1 left-right."""

DOWN = (1, 0)
AXIS_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))  # k counter-clockwise turns of down
DIAGONAL_DIRECTIONS = ((1, 1), (-1, 1), (-1, -1), (1, -1))  # k counter-clockwise turns of (1, 1)
ELEMENTS = tuple((m, k) for m in (False, True) for k in range(4))
"""The eight symmetries of the square as ``(mirror, k)`` (see the module docstring)."""
ROTATION_TAGS = {1: "3_rotations", 2: "2_rotations", 3: "1_rotations"}  # k -> folder tag


def turn_direction(direction, k: int) -> tuple[float, float]:
    """A (row, col) step turned by k counter-clockwise quarter turns (``np.rot90``)."""
    r, c = (float(v) for v in direction)
    for _ in range(int(k) % 4):
        r, c = -c, r
    return (r + 0.0, c + 0.0)  # no negative zeros


def mirror_direction(direction, axis: Axis) -> tuple[float, float]:
    """A (row, col) step mirrored like ``np.flip(grid, axis)`` (0: up-down, 1: left-right)."""
    r, c = (float(v) for v in direction)
    out = (-r, c) if axis == 0 else (r, -c)
    return (out[0] + 0.0, out[1] + 0.0)


def canonical_turns(direction) -> int:
    """Counter-clockwise turns k taking down to the axis direction nearest ``direction``.

    ``np.rot90(grid, -k)`` (with the direction turned by -k) brings a problem
    into the canonical frame, gravity down.  Ties go to the lower k.
    """
    g = np.asarray(direction, np.float64)
    return int(np.argmax([g @ np.asarray(d, np.float64) for d in AXIS_DIRECTIONS]))


def rotation_tag(k: int) -> str:
    """Folder tag (``"1_rotations"`` ...) of data turned k times counter-clockwise; '' for 0."""
    return ROTATION_TAGS.get(int(k) % 4, "")


def turn_grid(grid, k: int) -> list[list[str]]:
    """A text or token grid turned by k counter-clockwise quarter turns (token rows)."""
    tokens = as_grid(grid)
    check_rectangular(tokens)
    return np.rot90(np.array(tokens, dtype=object), int(k) % 4).tolist()


def mirror_grid(grid, axis: Axis) -> list[list[str]]:
    """A text or token grid mirrored like ``np.flip(grid, axis)`` (token rows)."""
    tokens = as_grid(grid)
    check_rectangular(tokens)
    return np.flip(np.array(tokens, dtype=object), axis).tolist()


def transform_record(record: dict, k: int = 0, *, mirror: Axis | None = None) -> dict:
    """A dataset record mirrored (optional, first) then turned, with its ``gravity_dir``.

    Args:
        record: ``{"input_grid", "ground_truth"}`` (+ ``"gravity_dir"``, default
            down; other keys are kept).
        k: counter-clockwise quarter turns.
        mirror: None, or the axis of a mirror applied before the turn.

    Returns:
        A new record with token-list grids and an integer ``gravity_dir``.
    """
    out = dict(record)
    g = tuple(record.get("gravity_dir") or DOWN)
    for key in ("input_grid", "ground_truth"):
        if record.get(key) is not None:
            grid = mirror_grid(record[key], mirror) if mirror is not None else as_grid(record[key])
            out[key] = turn_grid(grid, k)
    if mirror is not None:
        g = mirror_direction(g, mirror)
    g = turn_direction(g, k)
    out["gravity_dir"] = [int(v) if float(v).is_integer() else float(v) for v in g]
    return out


def turn_records(records: Sequence[dict], k: int) -> list[dict]:
    """Every record turned by k counter-clockwise quarter turns (see :func:`transform_record`)."""
    return [transform_record(r, k) for r in records]


def turn_planes(x: Shaped[Array, "*batch h w"], k: Int[ArrayLike, ""]
                ) -> Shaped[Array, "*batch h w"]:
    """``np.rot90(x, k, axes=(-2, -1))`` with a traced k (square planes for odd k).

    Args:
        x: (..., n, n) array (any trailing square planes; (..., h, w) when every
            k is even).
        k: integer counter-clockwise turns (traced or static).
    """
    if x.shape[-1] != x.shape[-2]:
        branches = [lambda a: a, lambda a: jnp.rot90(a, 2, axes=(-2, -1))]
        return jax.lax.switch((jnp.asarray(k) % 4) // 2, branches, x)
    branches = [lambda a, i=i: jnp.rot90(a, i, axes=(-2, -1)) for i in range(4)]
    return jax.lax.switch(jnp.asarray(k) % 4, branches, x)


def turn_vector(g: Float[Array, "*batch 2"], k: Int[ArrayLike, "*#batch"]
                ) -> Float[Array, "*batch 2"]:
    """(row, col) step(s) (..., 2) turned by traced k counter-clockwise quarter turns."""
    k = jnp.asarray(k) % 4
    r, c = g[..., 0], g[..., 1]
    cos = jnp.asarray([1.0, 0.0, -1.0, 0.0])[k]
    sin = jnp.asarray([0.0, 1.0, 0.0, -1.0])[k]
    return jnp.stack([cos * r - sin * c, sin * r + cos * c], axis=-1)


def mirror_planes(x: Shaped[Array, "*batch h w"], flip: Bool[ArrayLike, ""]
                  ) -> Shaped[Array, "*batch h w"]:
    """Planes (..., h, w) mirrored left-right where the traced flag ``flip`` is true."""
    return jnp.where(flip, jnp.flip(x, axis=-1), x)


def transform_planes(x: Shaped[Array, "*batch h w"], mirror: Bool[ArrayLike, ""],
                     k: Int[ArrayLike, ""]) -> Shaped[Array, "*batch h w"]:
    """Planes mirrored left-right where ``mirror`` (traced) is set, then turned by k.

    Args:
        x: (..., n, n) planes ((..., h, w) when every k is even).
        mirror: traced flag.
        k: traced counter-clockwise quarter turns.
    """
    return turn_planes(mirror_planes(x, mirror), k)


def transform_vector(g: Float[Array, "*batch 2"], mirror: Bool[ArrayLike, "*#batch"],
                     k: Int[ArrayLike, "*#batch"]) -> Float[Array, "*batch 2"]:
    """(row, col) step(s) under the symmetry ``(mirror, k)``: column negated, then turned."""
    g = jnp.asarray(g)
    g = jnp.stack([g[..., 0], jnp.where(mirror, -g[..., 1], g[..., 1])], axis=-1)
    return turn_vector(g, k)


def inverse_element(mirror: Bool[ArrayLike, ""], k: Int[ArrayLike, ""]):
    """The symmetry undoing ``(mirror, k)``: a reflection is its own inverse, a turn by k
    is undone by -k."""
    k = jnp.asarray(k) % 4
    return jnp.asarray(mirror), jnp.where(mirror, k, (4 - k) % 4)


def _group(square: bool):
    """(mirror flags, turn counts) of the symmetries of a square (8) or rectangular (4) grid."""
    elements = [(m, k) for m, k in ELEMENTS if square or k % 2 == 0]
    return (jnp.asarray([m for m, _ in elements]), jnp.asarray([k for _, k in elements]))


def canonical_element(g: Float[Array, " 2"], *, square: bool = True):
    """The symmetry ``(mirror, k)`` taking a load direction into the canonical sector.

    On a square grid the sector is $r \\ge c \\ge 0$ (between down and
    down-right): an axis direction goes to down (1, 0), a diagonal to
    down-right; on a rectangular grid (half turns and mirrors only) it is the
    quadrant $r \\ge 0, c \\ge 0$.  Every direction has exactly one image in the
    sector; when several symmetries reach it (the direction lies on the
    sector's edge), the first of :data:`ELEMENTS` is taken, and
    :func:`stabiliser` names the other.

    Args:
        g: (2,) (row, col) direction (traced).
        square: whether the grid is square (static).

    Returns:
        (mirror, k) as traced scalars.
    """
    mirrors, turns = _group(square)
    images = transform_vector(jnp.broadcast_to(g, (len(turns), 2)), mirrors, turns)
    r, c = images[:, 0], images[:, 1]
    inside = (r >= c) & (c >= 0) if square else (r >= 0) & (c >= 0)
    pick = jnp.argmax(inside)
    return mirrors[pick], turns[pick]


def stabiliser(g: Float[Array, " 2"], *, square: bool = True):
    """The reflection ``(mirror, k)`` that leaves a canonical direction unchanged.

    Down (1, 0) is kept by the left-right mirror ``(True, 0)``, down-right by
    the transpose ``(True, 1)``; on a rectangular grid right (0, 1) is kept by
    the up-down mirror ``(True, 2)``.  Any other canonical direction is kept
    by the identity only: ``(False, 0)`` is returned.

    Args:
        g: (2,) a direction in the canonical sector (see :func:`canonical_element`).
        square: whether the grid is square (static).
    """
    r, c = g[0], g[1]
    if square:
        on_axis, on_diagonal = c == 0, (r == c) & (c != 0)
        mirror = on_axis | on_diagonal
        k = jnp.where(on_diagonal, 1, 0)
    else:
        on_column, on_row = c == 0, (r == 0) & (c != 0)
        mirror = on_column | on_row
        k = jnp.where(on_row, 2, 0)
    return mirror, k
