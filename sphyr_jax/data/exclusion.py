"""Holding generated problems apart from other samples: packed layouts and structures.

A generated training problem must not be a near-copy of a benchmark sample,
by the same measure SPhyR-v2 holds its own samples apart with:

* the **layout distance** of two problems is the number of cells whose role
  (load, support or neither) differs;
* the **structure distance** of two answers is the number of cells whose
  material (solid or empty; load and support cells solid) differs in their
  0/1 (easy) answers.

A candidate is too close to a sample when its layout is within
:data:`MIN_LAYOUT_DISTANCE` cells of the sample's, or when its easy answer is
within :data:`MIN_STRUCTURE_DISTANCE` cells of the sample's easy answer.

:class:`SampleIndex` keeps many samples of one grid shape as bitsets (one bit
per cell, 64 cells per ``uint64`` word): the layout as two bitsets (load,
support; the roles differ on a cell exactly when either bit differs there)
and the easy answer as one.  A distance to every sample is then an XOR, an OR
and a population count over a few words per sample, so checking a candidate
against 100,000 samples costs about a millisecond, and :meth:`SampleIndex.check_many`
checks a whole batch of candidates with array operations.  The index grows
(:meth:`SampleIndex.add`), so a generator can hold its own accepted samples in one.

:class:`BenchmarkIndex` is an index of the samples of dataset folders (every
subject file found in each; layouts from every record's ``L``/``S`` cells,
structures from the ``*_easy`` subjects' answers) that names the rejection
reason.  :func:`default_exclusion_dirs` lists the benchmark sets shipped with
the package for a grid size (the published 10x10 set and its three turns and
``dataset_v2`` at 10x10, ``dataset_v2_20`` at 20x20) and
:func:`load_exclusion_index` builds their index, plus any other folders.

A benchmark sample's own layout is refused; a candidate far from every sample
gets None (else ``"excluded_layout"`` or ``"excluded_structure"``):

>>> import numpy as np
>>> from sphyr_jax.data import embedded, load_subject
>>> from sphyr_jax.data.exclusion import load_exclusion_index
>>> index = load_exclusion_index(10)
>>> record = load_subject(embedded("dataset_v2"), "full_easy")[0]
>>> grid = np.asarray(record["ground_truth"])
>>> index.check(grid == "L", grid == "S")
'excluded_layout'
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np

from sphyr_jax.data.datasets import DatasetError, embedded, list_subjects, load_subject
from sphyr_jax.problem.grids import LOAD, SUPPORT

MIN_LAYOUT_DISTANCE = 6
"""Cells whose load/support role must differ between two problems."""
MIN_STRUCTURE_DISTANCE = 8
"""Cells whose material must differ between two problems' easy answers."""

LAYOUT = "excluded_layout"
"""Rejection reason: the layout is too close to an excluded sample's."""
STRUCTURE = "excluded_structure"
"""Rejection reason: the easy answer is too close to an excluded sample's."""
REASONS = (LAYOUT, STRUCTURE)

DEFAULT_EXCLUSION_SETS = {
    10: ("dataset", "dataset_1_rotations", "dataset_2_rotations", "dataset_3_rotations",
         "dataset_v2"),
    20: ("dataset_v2_20",),
}
"""The embedded benchmark sets every generated corpus is held apart from, by grid size."""

_CHUNK_WORDS = 1 << 22  # words compared per array operation (32 MiB of uint64)


def words_for(cells: int) -> int:
    """``uint64`` words of a bitset of ``cells`` bits."""
    return (int(cells) + 63) // 64


