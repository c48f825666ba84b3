"""Records in, metric dicts out: the one way every layer scores completions.

A record is a dict as the project stores and passes them around: a results
file's record, a dataset record with a completion, a trainer's columns, an
episode's answer.  :func:`score_records` reads each record's fields, scores
them all in one batched call (:func:`sphyr_jax.scoring.metrics.score_batch`,
with the static metrics) and returns one JSON-ready dict per record with every
field of :data:`~sphyr_jax.scoring.metrics.ALL_METRIC_FIELDS`.  Rescoring a
results tree, the evaluation harness, the training layer and the RL reward all
score through it, so a record scored by any of them carries the same fields
and values.

Fields read (:func:`record_item`), each with one precedence:

* ``completion``: raw model text, a token grid, or chat messages (a message
  dict or a list of them: the last assistant message's text,
  :func:`completion_text`); text longer than :data:`MAX_COMPLETION_CHARS` is
  read from its tail (a completion's answer is its last grid).
* ``ground_truth``: the dataset answer (text or token lists).
* the masked input grid: ``input_grid`` when present (not None), else the
  last grid of ``prompt`` (text, or chat messages read as above), else none
  (every cell that is not ``L`` or ``S`` is then a design cell).  An explicit
  ``input_grid`` wins because it is written exactly when the prompt's last
  grid is not the masked one (a custom prompt template); the published
  results trees hold ``prompt`` only.
* the load direction: ``gravity_dir`` when present (not None; checked, never
  reinterpreted), else the caller's ``gravity`` (e.g. the direction a results
  folder's name gives), else down.
* ``optimum``: a stored optimum of the sample
  (:func:`sphyr_jax.topopt.optimum.stored_optimum`), used only when its key is
  the sample's key under the scorer's yardstick.

Identical records (the same sample and the same completion, common in a GRPO
group) are scored once (:func:`~sphyr_jax.scoring.metrics.score_batch`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY
from sphyr_jax.scoring.metrics import (
    ALL_METRIC_FIELDS,
    DEFAULT_MAX_CELLS,
    ScoreItem,
    score_batch,
    stored_optima,
)
from sphyr_jax.topopt.optimum import OptimumCache
from sphyr_jax.topopt.options import Yardstick

RECORD_METRIC_KEYS = ALL_METRIC_FIELDS
"""Every field scoring adds to a record: the static metrics, then the structural ones."""

MAX_COMPLETION_CHARS = 100_000
"""Longer completions are read from their last this many characters (the
last grid in a completion is its answer; a 20 x 20 answer is ~1,600)."""


def _content(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal parts: keep the text ones
        parts = [p if isinstance(p, str) else p.get("text") for p in content
                 if isinstance(p, str) or (isinstance(p, dict) and p.get("type", "text") == "text")]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _is_messages(value) -> bool:
    return isinstance(value, dict) or (
        isinstance(value, (list, tuple)) and bool(value)
        and all(isinstance(m, dict) for m in value))


def _messages_text(messages) -> str:
    """The text of a message dict or list (the last assistant message's; with
    none, the last message's)."""
    if isinstance(messages, dict):
        return _content(messages.get("content"))
    replies = [m for m in messages if m.get("role", "assistant") == "assistant"]
    return _content((replies or list(messages))[-1].get("content"))


def completion_text(completion) -> str:
    """The text of a completion given as a string or as chat messages.

    Chat completions (``[{"role": "assistant", "content": ...}]``) give the
    last assistant message's content (text parts joined; with no assistant
    message, the last message's).  Anything else gives ``""``.  Text longer
    than :data:`MAX_COMPLETION_CHARS` is cut to its tail.
    """
    if isinstance(completion, str):
        text = completion
    elif _is_messages(completion):
        text = _messages_text(completion)
    else:
        text = ""
    return text[-MAX_COMPLETION_CHARS:]


def record_item(record: dict, *, gravity=None) -> ScoreItem:
    """What scoring reads of one record (see the module docstring for the precedence).

    Args:
        record: the record; anything that is not a dict reads as an empty one.
        gravity: load direction of a record without ``gravity_dir`` (None: down).
    """
    if not isinstance(record, dict):
        record = {}
    completion = record.get("completion")
    if isinstance(completion, str) or _is_messages(completion):
        completion = completion_text(completion)  # token grids pass as they are
    masked = record.get("input_grid")
    if masked is None:
        masked = record.get("prompt")
        if _is_messages(masked):
            masked = _messages_text(masked) or None
    direction = record.get("gravity_dir")
    if direction is None:
        direction = DEFAULT_GRAVITY if gravity is None else gravity
    return ScoreItem(completion, record.get("ground_truth"), masked, direction,
                     record.get("optimum"))


def score_records(
    records: Sequence[dict],
    *,
    gravity=None,
    cache: OptimumCache | None = None,
    design_efficiency: bool = False,
    num_devices: int | None = None,
    progress=None,
    optimum: Yardstick | None = None,
    max_cells: int | None = DEFAULT_MAX_CELLS,
) -> list[dict]:
    """Every published metric of records, as JSON-ready field dicts, in one batched call.

    Args:
        records: the records (not modified; fields as in the module docstring).
        gravity: load direction of records without ``gravity_dir``, e.g.
            :func:`sphyr_jax.problem.loadcase.gravity_from_folder` of their
            folder (None: down).
        cache: optimum cache (default: a fresh in-memory one for ``optimum``).
        design_efficiency: also optimise at each completion's own budget.
        num_devices: devices batches are split over (None: all local).
        progress: optional callable(stage, done, total).
        optimum: the yardstick, ``"reference"`` or ``"strong"`` (None: the
            cache's, else ``"reference"``).
        max_cells: samples with more cells are invalid ("too large").

    Returns:
        One dict per record, in order, with the keys of
        :data:`RECORD_METRIC_KEYS` (non-finite numbers as None).  A bad record
        gets the invalid scores with ``invalid_reason``; nothing raises for one.

    Raises:
        ValueError: ``optimum`` is unknown or differs from the cache's.
    """
    items = [record_item(record, gravity=gravity) for record in records]
    return [m.as_dict() for m in score_batch(
        items, cache=cache, include_own_budget_reference=design_efficiency,
        num_devices=num_devices, progress=progress, optimum=optimum, max_cells=max_cells,
        static=True)]


def optimum_fields(records: Sequence[dict], *, gravity=None, cache: OptimumCache | None = None,
                   optimum: Yardstick | None = None) -> list[dict | None]:
    """The ``optimum`` field of each record: its sample's optimum under the yardstick, keyed.

    A record that carries its field is scored without optimising while the
    field's key is its sample's key (:func:`score_records`); edit its answer,
    input or direction, or score with another yardstick, and it is optimised
    again.

    Args:
        records: the records (``ground_truth``, the masked input, ``gravity_dir``).
        gravity: direction of records without ``gravity_dir`` (None: down).
        cache: optimum cache the optima come from (computed into it if missing).
        optimum: the yardstick (None: the cache's, else ``"reference"``).

    Returns:
        One field per record, None for a record whose sample cannot be scored.
    """
    return stored_optima([record_item(r, gravity=gravity) for r in records], cache=cache,
                         optimum=optimum)
