"""The samples an episode serves: dataset records turned into prompts, in the published order.

A :class:`Sample` is everything one episode (or one row of a training set)
needs: the prompt a model is shown, the masked grid, the dataset answer and
the load direction the answer is scored with.  :func:`build_samples` makes
them from one subject's records exactly as the evaluation harness does (the
published order: shuffled once with ``random.Random(seed)``, the first
``sample_count`` kept; clockwise turns with their load direction; few-shot
examples of the same subject), through :mod:`sphyr_jax.evaluation.prompts`.
:func:`replay_samples` rebuilds the samples of a stored results file instead
(its prompts and answers, in its order).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from sphyr_jax.evaluation.prompts import (
    DEFAULT_SEED,
    PromptSpec,
    build_prompt,
    few_shot_examples,
    is_hard_subject,
    rotate,
    sample_order,
)
from sphyr_jax.problem.grids import MASK, as_grid, check_rectangular, extract_grid, grid_to_text
from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY, gravity_from_folder

_ROTATIONS = re.compile(r"(\d)_rotations")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One masked sample, ready to serve.

    Attributes:
        subject: the subject it comes from, e.g. ``"full_easy"``.
        index: its position in the served order (what ``sample_index`` selects).
        record_index: the dataset record's own ``index`` (None when unknown).
        prompt: the prompt a model is shown.
        input_grid: the masked grid as text (rows on lines, cells separated by spaces).
        ground_truth: the dataset answer as text.
        gravity_dir: the (row, col) load direction it is scored with.
        rotation_count: clockwise quarter turns applied to the record.
        optimum: the record's stored optimum (a corpus's records carry one;
            None for a turned sample, whose problem is another), used by
            scoring while its key is the sample's.
        rows, cols: the grid's size (derived).
        masked_cells: the number of ``V`` cells to fill (derived).
    """

    subject: str
    index: int
    record_index: int | None
    prompt: str
    input_grid: str
    ground_truth: str
    gravity_dir: tuple[float, ...] = DEFAULT_GRAVITY
    rotation_count: int = 0
    optimum: dict | None = dataclasses.field(default=None, compare=False, repr=False)
    rows: int = dataclasses.field(init=False)
    cols: int = dataclasses.field(init=False)
    masked_cells: int = dataclasses.field(init=False)

    def __post_init__(self):
        grid = as_grid(self.input_grid)
        rows, cols = check_rectangular(grid)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "cols", cols)
        object.__setattr__(self, "masked_cells", sum(t == MASK for row in grid for t in row))

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the grid."""
        return self.rows, self.cols

    @property
    def cell_values(self) -> str:
        """``"density"`` for the hard subjects (one-decimal values), else ``"binary"``."""
        return "density" if is_hard_subject(self.subject) else "binary"


def _direction(record: dict) -> tuple[float, ...]:
    gravity = record.get("gravity_dir")
    return DEFAULT_GRAVITY if gravity is None else tuple(float(v) for v in gravity)


def build_samples(records: Sequence[dict], subject: str, spec: PromptSpec | None = None,
                  sample_count: int | None = None, seed: int = DEFAULT_SEED) -> list[Sample]:
    """The samples of one subject in the published order.

    Args:
        records: the subject's dataset records (``input_grid``, ``ground_truth``,
            optionally ``index`` and ``gravity_dir``).
        subject: the subject name (sets the fill rule of the prompt).
        spec: prompt style or template, clockwise turns and few-shot count
            (default: the published prompt, no turns, no examples).
        sample_count: keep the first N after shuffling (None: all).
        seed: the shuffle's seed (the published order is seed 42).

    Returns:
        One :class:`Sample` per kept record; ``index`` is its position.
    """
    spec = spec if spec is not None else PromptSpec()
    ordered = rotate(sample_order(records, sample_count, seed), spec.rotations)
    pool = rotate(records, spec.rotations) if spec.few_shot else []
    samples = []
    for position, record in enumerate(ordered):
        gravity = _direction(record)
        examples = few_shot_examples(pool, record, spec.few_shot, seed)
        samples.append(Sample(
            subject=subject,
            index=position,
            record_index=record.get("index"),
            prompt=build_prompt(record["input_grid"], subject, spec, examples, gravity),
            input_grid=grid_to_text(as_grid(record["input_grid"])),
            ground_truth=grid_to_text(as_grid(record["ground_truth"])),
            gravity_dir=gravity,
            rotation_count=spec.rotations,
            optimum=record.get("optimum") if spec.rotations % 4 == 0 else None,
        ))
    return samples


def replay_samples(records: Sequence[dict], subject: str, folder: str = "") -> list[Sample]:
    """The samples a stored run was scored on, from its own results records.

    Each record's stored ``prompt`` is served as it is and its masked grid is
    the last grid in that prompt; the load direction is the record's
    ``gravity_dir``, else the one the folder name implies (``*_N_rotations``).

    Args:
        records: the stored records (``prompt``, ``ground_truth``; optionally
            ``gravity_dir``), in stored order.
        subject: their subject.
        folder: the results folder's name (its rotation tag, if any, sets the
            direction and ``rotation_count``).

    Returns:
        One :class:`Sample` per record whose prompt holds a grid.
    """
    tag = _ROTATIONS.search(folder)
    rotations = int(tag.group(1)) % 4 if tag else 0
    default = gravity_from_folder(folder)
    samples = []
    for record in records:
        grid = extract_grid(record.get("prompt") or "")
        if grid is None or record.get("ground_truth") is None:
            continue
        gravity = record.get("gravity_dir")
        samples.append(Sample(
            subject=subject,
            index=len(samples),
            record_index=record.get("index"),
            prompt=record["prompt"],
            input_grid=grid_to_text(grid),
            ground_truth=grid_to_text(as_grid(record["ground_truth"])),
            gravity_dir=tuple(float(v) for v in (default if gravity is None else gravity)),
            rotation_count=rotations,
        ))
    return samples