def pack_cells(masks) -> np.ndarray:
    """Bool cell masks as bitsets.

    Args:
        masks: (..., *cells) bool (any array that is nonzero where a bit is set).

    Returns:
        (..., W) ``uint64`` with ``W = ceil(cells / 64)``; bit ``j % 64`` of
        word ``j // 64`` is cell ``j`` in row-major order.
    """
    masks = np.asarray(masks).astype(bool)
    lead = masks.shape[:-2] if masks.ndim >= 2 else ()
    flat = masks.reshape(*lead, -1)
    cells = flat.shape[-1]
    width = words_for(cells)
    padded = np.zeros((*lead, width * 64), bool)
    padded[..., :cells] = flat
    packed = np.packbits(padded, axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").astype(np.uint64, copy=False)


def layout_bits(load_mask, support_mask) -> np.ndarray:
    """(..., 2W) bitsets of layouts: the load bitset, then the support bitset."""
    return np.concatenate([pack_cells(load_mask), pack_cells(support_mask)], axis=-1)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between bitsets, summed over the last axis (broadcasting)."""
    return np.bitwise_count(np.bitwise_xor(a, b)).sum(axis=-1, dtype=np.int64)


def layout_hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cells whose role differs between packed layouts (:func:`layout_bits`), broadcasting.

    A cell's role differs exactly when its load bit or its support bit does:
    $d = |(\\ell_a \\oplus \\ell_b) \\lor (s_a \\oplus s_b)|$.
    """
    width = a.shape[-1] // 2
    diff = np.bitwise_xor(a, b)
    return np.bitwise_count(diff[..., :width] | diff[..., width:]).sum(axis=-1, dtype=np.int64)


def _grow(array: np.ndarray, used: int, extra: int) -> np.ndarray:
    if used + extra <= len(array):
        return array
    bigger = np.zeros((max(2 * len(array), used + extra, 64), *array.shape[1:]), array.dtype)
    bigger[:used] = array[:used]
    return bigger


class SampleIndex:
    """Layouts and easy-answer structures of many samples of one grid shape, packed.

    Args:
        shape: the grid shape, e.g. ``(10, 10)``.
        min_layout: layouts closer than this many cells are too close.
        min_structure: easy answers closer than this many cells are too close.
    """

    def __init__(self, shape: Sequence[int], *, min_layout: int = MIN_LAYOUT_DISTANCE,
                 min_structure: int = MIN_STRUCTURE_DISTANCE):
        self.shape = tuple(int(s) for s in shape)
        self.min_layout = int(min_layout)
        self.min_structure = int(min_structure)
        self.width = words_for(int(np.prod(self.shape)))
        self._layouts = np.zeros((0, 2 * self.width), np.uint64)
        self._structures = np.zeros((0, self.width), np.uint64)
        self._n_layouts = 0
        self._n_structures = 0

    @property
    def layouts(self) -> np.ndarray:
        """(N, 2W) packed layouts, in the order added."""
        return self._layouts[: self._n_layouts]

    @property
    def structures(self) -> np.ndarray:
        """(M, W) packed easy-answer structures, in the order added."""
        return self._structures[: self._n_structures]

    def __len__(self) -> int:
        return self._n_layouts

    def _check_shape(self, masks, what: str) -> np.ndarray:
        masks = np.asarray(masks)
        if masks.shape[-len(self.shape):] != self.shape:
            raise ValueError(f"{what} of shape {masks.shape} does not end in the index's grid "
                             f"shape {self.shape}")
        return masks

    def add(self, load_mask=None, support_mask=None, solid=None) -> None:
        """Add samples: their layouts (load and support masks) and/or their structures.

        Args:
            load_mask: (n, n) or (K, n, n) bool load cells, or None (no layout).
            support_mask: the support cells, shaped like ``load_mask``.
            solid: (n, n) or (K, n, n) bool easy-answer material (L/S cells
                solid), or None (no structure).
        """
        if (load_mask is None) != (support_mask is None):
            raise ValueError("give both the load and the support masks, or neither")
        if load_mask is not None:
            bits = layout_bits(self._check_shape(load_mask, "load_mask"),
                               self._check_shape(support_mask, "support_mask"))
            bits = bits.reshape(-1, 2 * self.width)
            self._layouts = _grow(self._layouts, self._n_layouts, len(bits))
            self._layouts[self._n_layouts: self._n_layouts + len(bits)] = bits
            self._n_layouts += len(bits)
        if solid is not None:
            bits = pack_cells(self._check_shape(solid, "solid")).reshape(-1, self.width)
            self._structures = _grow(self._structures, self._n_structures, len(bits))
            self._structures[self._n_structures: self._n_structures + len(bits)] = bits
            self._n_structures += len(bits)

    def add_packed(self, layouts=None, structures=None) -> None:
        """Add samples already packed (:func:`layout_bits`, :func:`pack_cells`)."""
        for bits, name in ((layouts, "_layouts"), (structures, "_structures")):
            if bits is None:
                continue
            count = f"_n{name}"
            bits = np.asarray(bits, np.uint64).reshape(-1, getattr(self, name).shape[1])
            used = getattr(self, count)
            grown = _grow(getattr(self, name), used, len(bits))
            grown[used: used + len(bits)] = bits
            setattr(self, name, grown)
            setattr(self, count, used + len(bits))

    # ------------------------------------------------------------------
    # Distances.

    def layout_distances(self, load_mask, support_mask) -> np.ndarray:
        """(N,) layout distances of one problem to every sample of the index."""
        bits = layout_bits(self._check_shape(load_mask, "load_mask"),
                           self._check_shape(support_mask, "support_mask"))
        return layout_hamming(self.layouts, bits)

    def structure_distances(self, solid) -> np.ndarray:
        """(M,) structure distances of one easy answer to every structure of the index."""
        return hamming(self.structures, pack_cells(self._check_shape(solid, "solid")))

    def nearest_layout(self, packed: np.ndarray) -> np.ndarray:
        """(K,) smallest layout distance of each packed layout (K, 2W) to the index
        (a large number for an empty index)."""
        return _nearest(np.asarray(packed, np.uint64).reshape(-1, 2 * self.width),
                        self.layouts, layout_hamming)

    def nearest_structure(self, packed: np.ndarray) -> np.ndarray:
        """(K,) smallest structure distance of each packed structure (K, W) to the index."""
        return _nearest(np.asarray(packed, np.uint64).reshape(-1, self.width),
                        self.structures, hamming)

    def layout_too_close(self, packed: np.ndarray) -> np.ndarray:
        """(K,) bool: each packed layout is within ``min_layout`` cells of a sample."""
        return self.nearest_layout(packed) < self.min_layout

    def structure_too_close(self, packed: np.ndarray) -> np.ndarray:
        """(K,) bool: each packed structure is within ``min_structure`` cells of a sample."""
        return self.nearest_structure(packed) < self.min_structure


_FAR = np.iinfo(np.int64).max


def _nearest(queries: np.ndarray, rows: np.ndarray, distance) -> np.ndarray:
    """Smallest distance of each query to the rows, in chunks that bound memory."""
    out = np.full(len(queries), _FAR, np.int64)
    if not len(rows) or not len(queries):
        return out
    width = rows.shape[1]
    step = max(1, _CHUNK_WORDS // max(1, len(queries) * width))
    for lo in range(0, len(rows), step):
        part = distance(queries[:, None, :], rows[None, lo: lo + step, :])
        np.minimum(out, part.min(axis=1), out=out)
    return out


# ----------------------------------------------------------------------------
# Benchmark sets.


@dataclasses.dataclass(frozen=True)
class Source:
    """Where an indexed layout came from: the folder and the record's index."""

    folder: str
    index: int


class BenchmarkIndex(SampleIndex):
    """The samples a generated corpus is held apart from, with the reason it is refused.

    Build one with :meth:`from_dirs` (or :func:`load_exclusion_index`); each
    distinct layout and easy-answer structure is kept once, with the first
    record it came from (:attr:`layout_sources`).
    """

    def __init__(self, shape: Sequence[int], **distances):
        super().__init__(shape, **distances)
        self.folders: list[str] = []
        self.layout_sources: list[Source] = []
        self.structure_sources: list[Source] = []

    @classmethod
    def from_dirs(cls, folders: Iterable[str | os.PathLike], grid_size: int | Sequence[int],
                  **distances) -> BenchmarkIndex:
        """An index of every sample of the given dataset folders with the grid shape.

        Each folder is read subject by subject (every one of the 16 subjects
        it holds, in any layout :func:`~sphyr_jax.data.datasets.load_subject`
        reads); samples of another grid shape are left out (they are never
        close).

        Args:
            folders: dataset folders.
            grid_size: n of the n x n grid, or the grid shape.
            **distances: ``min_layout``, ``min_structure`` (default: the v2 ones).

        Raises:
            DatasetError: a folder is missing, holds no subject file, or a
                file is malformed.
        """
        shape = (int(grid_size),) * 2 if np.ndim(grid_size) == 0 else tuple(grid_size)
        index = cls(shape, **distances)
        for folder in folders:
            index.add_folder(folder)
        return index

    def add_folder(self, folder: str | os.PathLike) -> None:
        """Add every sample of one dataset folder (see :meth:`from_dirs`)."""
        root = pathlib.Path(folder)
        if not root.is_dir():
            raise DatasetError(f"no such dataset folder: {os.fspath(folder)!r}")
        subjects = subjects_in(root)
        if not subjects:
            raise DatasetError(f"{root}: no subject files (looked for the 16 SPhyR subjects)")
        seen_layouts = {bytes(row) for row in self.layouts}
        seen_structures = {bytes(row) for row in self.structures}
        for subject in subjects:
            for record in load_subject(root, subject):
                answer = np.asarray(record["ground_truth"], dtype=object)
                if answer.shape != self.shape:
                    continue
                load, support = answer == LOAD, answer == SUPPORT
                source = Source(str(root), int(record["index"]))
                bits = layout_bits(load, support)
                if bytes(bits) not in seen_layouts:
                    seen_layouts.add(bytes(bits))
                    self.add_packed(layouts=bits)
                    self.layout_sources.append(source)
                if subject.endswith("_easy"):
                    solid = load | support | (answer == "1")
                    packed = pack_cells(solid)
                    if bytes(packed) not in seen_structures:
                        seen_structures.add(bytes(packed))
                        self.add_packed(structures=packed)
                        self.structure_sources.append(source)
        self.folders.append(str(root))

    def check(self, load_mask, support_mask, solid=None) -> str | None:
        """Why one candidate is refused, or None when it is far from every sample.

        Args:
            load_mask: (n, n) bool, the candidate's load cells.
            support_mask: (n, n) bool, its support cells.
            solid: optional (n, n) bool, its easy answer's material (L/S solid).

        Returns:
            :data:`LAYOUT`, :data:`STRUCTURE` or None.
        """
        reasons = self.check_many(np.asarray(load_mask)[None], np.asarray(support_mask)[None],
                                  None if solid is None else np.asarray(solid)[None])
        return reasons[0]

    def check_many(self, load_masks, support_masks, solids=None) -> list[str | None]:
        """:meth:`check` of K candidates at once ((K, n, n) masks; ``solids`` optional)."""
        layouts = layout_bits(self._check_shape(load_masks, "load_masks"),
                              self._check_shape(support_masks, "support_masks"))
        reasons: list[str | None] = [LAYOUT if bad else None
                                     for bad in self.layout_too_close(layouts)]
        if solids is not None:
            packed = pack_cells(self._check_shape(solids, "solids"))
            for k, bad in enumerate(self.structure_too_close(packed)):
                if bad and reasons[k] is None:
                    reasons[k] = STRUCTURE
        return reasons

    def describe(self) -> str:
        """One line: the folders and what they hold."""
        names = ", ".join(pathlib.Path(f).name for f in self.folders) or "nothing"
        return (f"{len(self)} layouts and {len(self.structures)} structures of "
                f"{'x'.join(map(str, self.shape))} samples from {names}")


def subjects_in(folder: str | os.PathLike) -> list[str]:
    """The SPhyR subjects (2D) a dataset folder holds, in :func:`list_subjects` order."""
    root = pathlib.Path(folder)
    found = []
    for subject in list_subjects():
        files = [root / f"{subject}{suffix}" for suffix in (".jsonl", ".json", ".parquet",
                                                            ".arrow")]
        if any(f.is_file() for f in files) or (root / subject).is_dir():
            found.append(subject)
    return found


def default_exclusion_dirs(grid_size: int) -> list[str]:
    """The embedded benchmark sets of a grid size (:data:`DEFAULT_EXCLUSION_SETS`; none for
    other sizes)."""
    return [embedded(name) for name in DEFAULT_EXCLUSION_SETS.get(int(grid_size), ())]


def load_exclusion_index(grid_size: int, extra: Iterable[str | os.PathLike] = (), *,
                         defaults: bool = True, **distances) -> BenchmarkIndex:
    """The index of the benchmark sets of a grid size, plus other folders.

    Args:
        grid_size: n of the n x n grid.
        extra: more dataset folders to hold the corpus apart from.
        defaults: include :func:`default_exclusion_dirs` (the shipped
            benchmark sets of this size).
        **distances: ``min_layout``, ``min_structure``.
    """
    folders = (default_exclusion_dirs(grid_size) if defaults else []) + [os.fspath(f)
                                                                           for f in extra]
    return BenchmarkIndex.from_dirs(folders, grid_size, **distances)
