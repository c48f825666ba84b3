"""Completions scored as rewards: TRL's reward-function signature, one batched call.

:func:`topology_reward` takes what a GRPO trainer passes a reward function
(``prompts``, ``completions`` and the dataset's columns, one entry per
completion) and returns one float per completion: its topology score, or 0
for a completion that is not a complete grid.  All completions of a call are
scored together (:func:`sphyr_jax.scoring.metrics.score_batch`): each
distinct sample is read and its answer analysed once, each optimum is looked
up once in an :class:`~sphyr_jax.topopt.optimum.OptimumCache` that lives as
long as the reward function (memory, optionally a folder), and every
completion costs one batched finite-element solve.

:func:`score_completions` is the one scoring path of this package (the
reward function, the environment and the feedback experiment all use it): it
returns every published metric of each completion, the static (grid-only)
ones, ``valid_output_grid`` among them, and the structural ones
(:func:`_metrics_for` assembles them).
:func:`sphyr_jax.rl.datasets.prompt_dataset` builds the matching training set
(a generated corpus) or test set (the benchmark).

float64 is required: making a :class:`TopologyReward` (and the first call of
:func:`topology_reward`) turns it on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY_3D
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.metrics import CompletionMetrics, ScoreItem, score_batch
from sphyr_jax.topopt.optimum import OptimumCache

MAX_COMPLETION_CHARS = 100_000
"""Longer completions are read from their last this many characters (the
last grid in a completion is its answer; a 20 x 20 answer is ~1,600)."""

REWARD_METRIC = "topology_score"


# ----------------------------------------------------------------------------
# Completions as text.


def _content(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal parts: keep the text ones
        parts = [p if isinstance(p, str) else p.get("text") for p in content
                 if isinstance(p, str) or (isinstance(p, dict) and p.get("type", "text") == "text")]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def completion_text(completion) -> str:
    """The text of a completion given as a string or as chat messages.

    Chat completions (``[{"role": "assistant", "content": ...}]``) give the
    last assistant message's content (text parts joined).  Anything else
    gives ``""``.  Text longer than :data:`MAX_COMPLETION_CHARS` is cut to
    its tail.
    """
    if isinstance(completion, str):
        text = completion
    elif isinstance(completion, dict):
        text = _content(completion.get("content"))
    elif (isinstance(completion, (list, tuple)) and completion
          and all(isinstance(m, dict) for m in completion)):
        replies = [m for m in completion if m.get("role", "assistant") == "assistant"]
        text = _content((replies or list(completion))[-1].get("content"))
    else:
        text = ""
    return text[-MAX_COMPLETION_CHARS:]


# ----------------------------------------------------------------------------
# Scoring.


def _metrics_for(metrics: CompletionMetrics) -> dict:
    """Every published metric of one completion, JSON-ready (non-finite numbers are None).

    The one place the reported metric set is assembled: the static (grid-only)
    metrics, ``valid_output_grid`` among them, then the structural ones and
    ``invalid_reason``.
    """
    return metrics.as_dict()


def reward_of(metrics: dict) -> float:
    """The reward of a scored completion: its topology score, 0 unless its grid is valid."""
    if not metrics.get("valid_output_grid"):
        return 0.0
    value = metrics.get(REWARD_METRIC)
    return float(value) if value is not None and math.isfinite(value) else 0.0


def _hashable(value):
    """A grid or direction (text, nested lists, numbers) as a hashable key."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    hash(value)  # TypeError for anything else unhashable
    return value


def _score(items: Sequence[ScoreItem], cache, num_devices) -> list[CompletionMetrics]:
    """Static and structural metrics of the items, in one batched call.

    Completions are reduced to their text first (:func:`completion_text`);
    identical answers to the same sample (common in a GRPO group) are scored
    once.
    """
    unique: list[ScoreItem] = []
    first: dict = {}
    where = []
    for item in items:
        text = completion_text(item.completion)
        try:
            key = (_hashable(item.ground_truth), _hashable(item.input_grid),
                   _hashable(item.gravity_dir), text)
        except TypeError:
            key = object()  # unhashable inputs: no sharing
        if key not in first:
            first[key] = len(unique)
            unique.append(ScoreItem(text, item.ground_truth, item.input_grid, item.gravity_dir))
        where.append(first[key])
    results = (score_batch(unique, cache, num_devices=num_devices, static=True)
               if unique else [])
    return [dataclasses.replace(results[w]) for w in where]


