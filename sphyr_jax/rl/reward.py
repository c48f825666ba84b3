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
:func:`sphyr_jax.rl.datasets.prompt_dataset` builds the matching training set
(a generated corpus) or test set (the benchmark).

float64 is required: making a :class:`TopologyReward` (and the first call of
:func:`topology_reward`) turns it on.
"""

from __future__ import annotations

import asyncio
import math

from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY_3D
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.labels import read_label
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


def _labels(label, reward_model, n: int) -> list | None:
    """The samples' labels, from a ``label`` column or a veRL ``reward_model`` column."""
    if label is not None:
        return _column("label", label, n)
    if reward_model is not None:
        return [m.get("ground_truth") if isinstance(m, dict) else None
                for m in _column("reward_model", reward_model, n)]
    return None


def column_records(completions, prompts=None, input_grid=None, ground_truth=None,
                   gravity_dir=None, subject=None, optimum=None, label=None,
                   reward_model=None) -> list[dict]:
    """The records of a trainer's columns, one per completion (columns checked).

    The sample comes from the ``ground_truth`` column and its companions when
    present, else from the ``label`` column, else from a veRL export's
    ``reward_model`` column (see :meth:`TopologyReward.__call__`).
    """
    if completions is None:
        raise ValueError("topology_reward needs completions")
    n = len(completions)
    labels = _labels(label, reward_model, n) if ground_truth is None else None
    if labels is not None:
        records = [read_label(text) for text in labels]
        for record, completion in zip(records, completions, strict=True):
            record["completion"] = completion
        return records
    answers = _column("ground_truth", ground_truth, n)
    if any(a is None for a in answers):
        raise ValueError("topology_reward needs a ground_truth column (the dataset "
                         "answers) or a label column")
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
                        "gravity_dir": direction, "optimum": optima[i],
                        "subject": subjects[i]})
    return records


def row_record(row: dict) -> dict:
    """The sample record of one dataset row (no completion): a prompt dataset's
    columns, an OpenRLHF export's ``label`` or a veRL export's ``reward_model``
    (whose ``extra_info["optimum"]`` is used when the label has none).

    Raises:
        ValueError: the row has none of them, or an unreadable label.
    """
    columns = {name: [row[name]] for name in ("input_grid", "ground_truth", "gravity_dir",
                                              "subject", "optimum", "label", "reward_model")
               if row.get(name) is not None}
    (record,) = column_records([None], **columns)
    del record["completion"]
    record.pop("prompt", None)
    extra = row.get("extra_info")
    if record.get("optimum") is None and isinstance(extra, dict):
        record["optimum"] = extra.get("optimum")
    return record


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
                gravity_dir=None, subject=None, optimum=None, label=None,
                reward_model=None) -> list[dict]:
        """The records of a trainer's call, one per completion (:func:`column_records`)."""
        return column_records(completions, prompts, input_grid, ground_truth, gravity_dir,
                              subject, optimum, label, reward_model)

    def metrics(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
                gravity_dir=None, subject=None, optimum=None, label=None, reward_model=None,
                **kwargs) -> list[dict]:
        """Every metric of each completion (same arguments as :meth:`__call__`)."""
        records = self.records(prompts, completions, input_grid, ground_truth, gravity_dir,
                               subject, optimum, label, reward_model)
        return score_records(records, cache=self.cache, num_devices=self.num_devices)

    def __call__(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
                 gravity_dir=None, subject=None, optimum=None, label=None, reward_model=None,
                 log_metric=None, **kwargs) -> list[float]:
        """One reward per completion: its topology score, 0 for an invalid grid.

        Args:
            prompts: the prompts (text or chat messages); an ``input_grid``
                missing from the columns is read from them (their last grid).
            completions: text, or chat messages
                (``[{"role": "assistant", "content": ...}]``: the last
                assistant message is the answer).
            input_grid: the masked grids (text or token lists), one per completion.
            ground_truth: the dataset answers (text or token lists).
            gravity_dir: optional (row, col) load directions (default down).
            subject: optional subject names (``*_3d`` reads text grids as voxels).
            optimum: optional stored optima of the samples
                (:func:`sphyr_jax.scoring.records.optimum_fields`): a sample
                whose stored optimum is current is not optimised.
            label: the samples' labels
                (:func:`sphyr_jax.scoring.labels.problem_label`), read when
                there is no ``ground_truth`` column.
            reward_model: a veRL export's column (its ``ground_truth`` is the
                label), read when there is neither.
            log_metric: TRL's ``log_metric(name, value)``: when given, the
                batch's ``topology_reward/valid_share``,
                ``topology_reward/load_carrying_share`` and
                ``topology_reward/topology_score`` (the mean) are logged.
            **kwargs: whatever else the trainer passes (other columns,
                ``completion_ids``, ``trainer_state``, ``log_extra``,
                ``environments``...), ignored.

        Returns:
            One float per completion, in order.

        Raises:
            ValueError: a column is missing or does not hold one entry per
                completion, or a label is unreadable (a bad completion never
                raises: it scores 0).
        """
        metrics = self.metrics(prompts, completions, input_grid, ground_truth, gravity_dir,
                               subject, optimum, label, reward_model)
        rewards = [reward_of(m) for m in metrics]
        if log_metric is not None and metrics:
            n = len(metrics)
            log_metric(f"{self.__name__}/valid_share",
                       sum(bool(m.get("valid_output_grid")) for m in metrics) / n)
            log_metric(f"{self.__name__}/load_carrying_share",
                       sum(bool(m.get("load_carrying")) for m in metrics) / n)
            log_metric(f"{self.__name__}/topology_score", sum(rewards) / n)
        return rewards


class AsyncTopologyReward(TopologyReward):
    """:class:`TopologyReward` as a coroutine: ``await reward(...)``.

    TRL runs async reward functions together on its event loop; the scoring
    runs in a worker thread meanwhile, so another async reward (a judge
    model's request, say) proceeds beside it.  Same arguments and results as
    :meth:`TopologyReward.__call__`.
    """

    async def __call__(self, *args, **kwargs) -> list[float]:
        return await asyncio.to_thread(super().__call__, *args, **kwargs)


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
