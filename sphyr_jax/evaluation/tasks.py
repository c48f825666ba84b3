"""The samples an evaluation asks: tasks of a dataset's subjects or of a stored run.

A subject's tasks are its records in the published order (shuffled once with
``random.Random(seed)``, the first ``sample_count`` kept;
:func:`~sphyr_jax.evaluation.prompts.sample_order`), turned clockwise
``spec.rotations`` times with their load direction, each with its prompt
(:func:`~sphyr_jax.evaluation.prompts.build_prompt`; few-shot examples come
from the subject's other records, turned alike).  :func:`replay_tasks` serves
the records of a stored run instead: its prompts and answers exactly as
stored, so a new model is measured on the very samples of a published column.
Results folders are named here too (:func:`results_folder`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence

from sphyr_jax.data.datasets import list_subjects, load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.backends import Pool, Query
from sphyr_jax.evaluation.prompts import (
    DEFAULT_SAMPLE_COUNT,
    DEFAULT_SEED,
    PromptSpec,
    build_prompt,
    few_shot_examples,
    rotate,
    sample_order,
)
from sphyr_jax.io import CorruptFileError
from sphyr_jax.problem.grids import as_grid, extract_grid, grid_ndim, grid_to_text
from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY, gravity_from_folder
from sphyr_jax.scoring.results import AGGREGATED_SUFFIX, RESULTS_SUFFIX, read_results

_DOWN = (1, 0)
DEFAULT_SPEC = PromptSpec()  # the published prompt, no rotation, zero-shot
_SUFFIX = re.compile(r"(?:_[0-3]_rotations)?(?:_few_shot_\d+)?"
                     r"(?:_(?:physics_enhanced|physics_neutral|load_direction|custom)_prompt)?$")


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """One sample to ask: what the model is shown and the answer it is scored against.

    Attributes:
        query: the prompt and what it was made from (see
            :class:`~sphyr_jax.evaluation.backends.Query`).
        ground_truth: the dataset answer as text (rows on lines), turned like
            the query.
        position: rank in the subject's published order (0-based).
        grid_in_prompt: whether the last grid of the prompt is the masked grid
            (else records also store ``input_grid``, e.g. for a custom template).
    """

    query: Query
    ground_truth: str
    position: int
    grid_in_prompt: bool = True

    @property
    def subject(self) -> str:
        return self.query.subject

    @property
    def prompt(self) -> str:
        return self.query.prompt


def _direction(value) -> tuple | None:
    if value is None:
        return None
    return tuple(int(v) if float(v).is_integer() else float(v) for v in value)


def subject_tasks(records: Sequence[dict], subject: str, *, spec: PromptSpec = DEFAULT_SPEC,
                  sample_count: int | None = DEFAULT_SAMPLE_COUNT,
                  seed: int = DEFAULT_SEED) -> list[Task]:
    """The tasks of one subject, in the published order.

    Args:
        records: the subject's dataset records (``input_grid``, ``ground_truth``,
            optional ``index`` and ``gravity_dir``), in stored order.
        subject: the subject name.
        spec: prompt style, template, rotations and few-shot count.
        sample_count: samples kept after the shuffle (None: all).
        seed: the shuffle's seed (42 in the published runs).

    Returns:
        ``min(sample_count, len(records))`` tasks.  ``random.Random(seed).shuffle``
        permutes by length alone, so the order equals
        ``sample_order(records, sample_count, seed)``.
    """
    turned = tuple(rotate(records, spec.rotations))  # few-shot examples and retrieval see the turn
    order = sample_order(list(range(len(turned))), sample_count, seed)
    tasks = []
    for rank, i in enumerate(order):
        record = turned[i]
        gravity = _direction(record.get("gravity_dir"))
        examples = few_shot_examples(turned, record, spec.few_shot, seed)
        prompt = build_prompt(record["input_grid"], subject, spec, examples, gravity or _DOWN)
        query = Query(prompt=prompt, subject=subject, input_grid=record["input_grid"],
                      gravity_dir=gravity, index=record.get("index"), pool=Pool(turned, i))
        shown = spec.template is None or _last_grid_is(prompt, record["input_grid"])
        answer = record["ground_truth"]
        if not (isinstance(answer, list) and all(isinstance(r, list) for r in answer)):
            answer = as_grid(answer)  # the loaders already give token rows
        tasks.append(Task(query, grid_to_text(answer), rank, shown))
    return tasks


def _last_grid_is(prompt: str, grid) -> bool:
    grid = as_grid(grid)
    return extract_grid(prompt, ndim=grid_ndim(grid)) == grid


def replay_tasks(results_file, *, sample_count: int | None = None) -> list[Task]:
    """The samples of a stored run: prompts and answers exactly as stored.

    Args:
        results_file: ``<folder>/<subject>_results.json`` of any model; the
            load direction is a record's ``gravity_dir``, else the folder's
            rotation tag (``*_1_rotations`` ...), else down.
        sample_count: keep the first N records (None: all).

    Raises:
        CorruptFileError: the file is not a list of records holding a prompt
            with a grid and a ground truth.
    """
    path = pathlib.Path(results_file)
    subject = path.name[: -len(RESULTS_SUFFIX)] if path.name.endswith(RESULTS_SUFFIX) else path.stem
    stored = read_results(path)
    if sample_count is not None:
        stored = stored[: int(sample_count)]
    folder_gravity = gravity_from_folder(path.parent.name)
    folder_gravity = None if tuple(folder_gravity) == DEFAULT_GRAVITY else folder_gravity
    rows = []
    for i, record in enumerate(stored):
        prompt, answer = record.get("prompt"), record.get("ground_truth")
        if not isinstance(prompt, str) or not isinstance(answer, str):
            raise CorruptFileError(f"{path}: record {i} has no prompt or ground_truth text", path)
        ndim = grid_ndim(as_grid(answer)) if extract_grid(answer) is not None else 2
        grid = extract_grid(prompt, ndim=ndim)
        if grid is None:
            raise CorruptFileError(f"{path}: record {i}: no grid in its prompt", path)
        rows.append((record, prompt, answer, grid))
    pool = tuple({"index": r.get("index", i), "input_grid": grid, "ground_truth": answer}
                 for i, (r, _, answer, grid) in enumerate(rows))
    tasks = []
    for i, (record, prompt, answer, grid) in enumerate(rows):
        gravity = _direction(record.get("gravity_dir") or folder_gravity)
        query = Query(prompt=prompt, subject=subject, input_grid=grid, gravity_dir=gravity,
                      index=record.get("index"), pool=Pool(pool, i))
        tasks.append(Task(query, answer, i))
    return tasks


def replay_suffix(folder) -> str:
    """The experiment suffix of a stored run's folder name (``_3_rotations`` ...; '' for none)."""
    return _SUFFIX.search(pathlib.Path(folder).name).group(0)


