"""Raw SPhyR simulation CSVs -> the 16 subject files (``<variant>_<easy|hard>``).

Raw format: one line per cell, ``index,x,y,z,density,is_static,[neighbours]``
(the neighbour list may contain commas; it may also be absent).  ``x``/``y`` are
cell centres with ``y = 0`` at the bottom; the grid size is inferred from the
coordinates (``nelx = max floor(x) + 1``, ``nely = max floor(y) + 1``) and every
cell must appear exactly once.

Conversion (the published rules): ``x, y = floor(x), floor(y)``; static cells on
``y = 0`` are ``S``, other static cells ``L``; with ``r = round(density, 1)`` the
easy token is ``"1"`` if ``r > 0`` else ``"0"`` and the hard token is
``f"{r:.1f}"`` (densities must round into [0, 1]; ``-0.0`` is written ``0.0``);
finally rows are flipped so ``y = 0`` is the last printed row (row 0 = top).

Masks (``V``), matching the published generator exactly:

* one ``random.Random(seed)`` stream runs over the samples in order; for each
  sample the variants are drawn in :data:`sphyr_jax.data.datasets.VARIANTS` order,
  ``easy`` before ``hard`` (so the two levels get different masks);
* ``<n>_random_cell``: ``n`` draws *with replacement* of ``col = randint(0,
  nelx - 1)`` then ``row = randint(0, nely - 1)`` over the whole grid, so up to
  ``n`` distinct cells (fewer on repeats), and ``L``/``S`` cells can be masked;
* ``<n>_random_row``: ``sample(range(1, nely - 1), n)`` — never the first or
  last printed row — every cell of those rows masked;
* ``<n>_random_column``: ``sample(range(nelx), n)``, every cell of those
  columns masked, ``L``/``S`` cells included;
* ``full``: rows ``1 .. nely - 2`` masked entirely (the load and support rows
  of the published data stay visible).

Row/column counts are capped at the rows/columns available.

Record index: the position of the sample in the sorted file order.  The
published files order the raw CSVs by file *name* (plain string order, so
``0 < 1000 < ... < 1009 < 100 < 1010``): in the published ``full_*`` files
``0_SPhyR_2D.csv`` is index 0, ``1002`` index 3, ``1005``–``1009`` indices
6–10, ``100`` index 11, ``1010``/``1011`` indices 12/13 and ``101`` index 22.
With ``order="name"`` (the default) and ``seed=42``, converting the complete
public ``raw_data`` folder reproduces the public ``*.jsonl`` subject files,
masks included (random draws come from CPython's ``random.randint`` /
``random.sample``).  Converting a subset renumbers from 0, so indices and
random masks then differ from the published ones; the ``full`` masks and the
ground truths never depend on the order.

3D (preliminary SPhyR-3D samples, ``N_SPhyR_3D.csv``): the same columns on a
voxel grid (``nz`` layers of ``ny`` x ``nx`` cells, cell centres at .5, ``z``
vertical); ``x, y, z = floor(x), floor(y), floor(z)``; static voxels on
``z = 0`` are ``S``, other static voxels ``L``; easy/hard tokens as in 2D; the
grid is printed layer by layer from the top (layer 0 = ``z = nz - 1``), each
layer like a 2D grid (row 0 = ``y = ny - 1``).  The 16 subjects are the 2D
ones with a ``_3d`` suffix (``full_easy_3d``, ...), masked from one
``random.Random(seed)`` stream in the same order (samples, variants, easy
before hard) with these 3D variants:

* ``<n>_random_cell``: ``n`` draws with replacement of ``col = randint(0,
  nx - 1)``, ``row = randint(0, ny - 1)``, ``layer = randint(0, nz - 1)``;
* ``<n>_random_row``: ``sample(range((nz - 2) * ny), n)``, draw ``k`` masking
  the ``nx`` voxels of row ``k % ny`` in layer ``1 + k // ny`` (rows of the
  interior layers only: the load and support layers stay visible, as the
  first and last printed rows do in 2D);
* ``<n>_random_column``: ``sample(range(ny * nx), n)``, draw ``k`` masking the
  vertical column of voxels at row ``k // nx``, column ``k % nx`` through
  every layer (``L``/``S`` voxels included, like 2D columns);
* ``full``: every voxel of layers ``1 .. nz - 2``.

So a row or column masks as many cells as in 2D on a 10-wide grid.  Folders
of ``*_SPhyR_3D.csv`` files convert with the same :func:`convert_raw_dir`.

Output: ``<subject>.jsonl`` (one ``json.dumps`` record per line, grids as token
lists, byte-compatible with the published files) or ``<subject>.json`` (a JSON
list of records whose grids are newline/space text, like the Hugging Face
copy).  Records carry ``"gravity_dir": [row, col]`` only when a sample has one;
raw CSVs carry none, so :func:`convert_raw_dir` writes none — samples built in
code (e.g. by a generator) may set :attr:`RawSample.gravity_dir` and go through
:func:`build_subjects` / :func:`write_subjects`.  Nothing is ever written
partially: every input is validated and every file rendered in memory, then
all files are replaced together (see :func:`sphyr_jax.io.atomic_write_files`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import random
import re
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from sphyr_jax.data.datasets import (
    DIFFICULTIES,
    SUBJECT_SUFFIX_3D,
    VARIANTS,
    DatasetError,
    list_subjects,
    load_subject,
)
from sphyr_jax.errors import UserInputError
from sphyr_jax.io import atomic_write_text, commit_files
from sphyr_jax.problem.grids import LOAD, MASK, SUPPORT, grid_to_text
from sphyr_jax.problem.symmetry import turn_records

RAW_SUFFIX = "_SPhyR_2D.csv"
RAW_SUFFIX_3D = "_SPhyR_3D.csv"
Format = Literal["jsonl", "json"]
Order = Literal["name", "number"]
FORMATS = ("jsonl", "json")
ORDERS = ("name", "number")

_RAW_NAME = re.compile(r"(\d+)" + re.escape(RAW_SUFFIX))
_RAW_NAME_3D = re.compile(r"(\d+)" + re.escape(RAW_SUFFIX_3D))
_INT = re.compile(r"[+-]?\d+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_VARIANT = re.compile(r"(\d+)_random_(cell|row|column)|full")
_BOOLS = {"true": True, "false": False}


class ConversionError(UserInputError):
    """Raw data that cannot be converted.

    Attributes:
        path: the offending file or folder (None if not file-related).
        line: 1-based line number, or None when the problem is not on one line.
    """

    def __init__(self, message: str, path=None, line: int | None = None):
        super().__init__(message)
        self.path = None if path is None else os.fspath(path)
        self.line = line


@dataclasses.dataclass(frozen=True, eq=False)
class RawSample:
    """One converted raw sample; grids are in printed orientation (row 0 = top).

    3D samples hold (nz, ny, nx) arrays, layer 0 the top layer (z = nz - 1).

    Attributes:
        index: the number ``N`` of ``N_SPhyR_2D.csv`` / ``N_SPhyR_3D.csv``
            (None for other names).
        easy: (nely, nelx) object array of ``L``/``S``/``"0"``/``"1"`` tokens.
        hard: (nely, nelx) object array of ``L``/``S``/``"0.0"``..``"1.0"`` tokens.
        density: (nely, nelx) float64 raw densities (static cells included).
        path: the source file, if any.
        gravity_dir: optional ``(row, col)`` load direction to carry into records.
    """

    index: int | None
    easy: np.ndarray
    hard: np.ndarray
    density: np.ndarray
    path: str | None = None
    gravity_dir: tuple[float, float] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """(nely, nelx), or (nz, ny, nx) for a 3D sample."""
        return tuple(self.easy.shape)

    @property
    def ndim(self) -> int:
        return self.easy.ndim

    def grid(self, level: str) -> list[list[str]]:
        """The ground-truth token grid of a level (``"easy"`` or ``"hard"``)."""
        if level not in DIFFICULTIES:
            raise ValueError(f"level must be 'easy' or 'hard', got {level!r}")
        return (self.easy if level == "easy" else self.hard).tolist()


def raw_file_number(path) -> int | None:
    """``N`` for a file named ``N_SPhyR_2D.csv`` or ``N_SPhyR_3D.csv``, else None."""
    name = os.path.basename(os.fspath(path))
    match = _RAW_NAME.fullmatch(name) or _RAW_NAME_3D.fullmatch(name)
    return int(match.group(1)) if match else None


def _split_fields(line: str) -> tuple[list[str], str | None]:
    """Comma-separated fields before an optional trailing ``[...]`` list."""
    bracket = line.find("[")
    if bracket < 0:
        return [f.strip() for f in line.split(",")], None
    head = line[:bracket].rstrip()
    if not head.endswith(","):  # a bracket inside a field: let the field checks report it
        return [f.strip() for f in line.split(",")], None
    return [f.strip() for f in head[:-1].split(",")], line[bracket:].strip()


def _parse_line(line: str, fail, dims: int = 2) -> tuple:
    fields, neighbours = _split_fields(line)
    if len(fields) < 6:
        fail(
            f"short line: {len(fields)} field(s), expected "
            "index,x,y,z,density,is_static[,neighbours]"
        )
    if len(fields) > 6:
        fail(f"too many fields ({len(fields)}); expected index,x,y,z,density,is_static")
    if neighbours is not None:
        if not neighbours.endswith("]") or "[" in neighbours[1:]:
            fail(f"malformed neighbour list {neighbours!r}")
        inner = neighbours[1:-1].strip()
        if inner and not all(_INT.fullmatch(t.strip()) for t in inner.split(",")):
            fail(f"neighbour list holds a non-integer: {neighbours!r}")
    index, x, y, z, density, static = fields
    if not _INT.fullmatch(index):
        fail(f"cell index is not an integer: {index!r}")
    values = []
    for name, text in (("x", x), ("y", y), ("z", z), ("density", density)):
        if not _FLOAT.fullmatch(text):
            fail(f"{name} is not a number: {text!r}")
        value = float(text)
        if not math.isfinite(value):
            fail(f"{name} is not finite: {text!r}")
        values.append(value)
    if static.lower() not in _BOOLS:
        fail(f"is_static must be True or False, got {static!r}")
    col, row = math.floor(values[0]), math.floor(values[1])
    if dims == 3:
        layer = math.floor(values[2])
        if col < 0 or row < 0 or layer < 0:
            fail(f"negative cell coordinate x={x}, y={y}, z={z}")
        return col, row, layer, values[3], _BOOLS[static.lower()]
    if col < 0 or row < 0:
        fail(f"negative cell coordinate x={x}, y={y}")
    return col, row, values[3], _BOOLS[static.lower()]


def _read_lines(path):
    """(path as str, the file's lines); a file that is not UTF-8 is a ConversionError."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8-sig") as handle:
            return path, handle.read().split("\n")
    except UnicodeDecodeError as exc:
        raise ConversionError(f"{path}: not UTF-8 text ({exc})", path) from exc


def _read_cells(path, dims: int):
    """Cells of a raw CSV keyed by printed-order coordinates ((row, col) or (z, y, x)).

    Returns:
        (path as str, {key: (line number, density, is_static)}, last data line).

    Raises:
        ConversionError: naming file and line, for a bad line, a duplicate cell,
            a density outside [0, 1] after rounding or an empty file.
    """
    path, lines = _read_lines(path)
    noun = "cell" if dims == 2 else "voxel"
    cells: dict[tuple[int, ...], tuple[int, float, bool]] = {}
    last = 0
    for number, raw_line in enumerate(lines, start=1):
        line = raw_line.strip()
        if not line:
            continue
        last = number

        def fail(message: str, number: int = number):
            raise ConversionError(f"{path}, line {number}: {message}", path, number)

        *coords, density, static = _parse_line(line, fail, dims=dims)
        key = tuple(reversed(coords))
        if key in cells:
            where = ", ".join(f"{axis}={v}" for axis, v in zip("xyz", coords, strict=False))
            fail(f"duplicate {noun} {where} (first on line {cells[key][0]})")
        rounded = round(density, 1) + 0.0  # + 0.0 turns -0.0 into 0.0
        if not static and not 0.0 <= rounded <= 1.0:
            fail(f"density {density} is outside [0, 1]")
        cells[key] = (number, density, static)
    if not cells:
        raise ConversionError(f"{path}, line 1: empty file (no cells)", path, 1)
    return path, cells, last


def read_raw_csv(path, shape: tuple[int, int] | None = None) -> RawSample:
    """Read one raw simulation CSV into easy and hard ground-truth token grids.

    Args:
        path: a ``*_SPhyR_2D.csv`` file (any grid size).
        shape: optional expected (nely, nelx); by default the size is inferred
            from the coordinates, so a file missing its whole last row or
            column reads as a smaller grid.

    Returns:
        A :class:`RawSample` (``index`` = the file's number, if named
        ``N_SPhyR_2D.csv``).

    Raises:
        ConversionError: naming the file and line, for an empty file, a short
            line, a non-number, a non-boolean ``is_static``, a density outside
            [0, 1] after rounding, a duplicate cell, missing cells, or a grid
            of another size than ``shape``.
        OSError: if the file cannot be read.
    """
    return _read_raw_sample(path, shape, dims=2)


def read_raw_csv_3d(path, shape: tuple[int, int, int] | None = None) -> RawSample:
    """Read one raw 3D simulation CSV into easy and hard (nz, ny, nx) token grids.

    Args:
        path: a ``*_SPhyR_3D.csv`` file (any grid size).
        shape: optional expected (nz, ny, nx); by default inferred from the
            coordinates.

    Returns:
        A :class:`RawSample` with 3D arrays, layer 0 = the top layer
        (``z = nz - 1``), row 0 = ``y = ny - 1``.

    Raises:
        ConversionError: naming the file and line, for an empty file, a short
            line, a non-number, a non-boolean ``is_static``, a density outside
            [0, 1] after rounding, a duplicate voxel, missing voxels, or a grid
            of another size than ``shape``.
        OSError: if the file cannot be read.
    """
    return _read_raw_sample(path, shape, dims=3)


def _read_raw_sample(path, shape: tuple[int, ...] | None, dims: int) -> RawSample:
    """:func:`read_raw_csv` (``dims=2``) and :func:`read_raw_csv_3d` (``dims=3``)."""
    path, cells, last = _read_cells(path, dims=dims)
    size = tuple(max(k[i] for k in cells) + 1 for i in range(dims))  # printed-order axes
    span = "x".join(str(n) for n in size)
    grid, noun = ("grid", "cells") if dims == 2 else ("(z, y, x) voxel grid", "voxels")
    if shape is not None and size != tuple(shape):
        raise ConversionError(
            f"{path}, end of file (line {last}): the coordinates span a {span} {grid}, "
            f"expected {'x'.join(str(n) for n in shape)}", path, last)
    missing = [k for k in np.ndindex(*size) if k not in cells]
    if missing:
        first = ", ".join(f"{axis}={v}" for axis, v in zip("xyz", reversed(missing[0]),
                                                           strict=False))
        where = "grid" if dims == 2 else "(z, y, x) grid"
        raise ConversionError(
            f"{path}, end of file (line {last}): {len(missing)} of {math.prod(size)} {noun} "
            f"missing from the {span} {where} the coordinates span, first {first}", path, last)
    easy = np.empty(size, dtype=object)
    hard = np.empty(size, dtype=object)
    dens = np.empty(size, dtype=np.float64)
    for key, (_, density, static) in cells.items():
        # Flip every axis but the columns: y = 0 (z = 0) is the last printed row (layer).
        at = tuple(n - 1 - k for n, k in zip(size[:-1], key[:-1], strict=True)) + key[-1:]
        dens[at] = density
        if static:
            easy[at] = hard[at] = SUPPORT if key[0] == 0 else LOAD
        else:
            rounded = round(density, 1) + 0.0
            easy[at] = "1" if rounded > 0 else "0"
            hard[at] = f"{rounded:.1f}"
    return RawSample(raw_file_number(path), easy, hard, dens, path)


def read_raw(path) -> RawSample:
    """Read a 2D or 3D raw CSV, by its name (``*_SPhyR_3D.csv`` is 3D)."""
    if os.fspath(path).endswith(RAW_SUFFIX_3D):
        return read_raw_csv_3d(path)
    return read_raw_csv(path)


def mask_grid_3d(grid, variant: str, rng: random.Random) -> list:
    """A copy of a 3D token grid (layers of rows) with one variant's voxels set to ``V``.

    See the module docstring for the exact draws of each variant.
    """
    kind, n = _parse_variant(variant)
    src = grid.tolist() if hasattr(grid, "tolist") else grid
    out = [[[str(t) for t in row] for row in layer] for layer in src]
    nz, ny, nx = len(out), len(out[0]), len(out[0][0])
    inner = range(1, nz - 1) if nz > 2 else range(0)
    if kind == "cell":
        for _ in range(n):
            col = rng.randint(0, nx - 1)
            row = rng.randint(0, ny - 1)
            layer = rng.randint(0, nz - 1)
            out[layer][row][col] = MASK
    elif kind == "row":
        for k in rng.sample(range(len(inner) * ny), min(n, len(inner) * ny)):
            layer, row = inner[k // ny], k % ny
            out[layer][row] = [MASK] * nx
    elif kind == "column":
        for k in rng.sample(range(ny * nx), min(n, ny * nx)):
            row, col = divmod(k, nx)
            for layer in range(nz):
                out[layer][row][col] = MASK
    else:
        for layer in inner:
            out[layer] = [[MASK] * nx for _ in range(ny)]
    return out


def _parse_variant(variant: str) -> tuple[str, int]:
    match = _VARIANT.fullmatch(variant) if isinstance(variant, str) else None
    if not match:
        raise ValueError(
            f"unknown mask variant {variant!r} (want '<n>_random_cell|row|column' or 'full')"
        )
    if variant == "full":
        return "full", 0
    return match.group(2), int(match.group(1))


def mask_grid(grid, variant: str, rng: random.Random) -> list[list[str]]:
    """A copy of ``grid`` with one variant's cells replaced by ``V``.

    Args:
        grid: token grid (list of rows or 2-D array), row 0 = top.
        variant: e.g. ``"3_random_row"`` or ``"full"`` (see the module
            docstring for the exact draws).
        rng: the ``random.Random`` stream to draw from (advanced in place).

    Returns:
        The masked grid as a list of token rows.
    """
    kind, n = _parse_variant(variant)
    out = [[str(t) for t in row] for row in (grid.tolist() if hasattr(grid, "tolist") else grid)]
    nely, nelx = len(out), len(out[0])
    if kind == "cell":
        for _ in range(n):
            col = rng.randint(0, nelx - 1)
            row = rng.randint(0, nely - 1)
            out[row][col] = MASK
        return out
    if kind == "column":
        cols = rng.sample(range(nelx), min(n, nelx))
        rows = range(nely)
    else:
        inner = range(1, nely - 1) if nely > 2 else range(0)
        rows = inner if kind == "full" else rng.sample(inner, min(n, len(inner)))
        cols = range(nelx)
    for row in rows:
        for col in cols:
            out[row][col] = MASK
    return out


def build_subjects(
    samples: Sequence[RawSample],
    seed: int = 42,
    variants: Sequence[str] = VARIANTS,
) -> dict[str, list[dict]]:
    """Mask every sample for every variant and level.

    Args:
        samples: converted samples, in the order that defines record indices.
        seed: seed of the single ``random.Random`` stream.
        variants: mask variants, in drawing order.

    Returns:
        ``{subject: [record, ...]}`` with records ``{"index", "input_grid",
        "ground_truth"}`` (token lists) plus ``"gravity_dir"`` when the sample
        has one; subjects in :func:`sphyr_jax.data.datasets.list_subjects` order for
        the default variants.  3D samples give the ``*_3d`` subjects (grids
        as layers of token rows, masks by :func:`mask_grid_3d`).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    for variant in variants:
        _parse_variant(variant)
    dims = {sample.ndim for sample in samples}
    if len(dims) > 1:
        raise ValueError("cannot mix 2D and 3D samples in one conversion")
    dim = dims.pop() if dims else 2
    suffix, masker = (SUBJECT_SUFFIX_3D, mask_grid_3d) if dim == 3 else ("", mask_grid)
    rng = random.Random(seed)
    subjects: dict[str, list[dict]] = {
        f"{variant}_{level}{suffix}": [] for variant in variants for level in DIFFICULTIES
    }
    for position, sample in enumerate(samples):
        truths = {level: sample.grid(level) for level in DIFFICULTIES}
        for variant in variants:
            for level in DIFFICULTIES:
                truth = truths[level]
                record = {
                    "index": position,
                    "input_grid": masker(truth, variant, rng),
                    "ground_truth": ([[list(r) for r in layer] for layer in truth] if dim == 3
                                     else [list(row) for row in truth]),
                }
                if sample.gravity_dir is not None:
                    record["gravity_dir"] = [_plain(v) for v in sample.gravity_dir]
                subjects[f"{variant}_{level}{suffix}"].append(record)
    if tuple(variants) == VARIANTS:
        subjects = {name: subjects[name] for name in list_subjects(dim)}
    return subjects


def _plain(value):
    value = float(value)
    return int(value) if value.is_integer() else value


def render_subject(records: Sequence[Mapping], fmt: Format = "jsonl") -> str:
    """File text of one subject.

    Args:
        records: records with token-list grids.
        fmt: ``"jsonl"`` (token lists, one record per line) or ``"json"``
            (a JSON list, grids as newline/space text, 4-space indent).
    """
    if fmt == "jsonl":
        return "".join(json.dumps(dict(record)) + "\n" for record in records)
    if fmt == "json":
        rows = []
        for record in records:
            row = dict(record)
            row["input_grid"] = grid_to_text(record["input_grid"])
            row["ground_truth"] = grid_to_text(record["ground_truth"])
            rows.append(row)
        return json.dumps(rows, indent=4) + "\n"
    raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")


def write_subjects(
    subjects: Mapping[str, Sequence[Mapping]], output_dir, fmt: Format = "jsonl"
) -> dict[str, int]:
    """Write ``<subject>.<fmt>`` files all-or-nothing.

    Args:
        subjects: ``{subject: records}`` as made by :func:`build_subjects`.
        output_dir: target folder (created if missing; removed again if the
            write fails).
        fmt: ``"jsonl"`` or ``"json"``.

    Returns:
        ``{subject: number of records}``.

    Raises:
        ValueError: for an unknown format.
        OSError: if writing fails; the folder is then left as it was.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    output = pathlib.Path(output_dir)
    texts = {output / f"{name}.{fmt}": render_subject(recs, fmt) for name, recs in subjects.items()}
    commit_files(texts)
    return {name: len(recs) for name, recs in subjects.items()}


def list_raw_files(raw_dir, order: Order = "name", dim: int | None = None) -> list[pathlib.Path]:
    """The ``N_SPhyR_2D.csv`` (or ``N_SPhyR_3D.csv``) files of a folder in conversion order.

    Args:
        raw_dir: folder of raw CSVs (not searched recursively).
        order: ``"name"`` — plain string order of file names, as the published
            files were made — or ``"number"`` — by ``N``.  Either way the
            result does not depend on the directory listing order.
        dim: 2 or 3; None takes the 2D files, or the 3D ones if the folder
            holds no 2D file.

    Raises:
        ConversionError: if the folder is missing, holds no raw CSVs, or holds a
            raw CSV whose prefix is not a number.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if dim not in (None, 2, 3):
        raise ValueError(f"dim must be 2, 3 or None, got {dim!r}")
    folder = pathlib.Path(raw_dir)
    if not folder.is_dir():
        raise ConversionError(f"{folder}: not a folder of raw CSVs", folder)
    entries = [p for p in folder.iterdir() if p.is_file()]
    suffix = RAW_SUFFIX_3D if dim == 3 else RAW_SUFFIX
    files = [p for p in entries if p.name.endswith(suffix)]
    if dim is None and not files:
        files_3d = [p for p in entries if p.name.endswith(RAW_SUFFIX_3D)]
        if files_3d:
            files, suffix = files_3d, RAW_SUFFIX_3D
    for path in files:
        if raw_file_number(path) is None:
            raise ConversionError(f"{path}: raw file names must be <number>{suffix}", path)
    if not files:
        raise ConversionError(f"{folder}: no *{suffix} files", folder)
    if order == "name":
        return sorted(files, key=lambda p: p.name)
    return sorted(files, key=lambda p: (raw_file_number(p), p.name))


def unsolvable_reason(sample: RawSample) -> str | None:
    """Why a converted sample cannot be scored (no load or no support cell), else None."""
    tokens = set(np.asarray(sample.easy, dtype=object).ravel().tolist())
    missing = [name for token, name in (("L", "load ('L')"), ("S", "support ('S')"))
               if token not in tokens]
    return f"no {' and no '.join(missing)} cell" if missing else None


def convert_raw_dir(
    raw_dir, output_dir, seed: int = 42, fmt: Format = "jsonl", order: Order = "name",
    dim: int | None = None, skip_unsolvable: bool = False, log=None,
) -> dict[str, int]:
    """Convert a folder of raw CSVs into the 16 subject files.

    A folder of ``N_SPhyR_3D.csv`` files (and no 2D ones, or ``dim=3``) gives
    the 16 ``*_3d`` subjects.

    Every file is read and validated and every output rendered before anything
    is written; the 16 files then replace any previous ones together, so on any
    error the output folder is left exactly as it was.

    Args:
        raw_dir: folder of ``N_SPhyR_2D.csv`` (or ``N_SPhyR_3D.csv``) files.
        output_dir: folder for ``<subject>.jsonl`` / ``<subject>.json``.
        seed: mask seed (42 = the published one).
        fmt: ``"jsonl"`` (token lists) or ``"json"`` (text grids).
        order: sample order, ``"name"`` (published) or ``"number"``; see
            :func:`list_raw_files`.
        dim: 2, 3 or None (see :func:`list_raw_files`).
        skip_unsolvable: leave out samples with no load or no support cell
            (each named through ``log``) instead of stopping.
        log: optional callable(str) for the samples left out.

    Returns:
        ``{subject: number of records}`` for the 16 subjects.

    Raises:
        ConversionError: for a missing/empty folder, a malformed CSV (the
            message names the file and line), or a sample with no load or no
            support cell (named) unless ``skip_unsolvable``.
        ValueError: for an unknown ``fmt`` or ``order``.
        OSError: if the output cannot be written.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    samples = []
    for path in list_raw_files(raw_dir, order, dim):
        sample = read_raw(path)
        reason = unsolvable_reason(sample)
        if reason is None:
            samples.append(sample)
        elif skip_unsolvable:
            if log is not None:
                log(f"left out {path}: {reason}")
        else:
            raise ConversionError(f"{path}: {reason}; such a sample cannot be scored "
                                  "(pass --skip_unsolvable to leave it out)", path)
    if not samples:
        raise ConversionError(f"{raw_dir}: no sample with both load and support cells")
    return write_subjects(build_subjects(samples, seed), output_dir, fmt)


def write_turned_dataset(source_dir, output_dir, k: int) -> dict[str, int]:
    """Write the 16 subject files of a dataset folder turned by k quarter turns.

    Records keep their index and get ``gravity_dir``; files are JSONL like the
    source ((:func:`render_subject`)).  Subjects missing from the
    source are skipped.

    Returns:
        ``{subject: number of records written}``.
    """
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for subject in list_subjects():
        try:
            records = load_subject(str(source_dir), subject)
        except DatasetError:
            continue
        turned = turn_records(records, k)
        atomic_write_text(output_dir / f"{subject}.jsonl", render_subject(turned, "jsonl"))
        written[subject] = len(turned)
    return written
