"""Text <-> token grids <-> density arrays.

An SPhyR grid is a rectangle of tokens: ``L`` (load), ``S`` (support), ``V``
(masked, to be filled in) and densities (``0``/``1`` in the easy subjects,
``0.0`` .. ``1.0`` in the hard ones).  Grids travel as text (rows on lines,
cells separated by spaces) or as lists of token lists; model completions are
raw text with code fences, prose and the occasional malformed row.

Conventions: row 0 is the first printed row (the top of the structure).
Numbers are ASCII decimal literals only (``0``, ``0.5``, ``1e-3``); anything
else in a cell (``nan``, ``inf``, full-width digits, words) is unparsable.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re

import numpy as np

LOAD = "L"
SUPPORT = "S"
MASK = "V"
STRUCTURAL = (LOAD, SUPPORT)

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
_SEPARATORS = re.compile(r"[\s,|;]+")
_STRIP = "[](){}'\"`"

Grid = list  # list[list[str]]


class InvalidProblemError(ValueError):
    """A grid that does not describe a solvable structural problem."""


@dataclasses.dataclass(frozen=True)
class GridReport:
    """Bookkeeping of a grid -> densities conversion."""

    unfilled_cells: int = 0
    unparsable_cells: int = 0

    def __getitem__(self, key: str) -> int:  # dict-style access, as in results files
        return getattr(self, key)


def parse_number(token) -> float | None:
    """The value of a density token, or None if it is not an ASCII decimal number."""
    if isinstance(token, bool):
        return None
    if isinstance(token, (int, float, np.integer, np.floating)):
        try:
            value = float(token)
        except OverflowError:  # a Python int beyond the float range
            return math.inf if token > 0 else -math.inf
        return None if math.isnan(value) else value
    if not isinstance(token, str):
        return None
    token = token.strip()
    if not _NUMBER.fullmatch(token):
        return None
    return float(token)  # may overflow to inf; callers clip


def is_cell_token(token) -> bool:
    """Whether a token is a well-formed cell: L, S, V or a number."""
    if isinstance(token, str) and token.strip() in (LOAD, SUPPORT, MASK):
        return True
    return parse_number(token) is not None


def _split_row(line: str) -> list[str]:
    tokens = [t.strip(_STRIP) for t in _SEPARATORS.split(line.strip().strip(_STRIP))]
    return [t for t in tokens if t]


def _is_grid_line(tokens: list[str]) -> bool:
    if not tokens:
        return False
    good = sum(is_cell_token(t) for t in tokens)
    return 2 * good >= len(tokens) and all(len(t) <= 24 for t in tokens)


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
        return [[_cell_text(t) for t in row] for row in value]
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


def extract_grid(text) -> Grid | None:
    """Find the grid inside raw model output.

    Handles code fences (with or without a language tag, even mid-line), prose
    before and after, trailing spaces, blank lines, double-spaced rows, commas
    or brackets around cells, JSON (or Python-literal) lists of lists, and text
    stored as an escaped Python/JSON string literal.  When several grids appear, the last
    rectangular one wins (models restate their final answer last); if none is
    rectangular the last grid-like block is returned as it is, so callers can
    report its wrong shape.

    Args:
        text: model output, or a grid already given as a list of token lists
            (or a list of row strings), which is passed through.

    Returns:
        The grid as a list of token rows (strings), or None if nothing
        grid-like was found.
    """
    if isinstance(text, (list, tuple)):
        return _from_nested(text)
    if not isinstance(text, str):
        return None
    text = _normalise_text(text)
    stripped = text.strip()
    if stripped.startswith("["):
        # JSON, or a Python literal (str() of a list of lists: single quotes).
        for loads in (json.loads, ast.literal_eval):
            try:
                nested = _from_nested(loads(stripped))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                nested = None
            if nested is not None:
                return nested
    candidates = _candidates(text)
    if not candidates:
        return None
    for grid in reversed(candidates):
        if _is_rectangular(grid):
            return grid
    return candidates[-1]


def as_grid(grid) -> Grid:
    """Normalise text or token lists into a list of token rows (strings).

    Raises:
        InvalidProblemError: if nothing grid-like can be read.
    """
    result = extract_grid(grid)
    if result is None:
        raise InvalidProblemError("no grid found in the input")
    return result


def check_rectangular(grid: Grid, what: str = "grid") -> tuple[int, int]:
    """Shape of a token grid; raises InvalidProblemError if empty or ragged."""
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


def densities_from_grid(grid, mask_density: float = 0.0) -> tuple[np.ndarray, GridReport]:
    """Convert a grid into a float64 density field plus a bookkeeping report.

    ``L`` and ``S`` are solid (1); numbers are clipped to [0, 1]; ``V`` cells
    take ``mask_density`` and are counted as unfilled; anything else takes
    ``mask_density`` and is counted as unparsable.

    Args:
        grid: text or token lists.
        mask_density: density given to masked and unparsable cells.

    Returns:
        (densities of shape (nely, nelx), GridReport).

    Raises:
        InvalidProblemError: for an empty or ragged grid.
    """
    grid = as_grid(grid)
    nely, nelx = check_rectangular(grid)
    out = np.zeros((nely, nelx), dtype=np.float64)
    unfilled = unparsable = 0
    for r, row in enumerate(grid):
        for c, token in enumerate(row):
            t = token.strip() if isinstance(token, str) else token
            if t in STRUCTURAL:
                out[r, c] = 1.0
            elif t == MASK:
                out[r, c] = mask_density
                unfilled += 1
            else:
                value = parse_number(t)
                if value is None:
                    out[r, c] = mask_density
                    unparsable += 1
                else:
                    out[r, c] = min(max(value, 0.0), 1.0)
    return out, GridReport(unfilled_cells=unfilled, unparsable_cells=unparsable)


def token_masks(grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean (load, support, masked) arrays of a rectangular token grid."""
    nely, nelx = check_rectangular(grid)
    arr = np.array([[str(t).strip() for t in row] for row in grid], dtype=object)
    return arr == LOAD, arr == SUPPORT, arr == MASK


def grid_to_text(grid) -> str:
    """Rows on lines, cells separated by single spaces."""
    if isinstance(grid, np.ndarray) and grid.dtype.kind == "f":
        grid = [[f"{v:g}" for v in row] for row in grid]
    return "\n".join(" ".join(str(t) for t in row) for row in grid)


def format_design(densities: np.ndarray, structural_grid: Grid, hard: bool) -> Grid:
    """Tokens of a density field in a subject's format, keeping L/S from a grid.

    Easy subjects use ``0``/``1`` (threshold 0.5); hard ones one decimal.
    """
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