def replay_subjects(folder) -> list[str]:
    """Subjects with a results file in a stored run's folder, sorted."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"no such results folder: {folder}")
    return sorted(p.name[: -len(RESULTS_SUFFIX)] for p in folder.glob("*" + RESULTS_SUFFIX)
                  if not p.name.endswith(AGGREGATED_SUFFIX))


def dataset_subjects(source) -> list[str]:
    """Subjects present in a local dataset folder (all 16 2D ones for a hub source or a file)."""
    root = pathlib.Path(source)
    if not root.is_dir():
        return list_subjects()
    found = [s for s in list_subjects() + list_subjects(3)
             if any((root / f"{s}{ext}").exists() for ext in (".jsonl", ".json", ".parquet",
                                                              ".arrow", ""))]
    if not found:
        raise UserInputError(f"{root}: no subject files (<subject>.jsonl or <subject>.json)")
    return found


def model_folder_name(model: str) -> str:
    """A model name as a folder name: '/' and ':' become '_' (the published layout)."""
    return model.replace("/", "_").replace(":", "_")


def results_folder(results_root, model: str, suffix: str = "") -> pathlib.Path:
    """``<results_root>/<model folder name><suffix>``."""
    return pathlib.Path(results_root) / (model_folder_name(model) + suffix)


def load_tasks(dataset, subjects: Sequence[str] | None = None, *,
               spec: PromptSpec = DEFAULT_SPEC, sample_count: int | None = DEFAULT_SAMPLE_COUNT,
               seed: int = DEFAULT_SEED) -> dict[str, list[Task]]:
    """``{subject: tasks}`` of a dataset (folder, file or hub name; see
    :func:`sphyr_jax.data.datasets.load_subject`); all subjects present when
    ``subjects`` is None."""
    names = list(subjects) if subjects else dataset_subjects(dataset)
    return {s: subject_tasks(load_subject(dataset, s), s, spec=spec, sample_count=sample_count,
                             seed=seed)
            for s in names}
