"""veRL's custom reward function: the topology score of each response, components logged.

veRL imports a reward module by path and calls one of its functions; nothing
here imports veRL.  Every function reads the sample from its label
(``reward_model.ground_truth`` of the exported data,
:func:`sphyr_jax.scoring.labels.problem_label`) and returns, per sample, the
same four keys, so veRL logs the components beside the score::

    {"score": reward, "valid": 1.0 | 0.0, "load_carrying": 1.0 | 0.0,
     "topology_score": topology score}

``score`` is the reward (the topology score, 0 for an answer that is not a
complete grid, as :func:`sphyr_jax.rl.reward.reward_of`); ``valid`` and
``load_carrying`` are 0/1 so their means are shares.

* :func:`compute_score`: veRL's per-sample form, synchronous.  veRL 0.9.1's
  reward loop runs it in executor threads, one call per sample; concurrent
  calls are gathered into one scoring call (:class:`BatchingScorer`).
* :func:`compute_score_async`: the same, ``async``: veRL 0.9.1's reward
  loop awaits it directly, and the calls of one reward worker's chunk are
  scored in one batched call.  The recommended form for 0.9.1.
* :func:`compute_score_batch`: the batch form of veRL's ``BatchRewardManager``
  (``reward_manager=batch`` in veRL releases that have it): one scoring call
  per batch.

Extra keyword arguments are ignored, except two that veRL passes from
``reward.custom_reward_function.reward_kwargs``: ``cache_dir`` (a folder
keeping optima between runs) and ``optimum`` (``"reference"`` or
``"strong"``).  One scorer (with its optimum cache) is kept per process and
setting.  A ground truth that is not a label raises
:class:`~sphyr_jax.scoring.labels.LabelError`; a bad response scores 0.

Example (veRL 0.9.1, on the command line of ``verl.trainer.main_ppo``)::

    reward.custom_reward_function.path=pkg://sphyr_jax.rl.verl
    reward.custom_reward_function.name=compute_score_async
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sphyr_jax.rl.batching import BatchingScorer
from sphyr_jax.rl.reward import reward_of
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.labels import read_label
from sphyr_jax.topopt.optimum import OptimumCache

SCORE_KEYS = ("score", "valid", "load_carrying", "topology_score")
"""The keys of every result, in order."""

_SCORERS: dict = {}
_LOCK = threading.Lock()


def shared_scorer(cache_dir=None, optimum: str = "reference") -> BatchingScorer:
    """The process's scorer for one optimum folder and yardstick (made on first use).

    Turns float64 on (an entry point).
    """
    key = (None if cache_dir is None else str(cache_dir), optimum)
    with _LOCK:
        scorer = _SCORERS.get(key)
        if scorer is None:
            enable_x64()
            scorer = _SCORERS[key] = BatchingScorer(OptimumCache(cache_dir, yardstick=optimum))
        return scorer


def _scorer(kwargs: dict) -> BatchingScorer:
    return shared_scorer(kwargs.get("cache_dir"), kwargs.get("optimum") or "reference")


def answer_record(response: str, label: str, extra_info=None) -> dict:
    """The record a response to a labelled sample is scored as.

    The label's stored optimum is used; a label without one takes
    ``extra_info["optimum"]`` when given.
    """
    record = read_label(label)
    if record["optimum"] is None and isinstance(extra_info, dict):
        record["optimum"] = extra_info.get("optimum")
    record["completion"] = response
    return record


def result_of(metrics: dict) -> dict:
    """The four keys of :data:`SCORE_KEYS` from an answer's metrics."""
    topology = metrics.get("topology_score")
    return {"score": reward_of(metrics),
            "valid": 1.0 if metrics.get("valid_output_grid") else 0.0,
            "load_carrying": 1.0 if metrics.get("load_carrying") else 0.0,
            "topology_score": float(topology) if topology is not None else 0.0}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """veRL's per-sample reward: one response's score and components.

    Args:
        data_source: the sample's ``data_source`` (``sphyr/<subject>``; not read).
        solution_str: the decoded response.
        ground_truth: the sample's label (``reward_model.ground_truth``).
        extra_info: the row's ``extra_info`` (its ``optimum`` is used when the
            label has none).
        **kwargs: ``cache_dir`` and ``optimum`` (see the module docstring);
            anything else veRL passes is ignored.

    Returns:
        ``{"score", "valid", "load_carrying", "topology_score"}``.
    """
    record = answer_record(solution_str, ground_truth, extra_info)
    return result_of(_scorer(kwargs).score([record])[0])


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None,
                              **kwargs) -> dict:
    """:func:`compute_score` for veRL 0.9.1's reward loop: concurrent calls scored together."""
    record = answer_record(solution_str, ground_truth, extra_info)
    return result_of((await _scorer(kwargs).score_async([record]))[0])


def compute_score_batch(data_sources: Sequence, solution_strs: Sequence,
                        ground_truths: Sequence, extra_infos: Sequence | None = None,
                        **kwargs) -> list[dict]:
    """veRL's batch reward: every response of a batch in one scoring call.

    Args:
        data_sources: one per response (not read).
        solution_strs: the decoded responses.
        ground_truths: their samples' labels.
        extra_infos: their rows' ``extra_info`` (None: none).
        **kwargs: as :func:`compute_score`.

    Returns:
        One ``{"score", "valid", "load_carrying", "topology_score"}`` per response.
    """
    n = len(solution_strs)
    if len(ground_truths) != n or (extra_infos is not None and len(extra_infos) != n):
        raise ValueError(f"compute_score_batch needs one ground truth and extra_info per "
                         f"response ({n})")
    infos = [None] * n if extra_infos is None else list(extra_infos)
    records = [answer_record(s, g, e)
               for s, g, e in zip(solution_strs, ground_truths, infos, strict=True)]
    return [result_of(m) for m in _scorer(kwargs).score_now(records)]
