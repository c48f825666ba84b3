"""Baseline "models" that fill masked cells without reasoning, as stored results files.

Each baseline answers every record of every subject of a dataset folder and is
written like a real model's results: ``<results_root>/<model>/<subject>_results.json``,
a JSON list of ``{"subject", "prompt", "ground_truth", "completion"}`` records
(plus ``"gravity_dir"`` when the dataset record has one), grids as
newline/space text.  The baselines:

* ``empty``: every ``V`` cell becomes ``0`` (``0.0`` in hard subjects);
* ``solid``: every ``V`` cell becomes ``1`` (``1.0``);
* ``random``: seeded coin flips (easy) or uniform one-decimal values (hard);
* ``copy_input``: the input grid returned unchanged, ``V`` cells included;
* ``retrieval`` (a model backend only, :class:`RetrievalIndex`): the masked
  cells copied from the answer of the most similar *other* record of the
  subject, similarity being the number of visible cells on which that answer
  agrees with the input.
* ``answer`` (opt-in, not among :data:`MODELS`): the dataset answer itself,
  the ceiling a model can reach (its score is the answer's distance from the
  yardstick's optimum).

They bracket the scores a real model should beat: empty answers are rarely
load-carrying, solid ones always are but waste material, a copied input
leaves every masked cell unfilled, and retrieval is what memorising the
subject's other answers buys.  :func:`fill_masked` and :func:`fill_cells`
fill the ``V`` cells of any grid (2D or 3D); the training layer uses them too.
"""

from __future__ import annotations

import json
import pathlib
import zlib
from collections.abc import Iterable, Sequence

import numpy as np

from sphyr_jax.data.datasets import is_hard, list_subjects, load_subject
from sphyr_jax.io import atomic_write_files
from sphyr_jax.problem.grids import (
    MASK,
    as_grid,
    check_rectangular,
    grid_to_text,
    parse_number,
)
from sphyr_jax.problem.loadcase import direction_words

MODELS = ("empty", "solid", "random", "copy_input")
ANSWER = "answer"  # opt-in: the dataset answer itself, the ceiling a model can reach
_DIRECTION_WORDS = {(1, 0): "downwards", (-1, 0): "upwards", (0, -1): "to the left",
                    (0, 1): "to the right"}


def make_prompt(input_grid, hard: bool, gravity_dir=None) -> str:
    """A task description followed by the input grid as text.

    The grid is the only grid-like block of the prompt, so
    :func:`sphyr_jax.extract_grid` reads it back.

    Args:
        input_grid: the masked grid (token lists or text).
        hard: ask for one-decimal densities instead of 0/1.
        gravity_dir: optional (row, col) load direction to mention.
    """
    if hard:
        values = ("a density between 0.0 and 1.0 written with exactly one decimal "
                  "(0.0 for no material, 1.0 for full material)")
    else:
        values = "either 1 for solid material or 0 for no material"
    direction = "downwards (towards the bottom of the grid)"
    if gravity_dir is not None:
        key = tuple(int(v) for v in gravity_dir)
        direction = _DIRECTION_WORDS.get(key) or direction_words(gravity_dir)
    return (
        "The grid below describes a two-dimensional structure cut into square cells.\n"
        "Legend: L marks a cell where the load acts, S marks a supported (fixed) cell, "
        "V marks a hidden cell whose value you must decide, and a number gives the "
        "amount of material in a cell.\n"
        f"The load pushes {direction}.\n"
        f"Replace every V with {values}, so that the finished structure carries the "
        "load into the supports as stiffly as possible while spending little material.\n"
        "Leave all other cells exactly as they are.\n"
        "\n"
        f"{grid_to_text(input_grid)}\n"
        "\n"
        "Answer with the completed grid only: the same number of rows and columns, "
        "one row per line, cells separated by single spaces.\n"
    )


def _is_cell(value) -> bool:
    return not isinstance(value, (list, tuple))