def score_completions(items: Sequence[ScoreItem], cache: OptimumCache | None = None,
                      num_devices: int | None = None) -> list[dict]:
    """Every published metric of many completions, in one batched call.

    The static metrics read a completion's grid as the published harness
    does (``valid_output_grid``: the answer's shape, every cell ``L``, ``S``
    or a number in [0, 1]; see :mod:`sphyr_jax.scoring.static`); the physics
    comes from :func:`~sphyr_jax.scoring.metrics.score_batch`.  Never raises
    for a bad completion.

    Args:
        items: the completions (text or chat messages, see
            :func:`completion_text`) with their answers, masked inputs and
            load directions.
        cache: the optimum cache (None: a fresh in-memory one).
        num_devices: devices batches are split over.

    Returns:
        One metrics dict per item, in order.
    """
    return [_metrics_for(m) for m in _score(items, cache, num_devices)]


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

    Example::

        reward = TopologyReward(cache_dir="runs/optima")
        trainer = GRPOTrainer(model=..., reward_funcs=reward, train_dataset=prompt_dataset(...))
    """

    def __init__(self, cache: OptimumCache | None = None, cache_dir=None,
                 yardstick: str = "reference", num_devices: int | None = None):
        enable_x64()  # an entry point: float64 before any work
        self.cache = cache if cache is not None else OptimumCache(
            cache_dir, yardstick=yardstick, num_devices=num_devices)
        self.num_devices = num_devices
        self.__name__ = "topology_reward"  # trainers log a reward under its function's name

    def items(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
              gravity_dir=None, subject=None) -> list[ScoreItem]:
        """The scoring items of a trainer's call (columns checked; see :meth:`__call__`)."""
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
        items = []
        for i in range(n):
            masked = inputs[i]
            if masked is None and prompts[i] is not None:  # the prompt shows the masked grid
                masked = completion_text(prompts[i]) or None
            direction = directions[i]
            if direction is None and isinstance(subjects[i], str) and subjects[i].endswith("_3d"):
                direction = DEFAULT_GRAVITY_3D
            items.append(ScoreItem(completions[i], answers[i], masked, direction))
        return items

    def metrics(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
                gravity_dir=None, subject=None, **kwargs) -> list[dict]:
        """Every metric of each completion (same arguments as :meth:`__call__`)."""
        items = self.items(prompts, completions, input_grid, ground_truth, gravity_dir, subject)
        return score_completions(items, self.cache, num_devices=self.num_devices)

    def __call__(self, prompts=None, completions=None, input_grid=None, ground_truth=None,
                 gravity_dir=None, subject=None, **kwargs) -> list[float]:
        """One reward per completion: its topology score, 0 for an invalid grid.

        Args:
            prompts: the prompts (text or chat messages); an ``input_grid``
                missing from the columns is read from them.
            completions: text, or chat messages
                (``[{"role": "assistant", "content": ...}]``).
            input_grid: the masked grids (text or token lists), one per completion.
            ground_truth: the dataset answers (text or token lists).
            gravity_dir: optional (row, col) load directions (default down).
            subject: optional subject names (``*_3d`` reads text grids as voxels).
            **kwargs: whatever else the trainer passes (other columns,
                ``completion_ids``, ``trainer_state``...), ignored.

        Returns:
            One float per completion, in order.

        Raises:
            ValueError: a column is missing or does not hold one entry per
                completion (a bad completion never raises: it scores 0).
        """
        items = self.items(prompts, completions, input_grid, ground_truth, gravity_dir, subject)
        return [reward_of({"valid_output_grid": m.valid_output_grid,
                           REWARD_METRIC: m.topology_score})
                for m in _score(items, self.cache, self.num_devices)]


_SHARED: TopologyReward | None = None


def topology_reward(prompts=None, completions=None, **columns) -> list[float]:
    """TRL's reward function: each completion's topology score (0 for an invalid grid).

    Called by a trainer as ``topology_reward(prompts=..., completions=...,
    input_grid=[...], ground_truth=[...], gravity_dir=[...], subject=[...],
    ...)`` with one entry per completion; optima are computed once per distinct
    sample and kept in memory for the life of the process.  For a cache on
    disk or the other yardstick use a :class:`TopologyReward` instance.
    See :meth:`TopologyReward.__call__`.
    """
    global _SHARED
    if _SHARED is None:
        _SHARED = TopologyReward()
    return _SHARED(prompts, completions, **columns)
