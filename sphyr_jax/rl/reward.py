"""Completions scored as rewards: TRL's reward-function signature, one batched call.

:func:`topology_reward` takes what a GRPO trainer passes a reward function
(``prompts``, ``completions`` and the dataset's columns, one entry per
completion) and returns one float per completion: its topology score, or 0
for a completion that is not a complete grid.  The columns become records and
are scored like every record of the project
(:func:`sphyr_jax.scoring.records.score_records`: each distinct sample read
and its answer analysed once, identical answers scored once, every completion
one batched finite-element solve), so a completion scored here carries the
same metric fields and values as through a rescore, the evaluation harness or
the training layer.  Optima are looked up in an
:class:`~sphyr_jax.topopt.optimum.OptimumCache` that lives as long as the
reward function (memory bounded by ``max_memory_entries``, optionally a
folder).  :meth:`TopologyReward.metrics` gives every metric of each completion
(the environment and the feedback experiment score the same way).
:func:`prompt_dataset` builds the training set: a ``datasets.Dataset`` whose
``prompt`` column holds the benchmark's prompts and whose other columns are
what the reward function reads.

float64 is required: making a :class:`TopologyReward` (and the first call of
:func:`topology_reward`) turns it on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sphyr_jax.data.datasets import list_subjects, load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.prompts import DEFAULT_SEED, PromptSpec, Style
from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY_3D
from sphyr_jax.rl.samples import build_samples
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.records import MAX_COMPLETION_CHARS as MAX_COMPLETION_CHARS
from sphyr_jax.scoring.records import completion_text as completion_text
from sphyr_jax.scoring.records import score_records
from sphyr_jax.topopt.optimum import DEFAULT_MAX_MEMORY_ENTRIES, OptimumCache
from sphyr_jax.topopt.options import Yardstick

REWARD_METRIC = "topology_score"


def reward_of(metrics: dict) -> float:
    """The reward of a scored completion: its topology score, 0 unless its grid is valid."""
    if not metrics.get("valid_output_grid"):
        return 0.0
    value = metrics.get(REWARD_METRIC)
    return float(value) if value is not None and math.isfinite(value) else 0.0


# ----------------------------------------------------------------------------
# The reward function.


def _column(name: str, values, n: int) -> list:
    if values is None:
        return [None] * n
    sized = hasattr(values, "__len__") and not isinstance(values, (str, bytes, dict))
    if not sized or len(values) != n:
        raise ValueError(f"column {name!r} must hold one entry per completion ({n}), "
                         f"got {type(values).__name__}"
                         + (f" of length {len(values)}" if sized else ""))
    return list(values)


def _gravity(value, row: int):
    if value is None:
        return None
    try:
        direction = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        direction = ()
    if len(direction) not in (2, 3) or not all(map(math.isfinite, direction)) or not any(
            direction):
        raise ValueError(f"gravity_dir of completion {row} must be a non-zero (row, col) or "
                         f"(layer, row, col) step, got {value!r}")
    return direction


class TopologyReward:
    """A reward function with its own optimum cache (see :func:`topology_reward`).

    Args:
        cache: an optimum cache to use (wins over the other arguments).
        cache_dir: folder that keeps optima between runs (None: memory only).
        yardstick: ``"reference"`` (the published optimum) or ``"strong"``.
        num_devices: devices batches are split over (None: all local).
        max_memory_entries: optima the cache keeps in memory, least recently
            used dropped first (None: no bound; the folder keeps them all).

    Examples:
        In a trainer, ``GRPOTrainer(model=..., reward_funcs=TopologyReward(cache_dir=...),
        train_dataset=prompt_dataset(...))``; called directly, as the trainer calls it:

        >>> import sphyr_jax as sj
        >>> from sphyr_jax.data import embedded, load_subject
        >>> from sphyr_jax.rl import TopologyReward
        >>> record = load_subject(embedded("dataset"), "1_random_cell_easy")[0]
        >>> reward = TopologyReward()
        >>> scores = reward(prompts=["", ""],
        ...                 completions=[sj.grid_to_text(record["ground_truth"]), "no grid"],
        ...                 input_grid=[record["input_grid"]] * 2,
        ...                 ground_truth=[record["ground_truth"]] * 2)
        >>> [round(s, 3) for s in scores]
        [1.0, 0.0]
    """

    def __init__(self, cache: OptimumCache | None = None, cache_dir=None, *,
                 yardstick: Yardstick = "reference", num_devices: int | None = None,
                 max_memory_entries: int | None = DEFAULT_MAX_MEMORY_ENTRIES):
        enable_x64()  # an entry point: float64 before any work
        self.cache = cache if cache is not None else OptimumCache(
            cache_dir, yardstick=yardstick, num_devices=num_devices,
            max_memory_entries=max_memory_entries)
        self.num_devices = num_devices
        self.__name__ = "topology_reward"  # trainers log a reward under its function's name

    def records(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
                gravity_dir=None, subject=None, optimum=None) -> list[dict]:
        """The records of a trainer's call, one per completion (columns checked; see
        :meth:`__call__`)."""
        if completions is None:
            raise ValueError("topology_reward needs completions")
        n = len(completions)
        answers = _column("ground_truth", ground_truth, n)
        if any(a is None for a in answers):
            raise ValueError("topology_reward needs a ground_truth column (the dataset answers)")
        inputs = _column("input_grid", input_grid, n)
        prompts = _column("prompts", prompts, n)
        directions = [_gravity(g, i) for i, g in enumerate(_column("gravity_dir", gravity_dir, n))]
        subjects = _column("subject", subject, n)
        optima = _column("optimum", optimum, n)
        records = []
        for i in range(n):
            direction = directions[i]
            if direction is None and isinstance(subjects[i], str) and subjects[i].endswith("_3d"):
                direction = DEFAULT_GRAVITY_3D
            records.append({"completion": completions[i], "ground_truth": answers[i],
                            "input_grid": inputs[i], "prompt": prompts[i],
                            "gravity_dir": direction, "optimum": optima[i]})
        return records

    def metrics(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
                gravity_dir=None, subject=None, optimum=None, **kwargs) -> list[dict]:
        """Every metric of each completion (same arguments as :meth:`__call__`)."""
        records = self.records(prompts, completions, input_grid, ground_truth, gravity_dir,
                               subject, optimum)
        return score_records(records, cache=self.cache, num_devices=self.num_devices)

    def __call__(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
                 gravity_dir=None, subject=None, optimum=None, **kwargs) -> list[float]:
        """One reward per completion: its topology score, 0 for an invalid grid.

        Args:
            prompts: the prompts (text or chat messages); an ``input_grid``
                missing from the columns is read from them (their last grid).
            completions: text, or chat messages
                (``[{"role": "assistant", "content": ...}]``).
            input_grid: the masked grids (text or token lists), one per completion.
            ground_truth: the dataset answers (text or token lists).
            gravity_dir: optional (row, col) load directions (default down).
            subject: optional subject names (``*_3d`` reads text grids as voxels).
            optimum: optional stored optima of the samples
                (:func:`sphyr_jax.scoring.records.optimum_fields`): a sample
                whose stored optimum is current is not optimised.
            **kwargs: whatever else the trainer passes (other columns,
                ``completion_ids``, ``trainer_state``...), ignored.

        Returns:
            One float per completion, in order.

        Raises:
            ValueError: a column is missing or does not hold one entry per
                completion (a bad completion never raises: it scores 0).
        """
        return [reward_of(m) for m in self.metrics(prompts, completions, input_grid,
                                                   ground_truth, gravity_dir, subject, optimum)]


_SHARED: TopologyReward | None = None


def topology_reward(prompts=None, completions=None, **columns) -> list[float]:
    """TRL's reward function: each completion's topology score (0 for an invalid grid).

    Called by a trainer as ``topology_reward(prompts=..., completions=...,
    input_grid=[...], ground_truth=[...], gravity_dir=[...], subject=[...],
    ...)`` with one entry per completion; optima are computed once per distinct
    sample and the last :data:`~sphyr_jax.topopt.optimum.DEFAULT_MAX_MEMORY_ENTRIES`
    are kept in memory for the life of the process (a long run's memory stays
    flat).  For a cache on disk, another bound or the other yardstick use a
    :class:`TopologyReward` instance.  See :meth:`TopologyReward.__call__`.
    """
    global _SHARED
    if _SHARED is None:
        _SHARED = TopologyReward()
    return _SHARED(prompts, completions, **columns)


# ----------------------------------------------------------------------------
# The training set.


def prompt_dataset(dataset_dir, subjects: Sequence[str] | None = None, *,
                   rotations: Sequence[int] = (0,), style: Style = "default",
                   template: str | None = None, few_shot: int = 0,
                   sample_count: int | None = None, seed: int = DEFAULT_SEED,
                   conversational: bool = False):
    """A ``datasets.Dataset`` of prompts with the columns :func:`topology_reward` reads.

    Args:
        dataset_dir: a dataset folder, subject file or hub name
            (:func:`sphyr_jax.data.datasets.load_subject`).
        subjects: subject names (default: the 16 of the benchmark).
        rotations: clockwise quarter turns; every subject appears once per turn.
        style: prompt style (:data:`sphyr_jax.evaluation.prompts.STYLES`).
        template: a prompt template with a ``{GRID}`` placeholder (wins over ``style``).
        few_shot: solved examples of the same subject in each prompt.
        sample_count: first N samples of each subject in the published order (None: all).
        seed: the order's shuffle seed (published: 42).
        conversational: ``prompt`` as chat messages (``[{"role": "user", ...}]``).

    Returns:
        A dataset with columns ``prompt``, ``input_grid`` and ``ground_truth``
        (text), ``gravity_dir`` ([row, col]), ``subject``, ``rotation_count``,
        ``sample_index`` (position in the published order) and ``index``
        (the dataset record's).

    Raises:
        UserInputError: an unknown subject, style or rotation, or a missing dataset.
    """
    import datasets

    names = list(subjects) if subjects is not None else list_subjects()
    known = set(list_subjects())
    for name in names:
        if name not in known:
            raise UserInputError(f"unknown subject {name!r}; subjects: {sorted(known)}")
    rows = []
    for name in names:
        records = load_subject(dataset_dir, name)
        for turns in rotations:
            spec = PromptSpec(style=style, template=template, rotations=int(turns),
                              few_shot=few_shot)
            for s in build_samples(records, name, spec, sample_count, seed):
                rows.append({
                    "prompt": [{"role": "user", "content": s.prompt}] if conversational
                    else s.prompt,
                    "input_grid": s.input_grid,
                    "ground_truth": s.ground_truth,
                    "gravity_dir": [float(v) for v in s.gravity_dir],
                    "subject": s.subject,
                    "rotation_count": s.rotation_count,
                    "sample_index": s.index,
                    "index": s.record_index,
                })
    return datasets.Dataset.from_list(rows)