def _fill(grid, values) -> list:
    """Replace the ``V`` cells of a token grid (2D or 3D) with ``values`` (row-major iterator)."""
    it = iter(values)

    def walk(g):
        if _is_cell(g):
            return next(it) if str(g).strip() == MASK else str(g)
        return [walk(x) for x in g]

    return [walk(x) for x in grid]


def _count_masked(grid) -> int:
    if _is_cell(grid):
        return int(str(grid).strip() == MASK)
    return sum(_count_masked(x) for x in grid)


def fill_cells(grid, tokens) -> list:
    """Token rows (or layers of rows) with V cells replaced by ``tokens`` (same shape)."""
    if np.ndim(tokens) > 1:
        return [fill_cells(g, t) for g, t in zip(grid, tokens, strict=True)]
    return [new if str(t).strip() == MASK else str(t).strip()
            for t, new in zip(grid, tokens, strict=True)]


def fill_masked(input_grid, token: str) -> list:
    """The input grid (2D or 3D) with every ``V`` cell replaced by ``token``."""
    grid = as_grid(input_grid)
    return fill_cells(grid, np.full(check_rectangular(grid), token, dtype=object))


def complete(model: str, input_grid, hard: bool, rng: np.random.Generator | None = None):
    """A baseline's completion of one input grid, as a token grid.

    Args:
        model: one of :data:`MODELS`.
        input_grid: masked token grid.
        hard: one-decimal densities instead of 0/1.
        rng: generator for ``random`` (advanced in place).

    Raises:
        ValueError: for an unknown model, or ``random`` without a generator.
    """
    n = _count_masked(input_grid)
    if model == "copy_input":
        return _fill(input_grid, [MASK] * n)
    if model in ("empty", "solid"):
        token = ("0", "1")[model == "solid"]
        return _fill(input_grid, [f"{token}.0" if hard else token] * n)
    if model == "random":
        if rng is None:
            raise ValueError("the random baseline needs a numpy Generator")
        if hard:
            values = [f"{v / 10:.1f}" for v in rng.integers(0, 11, size=n)]
        else:
            values = [str(v) for v in rng.integers(0, 2, size=n)]
        return _fill(input_grid, values)
    raise ValueError(f"unknown baseline {model!r}; choose from {MODELS}")


def _cell_key(token) -> str:
    """A token for comparisons: numbers by value ("1" == "1.0"), letters as written."""
    value = parse_number(token)
    return f"{value:.6g}" if value is not None else str(token).strip()


_cell_keys = np.vectorize(_cell_key, otypes=[object])


class RetrievalIndex:
    """The answers of a subject's records, ready for nearest-record look-ups.

    For a masked input ``x`` (cells ``x_ij``, visible where ``x_ij != V``) and
    a solved record ``r`` of the same shape (answer cells ``a_ij``), the
    similarity is ``sum_ij [x_ij visible] [x_ij == a_ij]`` (numbers compared by
    value).  :meth:`fill` copies the masked cells of the most similar record's
    answer (the first one on ties), never the record it is told to exclude.

    Args:
        records: solved records ``{"input_grid", "ground_truth"}`` (only the
            answers are used), 2D or 3D, any mix of shapes.
    """

    def __init__(self, records: Iterable[dict]):
        self._keys: dict[tuple, list[tuple[int, np.ndarray]]] = {}
        self._answers: list[list] = []
        for position, record in enumerate(records):
            answer = as_grid(record["ground_truth"])
            self._answers.append(answer)
            keys = _cell_keys(np.array(answer, dtype=object))
            self._keys.setdefault(keys.shape, []).append((position, keys))
        self._stacked = {shape: (np.array([p for p, _ in items]), np.stack([k for _, k in items]))
                         for shape, items in self._keys.items()}

    def nearest(self, input_grid, exclude: int | None = None) -> int | None:
        """Position (in the records given) of the most similar answer; None if no
        other record has the input's shape."""
        grid = np.array(as_grid(input_grid), dtype=object)
        if grid.shape not in self._stacked:
            return None
        positions, keys = self._stacked[grid.shape]
        query = _cell_keys(grid)
        visible = query != MASK
        agree = ((keys == query[None]) & visible[None]).reshape(len(positions), -1).sum(axis=1)
        if exclude is not None:
            agree = np.where(positions == exclude, -1, agree)
        best = int(np.argmax(agree))
        return None if agree[best] < 0 else int(positions[best])

    def fill(self, input_grid, exclude: int | None = None) -> list | None:
        """The input with its ``V`` cells copied from the nearest answer (token
        rows); None when no other record has the input's shape."""
        best = self.nearest(input_grid, exclude)
        if best is None:
            return None
        grid = as_grid(input_grid)
        return fill_cells(grid, np.array(self._answers[best], dtype=object))


