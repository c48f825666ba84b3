"""Text <-> token grids <-> density arrays.

An SPhyR grid is a rectangle of tokens: ``L`` (load), ``S`` (support), ``V``
(masked, to be filled in) and densities (``0``/``1`` in the easy subjects,
``0.0`` .. ``1.0`` in the hard ones).  Grids travel as text (rows on lines,
cells separated by spaces) or as lists of token lists; model completions are
raw text with code fences, prose and the occasional malformed row.

Conventions: row 0 is the first printed row (the top of the structure).
A 3D grid is a list of layers, layer 0 the top one (z = nz - 1) down to the
support layer (z = 0); each layer is a 2D grid (row 0 at y = ny - 1); in text,
layers are separated by one blank line.  Functions taking text accept
``ndim=3`` to read it as layers; nested lists three deep are recognised as 3D.
Numbers are ASCII decimal literals only (``0``, ``0.5``, ``1e-3``); anything
else in a cell (``nan``, ``inf``, full-width digits, words) is unparsable.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import re
from typing import Literal

import numpy as np
from jaxtyping import ArrayLike, Bool, Float

from sphyr_jax.errors import UserInputError

LOAD = "L"
SUPPORT = "S"
MASK = "V"
STRUCTURAL = (LOAD, SUPPORT)

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
_SEPARATORS = re.compile(r"[\s,|;]+")
_STRIP = "[](){}'\"`"
_PLAIN_CHARS = frozenset("LSV0123456789.")
_PLAIN_LINE = re.compile(r"[0-9.LVS]+(?:\s+[0-9.LVS]+)*")

Grid = list  # list[list[str]]
GridDim = Literal[2, 3]
"""Grid axes: 2 (rows, columns) or 3 (layers, rows, columns)."""


class InvalidProblemError(UserInputError):
    """A grid that does not describe a solvable structural problem."""


@dataclasses.dataclass(frozen=True)
class GridReport:
    """Bookkeeping of a grid -> densities conversion."""

    unfilled_cells: int = 0
    unparsable_cells: int = 0

    def __getitem__(self, key: str) -> int:  # dict-style access, as in results files
        return getattr(self, key)


_MEMO_CHARS = 32  # tokens up to this long are read once and remembered
_MAX_TOKEN_CHARS = 24  # a line with a longer token is not a grid row


@functools.lru_cache(maxsize=1 << 16)
def _text_value(token: str) -> float | None:
    token = token.strip()
    if not _NUMBER.fullmatch(token):
        return None
    return float(token)  # may overflow to inf; callers clip


@functools.lru_cache(maxsize=1 << 16)
def _is_cell_text(token: str) -> bool:
    return token.strip() in (LOAD, SUPPORT, MASK) or _text_value(token) is not None


def parse_number(token) -> float | None:
    """The value of a density token, or None if it is not an ASCII decimal number."""
    if isinstance(token, str):  # the common case; short tokens are remembered
        return _text_value(token) if len(token) <= _MEMO_CHARS else _text_value.__wrapped__(token)
    if isinstance(token, bool):
        return None
    if isinstance(token, (int, float, np.integer, np.floating)):
        try:
            value = float(token)
        except OverflowError:  # a Python int beyond the float range
            return math.inf if token > 0 else -math.inf
        return None if math.isnan(value) else value
    return None


def is_cell_token(token) -> bool:
    """Whether a token is a well-formed cell: L, S, V or a number."""
    if isinstance(token, str):
        return _is_cell_text(token) if len(token) <= _MEMO_CHARS else (
            _is_cell_text.__wrapped__(token))
    return parse_number(token) is not None


def _split_row(line: str) -> list[str]:
    tokens = [t.strip(_STRIP) for t in _SEPARATORS.split(line.strip().strip(_STRIP))]
    return [t for t in tokens if t]


def _is_grid_line(tokens: list[str]) -> bool:
    if not tokens:
        return False
    good = sum(map(is_cell_token, tokens))
    return 2 * good >= len(tokens) and max(map(len, tokens)) <= _MAX_TOKEN_CHARS


def _normalise_text(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if "\n" not in text and "\\n" in text:
        text = text.replace("\\r\\n", "\n").replace("\\n", "\n")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _cell_text(token) -> str:
    try:
        return str(token).strip()
    except ValueError:  # e.g. an int too long for str(); unparsable
        return "?"


def _from_nested(value) -> Grid | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if all(isinstance(row, (list, tuple)) for row in value):
        return [[t.strip() if type(t) is str else _cell_text(t) for t in row] for row in value]
    if all(isinstance(row, str) for row in value):
        return [_split_row(row) for row in value]
    return None


def _flush(found: list[Grid], subs: list[list[list[str]]]) -> None:
    subs = [s for s in subs if s]
    if len(subs) > 1 and all(len(s) == 1 for s in subs):
        found.append([s[0] for s in subs])  # double-spaced rows
    else:
        found.extend(subs)


def _candidates(text: str) -> list[Grid]:
    """Grid-like blocks of the text, in order of appearance."""
    found: list[Grid] = []
    for segment in _FENCE.split(text):
        subs: list[list[list[str]]] = [[]]  # sub-blocks separated by blank lines
        for line in segment.split("\n"):
            if not line.strip():
                subs.append([])
                continue
            tokens = _split_row(line)
            if _is_grid_line(tokens):
                subs[-1].append(tokens)
            else:
                _flush(found, subs)
                subs = [[]]
        _flush(found, subs)
    return found


def _is_rectangular(grid: Grid) -> bool:
    return bool(grid) and bool(grid[0]) and all(len(r) == len(grid[0]) for r in grid)


def plain_grid(text: str) -> Grid | None:
    """Token rows of a clean text grid, read fast; None for anything else.

    Clean is what the project itself writes (dataset answers, the grid of a
    prompt): rows on lines, cells separated by whitespace, every cell ``L``,
    ``S``, ``V`` or a plain decimal number (digits and ``.``), every row as
    long as the first (surrounding blank space is ignored).  Anything else (a
    code fence, prose, commas, a blank line between rows, a ragged row, a
    carriage return) gives None: read such text with :func:`extract_grid`.
    Whenever this returns rows, :func:`extract_grid` returns the same rows.

    Args:
        text: the text.

    Returns:
        The grid as token rows, or None.
    """
    if "\r" in text:
        return None
    rows = [line.split() for line in text.strip().split("\n")]
    width = len(rows[0])
    if width == 0 or any(len(r) != width for r in rows):
        return None
    for token in {t for r in rows for t in r}:  # few distinct tokens: each checked once
        if (len(token) > _MAX_TOKEN_CHARS or not _PLAIN_CHARS.issuperset(token)
                or not _is_cell_text(token)):
            return None
    return rows


def last_plain_lines(text: str) -> list[str]:
    """The lines of the last block of plain grid lines of a text (the published reader).

    A plain line holds only whitespace-separated tokens made of digits, ``.``,
    ``L``, ``V`` and ``S``; a blank line, a code fence or a line of prose ends
    a block.  This is how the published benchmark reads a grid out of a model's
    reply for its static metrics (:mod:`sphyr_jax.scoring.static`); it finds
    fewer grids than :func:`extract_grid` (no commas, brackets or fences inside
    a block) but, on text the project wrote, the same one.

    Args:
        text: the text.

    Returns:
        The block's lines, stripped (split a line on whitespace for its
        tokens; rows may be ragged); ``[]`` when no line is plain.
    """
    block: list[str] = []
    last: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and _PLAIN_LINE.fullmatch(stripped):
            block.append(stripped)
        elif block:
            last, block = block, []
    return block or last


def extract_grid(text, *, ndim: GridDim = 2) -> Grid | None:
    """Find the grid inside raw model output.

    Handles code fences (with or without a language tag, even mid-line), prose
    before and after, trailing spaces, blank lines, double-spaced rows, commas
    or brackets around cells, JSON (or Python-literal) lists of lists, and text
    stored as an escaped Python/JSON string literal.  When several grids appear, the last
    rectangular one wins (models restate their final answer last); if none is
    rectangular the last grid-like block is returned as it is, so callers can
    report its wrong shape.

    With ``ndim=3`` the text is read as a 3D grid: layers of rows separated by
    blank lines (a short heading line such as ``Layer 2:`` may stand between
    layers); nested lists must then be three deep.  Among several 3D blocks
    the last whose layers are all rectangular and of one shape wins.

    Args:
        text: model output, or a grid already given as a list of token lists
            (or a list of row strings), which is passed through.
        ndim: 2 (default) or 3.

    Returns:
        The grid as a list of token rows (strings) — for ``ndim=3`` a list of
        layers of token rows — or None if nothing grid-like was found.
    """
    if ndim == 3:
        return _extract_grid_3d(text)
    if ndim != 2:
        raise ValueError(f"ndim must be 2 or 3, got {ndim!r}")
    return _extract(text, _from_nested, _candidates, _is_rectangular)


def as_grid(grid, *, ndim: GridDim | None = None) -> Grid:
    """Normalise text or token lists into a list of token rows (strings).

    Args:
        grid: text or nested token lists.
        ndim: 2 or 3; None reads nested lists three deep as 3D and
            everything else as 2D.

    Raises:
        InvalidProblemError: if nothing grid-like can be read.
    """
    if ndim is None:
        ndim = grid_ndim(grid)
    result = extract_grid(grid, ndim=ndim)
    if result is None:
        raise InvalidProblemError("no grid found in the input")
    return result


def check_rectangular(grid: Grid, *, what: str = "grid") -> tuple[int, ...]:
    """Shape of a token grid; raises InvalidProblemError if empty or ragged.

    A 3D grid (layers of rows) gives (nz, ny, nx).
    """
    if grid_ndim(grid) == 3:
        return _check_3d(grid, what)
    if not grid or not isinstance(grid, (list, tuple)):
        raise InvalidProblemError(f"{what} is empty")
    width = len(grid[0])
    if width == 0:
        raise InvalidProblemError(f"{what} has an empty first row")
    for i, row in enumerate(grid):
        if len(row) != width:
            raise InvalidProblemError(
                f"{what} is ragged: row {i} has {len(row)} cells, expected {width}"
            )
    return len(grid), width


def densities_from_grid(
    grid, *, mask_density: float = 0.0, ndim: GridDim | None = None
) -> tuple[Float[np.ndarray, "*cells"], GridReport]:
    """Convert a grid into a float64 density field plus a bookkeeping report.

    ``L`` and ``S`` are solid (1); numbers are clipped to [0, 1]; ``V`` cells
    take ``mask_density`` and are counted as unfilled; anything else takes
    ``mask_density`` and is counted as unparsable.

    Args:
        grid: text or token lists (layers of rows in 3D).
        mask_density: density given to masked and unparsable cells.
        ndim: 2 or 3 for text; None: 3 for nested lists three deep, else 2.

    Returns:
        (densities of shape (nely, nelx) — (nz, ny, nx) for a 3D grid —,
        GridReport).

    Raises:
        InvalidProblemError: for an empty or ragged grid.
    """
    grid = as_grid(grid, ndim=ndim)
    if grid_ndim(grid) == 3:
        _check_3d(grid, "grid")
        layers = [densities_from_grid(layer, mask_density=mask_density) for layer in grid]
        return np.stack([d for d, _ in layers]), GridReport(
            unfilled_cells=sum(r.unfilled_cells for _, r in layers),
            unparsable_cells=sum(r.unparsable_cells for _, r in layers))
    nely, nelx = check_rectangular(grid)
    flat = [t.strip() if isinstance(t, str) else t for row in grid for t in row]
    cells = {}  # each distinct token read once: (density, unfilled, unparsable)
    for t in set(flat):
        if t in STRUCTURAL:
            cells[t] = (1.0, 0, 0)
        elif t == MASK:
            cells[t] = (mask_density, 1, 0)
        else:
            value = parse_number(t)
            cells[t] = ((mask_density, 0, 1) if value is None
                        else (min(max(value, 0.0), 1.0), 0, 0))
    read = [cells[t] for t in flat]
    out = np.array([d for d, _, _ in read], dtype=np.float64).reshape(nely, nelx)
    return out, GridReport(unfilled_cells=sum(u for _, u, _ in read),
                           unparsable_cells=sum(b for _, _, b in read))


def token_masks(grid: Grid) -> tuple[Bool[np.ndarray, "*cells"], Bool[np.ndarray, "*cells"],
                                     Bool[np.ndarray, "*cells"]]:
    """Boolean (load, support, masked) arrays of a rectangular token grid (2D or 3D)."""
    if grid_ndim(grid) == 3:
        shape = _check_3d(grid, "grid")
        arr = np.array([[[str(t).strip() for t in row] for row in layer] for layer in grid],
                       dtype=object).reshape(shape)
        return arr == LOAD, arr == SUPPORT, arr == MASK
    nely, nelx = check_rectangular(grid)
    arr = np.array([[str(t).strip() for t in row] for row in grid], dtype=object)
    return arr == LOAD, arr == SUPPORT, arr == MASK


def grid_to_text(grid) -> str:
    """Rows on lines, cells separated by single spaces; 3D layers separated by a blank line."""
    if grid_ndim(grid) == 3:
        return "\n\n".join(grid_to_text(layer) for layer in grid)
    if isinstance(grid, np.ndarray) and grid.dtype.kind == "f":
        grid = [[f"{v:g}" for v in row] for row in grid]
    return "\n".join(" ".join(str(t) for t in row) for row in grid)


def format_design(densities: Float[ArrayLike, "*cells"], structural_grid: Grid, *,
                  hard: bool) -> Grid:
    """Tokens of a density field in a subject's format, keeping L/S from a grid.

    Easy subjects use ``0``/``1`` (threshold 0.5); hard ones one decimal.
    A 3D density field (nz, ny, nx) with a 3D grid gives a list of layers.
    """
    if np.ndim(densities) == 3:
        return [format_design(d, g, hard=hard)
                for d, g in zip(densities, structural_grid, strict=True)]
    out = []
    for r, row in enumerate(np.asarray(densities, dtype=float)):
        tokens = []
        for c, v in enumerate(row):
            t = str(structural_grid[r][c]).strip()
            if t in STRUCTURAL:
                tokens.append(t)
            elif hard:
                tokens.append(f"{min(max(round(float(v), 1), 0.0), 1.0):.1f}")
            else:
                tokens.append("1" if v >= 0.5 else "0")
        out.append(tokens)
    return out


# ----------------------------------------------------------------------------
# 3D grids: layers of rows.

_LAYER_HEADING = re.compile(
    r"^\W*(layer|level|slice|plane|z)\b[^\n]{0,40}$", re.IGNORECASE | re.ASCII)


def grid_ndim(grid) -> GridDim:
    """3 for nested lists (or arrays) three deep, else 2.

    Text, and layers given as lists of row strings, are 2D unless a caller
    asks for ``ndim=3``.
    """
    if isinstance(grid, np.ndarray):
        return 3 if grid.ndim == 3 else 2
    if isinstance(grid, (list, tuple)) and grid and isinstance(grid[0], (list, tuple)):
        first = grid[0]
        if first and isinstance(first[0], (list, tuple, np.ndarray)):
            return 3
    if isinstance(grid, (list, tuple)) and grid and isinstance(grid[0], np.ndarray):
        return 3 if grid[0].ndim == 2 else 2
    return 2


def _check_3d(grid, what: str) -> tuple[int, int, int]:
    if not grid:
        raise InvalidProblemError(f"{what} is empty")
    shape = None
    for z, layer in enumerate(grid):
        if not isinstance(layer, (list, tuple, np.ndarray)) or len(layer) == 0:
            raise InvalidProblemError(f"{what}: layer {z} is empty")
        try:
            layer_shape = check_rectangular(
                [list(r) if not isinstance(r, str) else [r] for r in layer],
                what=f"{what} layer {z}")
        except InvalidProblemError:
            raise
        if shape is None:
            shape = layer_shape
        elif layer_shape != shape:
            raise InvalidProblemError(
                f"{what} is ragged: layer {z} is {layer_shape[0]}x{layer_shape[1]}, "
                f"expected {shape[0]}x{shape[1]}")
    return (len(grid),) + shape


def _from_nested_3d(value) -> Grid | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    layers = []
    for layer in value:
        if isinstance(layer, str):
            layer = [line for line in layer.split("\n") if line.strip()]
        grid = _from_nested(layer)
        if grid is None:
            return None
        layers.append(grid)
    return layers


def _layers_rectangular(grid) -> bool:
    if not grid or not all(_is_rectangular(layer) for layer in grid):
        return False
    shape = (len(grid[0]), len(grid[0][0]))
    return all((len(layer), len(layer[0])) == shape for layer in grid)


def _candidates_3d(text: str) -> list[Grid]:
    """3D blocks: runs of blank-line-separated layers, split by prose."""
    found: list[Grid] = []
    for segment in _FENCE.split(text):
        layers: list[list[list[str]]] = []
        current: list[list[str]] = []
        for line in segment.split("\n"):
            stripped = line.strip()
            tokens = _split_row(line) if stripped else []
            if stripped and _is_grid_line(tokens):
                current.append(tokens)
                continue
            if current:
                layers.append(current)
                current = []
            if stripped and not _LAYER_HEADING.match(stripped):
                if layers:
                    found.append(layers)
                layers = []
        if current:
            layers.append(current)
        if layers:
            found.append(layers)
    return found


def _extract_grid_3d(text) -> Grid | None:
    return _extract(text, _from_nested_3d, _candidates_3d, _layers_rectangular)


def _extract(text, from_nested, candidates_of, rectangular):
    """Shared reading of :func:`extract_grid` for one dimension's parsers."""
    if isinstance(text, (list, tuple)):
        return from_nested(text)
    if not isinstance(text, str):
        return None
    text = _normalise_text(text)
    stripped = text.strip()
    if stripped.startswith("["):
        # JSON, or a Python literal (str() of a list of lists: single quotes).
        for loads in (json.loads, ast.literal_eval):
            try:
                nested = from_nested(loads(stripped))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                nested = None
            if nested is not None:
                return nested
    candidates = candidates_of(text)
    if not candidates:
        return None
    for grid in reversed(candidates):
        if rectangular(grid):
            return grid
    return candidates[-1]
