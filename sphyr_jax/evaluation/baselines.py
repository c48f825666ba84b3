"""Baseline "models" that fill masked cells without reasoning, as stored results files.

Each baseline answers every record of every subject of a dataset folder and is
written like a real model's results: ``<results_root>/<model>/<subject>_results.json``,
a JSON list of ``{"subject", "prompt", "ground_truth", "completion"}`` records
(plus ``"gravity_dir"`` when the dataset record has one), grids as
newline/space text, the prompt the benchmark's own (:func:`baseline_prompt`).
The baselines:

* ``empty``: every ``V`` cell becomes ``0`` (``0.0`` in hard subjects);
* ``solid``: every ``V`` cell becomes ``1`` (``1.0``);
* ``random``: seeded coin flips (easy) or uniform one-decimal values (hard);
* ``copy_input``: the input grid returned unchanged, ``V`` cells included;
* ``retrieval`` (a model backend only, :class:`RetrievalIndex`): the masked
  cells copied from the answer of the most similar *other* record of the
  subject, similarity being the number of visible cells on which that answer
  agrees with the input; ``retrieval_lookup`` answers only from a record
  whose answer agrees with *every* visible cell (the empty fill otherwise),
  so its scores measure how much of the benchmark is answerable by lookup.
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
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np

from sphyr_jax.data.datasets import is_hard, list_subjects, load_subject, subject_rng
from sphyr_jax.evaluation.prompts import PromptSpec, build_prompt
from sphyr_jax.io import commit_files
from sphyr_jax.problem.grids import (
    MASK,
    as_grid,
    check_rectangular,
    grid_to_text,
    parse_number,
)

Baseline = Literal["empty", "solid", "random", "copy_input", "answer"]
MODELS = ("empty", "solid", "random", "copy_input")
ANSWER = "answer"  # opt-in: the dataset answer itself, the ceiling a model can reach
_DEFAULT_SPEC = PromptSpec()
_DIRECTION_SPEC = PromptSpec(style="load_direction")


def baseline_prompt(record: dict, subject: str, spec: PromptSpec | None = None) -> str:
    """The prompt stored with a baseline's answer to one dataset record.

    Built by :func:`sphyr_jax.evaluation.prompts.build_prompt`, the prompt
    every model is shown: by default the published prompt, or its
    ``load_direction`` style when the record carries its own ``gravity_dir``
    (the published prompt cannot name a diagonal or upward load).  Its last
    grid is the input grid, so :func:`sphyr_jax.extract_grid` reads it back.

    Args:
        record: a dataset record (``input_grid``, optional ``gravity_dir``).
        subject: the subject name (sets the fill rule).
        spec: another prompt configuration for every record (its rotations
            and few-shot count are ignored: the baseline answers the record
            as stored).
    """
    gravity = record.get("gravity_dir")
    if spec is None:
        spec = _DEFAULT_SPEC if gravity is None else _DIRECTION_SPEC
    return build_prompt(record["input_grid"], subject, spec, (), gravity)


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


def complete(model: Baseline, input_grid, hard: bool, rng: np.random.Generator | None = None):
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

    def nearest(self, input_grid, exclude: int | None = None, *,
                exact: bool = False) -> int | None:
        """Position (in the records given) of the most similar answer; None if no
        other record has the input's shape (with ``exact``: if no other record's
        answer agrees with every visible cell of the input)."""
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
        if agree[best] < 0 or (exact and agree[best] < int(visible.sum())):
            return None
        return int(positions[best])

    def fill(self, input_grid, exclude: int | None = None, *,
             exact: bool = False) -> list | None:
        """The input with its ``V`` cells copied from the nearest answer (token
        rows); None when no other record has the input's shape (with ``exact``:
        when no other record's answer agrees with every visible cell, the lookup
        :data:`~sphyr_jax.evaluation.backends.BASELINE_KINDS`'s
        ``retrieval_lookup`` makes)."""
        best = self.nearest(input_grid, exclude, exact=exact)
        if best is None:
            return None
        grid = as_grid(input_grid)
        return fill_cells(grid, np.array(self._answers[best], dtype=object))


def baseline_records(model: Baseline, subject: str, records: Sequence[dict], *, seed: int = 0,
                     spec: PromptSpec | None = None) -> list[dict]:
    """Result records of one baseline on one subject's dataset records.

    Args:
        model: one of :data:`MODELS`, or :data:`ANSWER`.
        subject: the subject name.
        records: the subject's dataset records, in stored order.
        seed: seed of the ``random`` baseline (its stream is
            :func:`sphyr_jax.data.datasets.subject_rng` of the seed and subject).
        spec: the prompt configuration (see :func:`baseline_prompt`).
    """
    hard = is_hard(subject)
    rng = subject_rng(seed, subject) if model == "random" else None
    out = []
    for record in records:
        gravity = record.get("gravity_dir")
        row = {
            "subject": subject,
            "prompt": baseline_prompt(record, subject, spec),
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


def write_baseline_results(dataset_dir, results_root, *, seed: int = 0,
                           models: Sequence[Baseline] = MODELS) -> list[pathlib.Path]:
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
            texts[path] = _json_text(baseline_records(model, subject, data[subject], seed=seed))
    commit_files(texts)
    return list(texts)