def _subject_rng(seed: int, subject: str) -> np.random.Generator:
    """A generator that depends only on the seed and the subject name."""
    return np.random.default_rng([seed, zlib.crc32(subject.encode("utf-8"))])


def baseline_records(model: str, subject: str, records: Sequence[dict], seed: int = 0):
    """Result records of one baseline on one subject's dataset records."""
    hard = is_hard(subject)
    rng = _subject_rng(seed, subject) if model == "random" else None
    out = []
    for record in records:
        gravity = record.get("gravity_dir")
        row = {
            "subject": subject,
            "prompt": make_prompt(record["input_grid"], hard, gravity),
            "ground_truth": grid_to_text(record["ground_truth"]),
            "completion": grid_to_text(record["ground_truth"] if model == ANSWER
                                       else complete(model, record["input_grid"], hard, rng)),
        }
        if gravity is not None:
            row["gravity_dir"] = list(gravity)
        out.append(row)
    return out


def _json_text(obj) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_baseline_results(dataset_dir, results_root, seed: int = 0,
                           models: Sequence[str] = MODELS) -> list[pathlib.Path]:
    """Write every baseline's results for every subject found in a dataset folder.

    Args:
        dataset_dir: folder with ``<subject>.jsonl`` / ``.json`` files (any
            source :func:`sphyr_jax.data.datasets.load_subject` reads).
        results_root: results are written to ``<results_root>/<model>/``.
        seed: seed of the ``random`` baseline (per subject, order-independent).
        models: baselines to write (:data:`MODELS`, and :data:`ANSWER`: the
            dataset answer as the completion).

    Returns:
        The written paths, model by model, subjects in the standard order.

    Raises:
        ValueError: for an unknown model or a folder without any subject.
        sphyr_jax.data.datasets.DatasetError: for a malformed subject file.
        OSError: if writing fails; no results file is then changed.
    """
    unknown = [m for m in models if m not in MODELS + (ANSWER,)]
    if unknown:
        raise ValueError(f"unknown baselines {unknown}; choose from {MODELS + (ANSWER,)}")
    root = pathlib.Path(dataset_dir)
    subjects = [s for s in list_subjects()
                if (root / f"{s}.jsonl").is_file() or (root / f"{s}.json").is_file()]
    if not subjects:
        raise ValueError(f"{root}: no subject files (<subject>.jsonl or <subject>.json)")
    data = {s: load_subject(root, s) for s in subjects}
    texts: dict[pathlib.Path, str] = {}
    for model in models:
        for subject in subjects:
            path = pathlib.Path(results_root) / model / f"{subject}_results.json"
            texts[path] = _json_text(baseline_records(model, subject, data[subject], seed))
    created = []
    try:
        for model in models:
            folder = pathlib.Path(results_root) / model
            for parent in reversed([folder, *folder.parents]):
                if not parent.exists():
                    parent.mkdir()
                    created.append(parent)
        atomic_write_files(texts)
    except BaseException:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                pass
        raise
    return list(texts)
