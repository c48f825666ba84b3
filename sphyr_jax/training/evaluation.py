"""Completing dataset inputs with a model, and scoring the completions physically.

Completions keep every known token of the input and fill the ``V`` cells in
the subject's format (``0``/``1`` at threshold 0.5, or one decimal); they are
scored with :func:`sphyr_jax.scoring.metrics.score_batch` against the dataset answer
(its boundary conditions, its volume fraction as the optimum's budget), with a
record's ``gravity_dir`` when it has one.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from sphyr_jax.evaluation.baselines import fill_cells, fill_masked
from sphyr_jax.problem.grids import as_grid, check_rectangular
from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY
from sphyr_jax.training.model import predict
from sphyr_jax.training.problems import grid_features

SUMMARY_KEYS = ("topology_score", "load_carrying", "structural_efficiency",
                "material_efficiency", "volume_fraction", "ground_truth_volume_fraction")


@eqx.filter_jit
def _predict(model, features):
    return predict(model, features)


def _token(value: float, hard: bool, binary: bool = False) -> str:
    if hard and binary:
        return "1.0" if value >= 0.5 else "0.0"
    if hard:
        return f"{min(max(round(float(value), 1), 0.0), 1.0):.1f}"
    return "1" if value >= 0.5 else "0"


def _gravity(record: dict):
    """A record's load direction; None (down) when it has none."""
    g = record.get("gravity_dir")
    return None if g is None else tuple(g)


def complete_grids(model, input_grids: Sequence, hard: bool, gravity_dirs=None) -> list:
    """Fill the ``V`` cells of many input grids of one shape (one batched forward pass).

    Args:
        model: a :class:`~sphyr_jax.training.model.DensityNet`.
        input_grids: masked grids (text or token rows; 3D: layers of rows),
            all of one shape.
        hard: one-decimal tokens (``0.0``/``1.0`` for a model whose
            ``binary_hard`` is set), else ``0``/``1``.
        gravity_dirs: load direction per grid (default: down).

    Returns:
        Token grids (lists of string rows, or of layers).
    """
    grids = [as_grid(g) for g in input_grids]
    if not grids:
        return []
    gravity_dirs = list(gravity_dirs) if gravity_dirs is not None else [None] * len(grids)
    feats = np.stack([grid_features(g, d) for g, d in zip(grids, gravity_dirs, strict=True)])
    rho = np.asarray(_predict(model, jnp.asarray(feats)))
    to_token = np.vectorize(lambda v: _token(v, hard, model.binary_hard), otypes=[object])
    return [fill_cells(grid, to_token(values)) for grid, values in zip(grids, rho, strict=True)]


def complete_grid(model, input_grid, hard: bool, gravity_dir=None) -> list:
    """The input grid with every ``V`` cell filled in the subject's format (token rows)."""
    return complete_grids(model, [input_grid], hard, [gravity_dir])[0]


def complete_records(model, records: Sequence[dict], hard: bool) -> list:
    """Completions of records (grouped by grid shape for batched forward passes)."""
    by_shape: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        by_shape.setdefault(check_rectangular(as_grid(r["input_grid"])), []).append(i)
    completions: list = [None] * len(records)
    for idx in by_shape.values():
        done = complete_grids(model, [records[i]["input_grid"] for i in idx], hard,
                              [_gravity(records[i]) for i in idx])
        for i, c in zip(idx, done, strict=True):
            completions[i] = c
    return completions


def score_completions(records: Sequence[dict], completions: Sequence, cache=None,
                      num_devices: int | None = None, optimum: str | None = None,
                      progress=None) -> dict:
    """Score completions of records with :func:`sphyr_jax.scoring.metrics.score_batch`.

    The yardstick is ``optimum`` (``"reference"``: the published optimum, the
    default; ``"strong"``: stricter), or the given cache's; ``progress`` is
    score_batch's optional ``(stage, done, total)`` callback.

    Returns:
        Means over records of ``SUMMARY_KEYS``, ``samples`` (count) and
        ``per_record`` (one metrics dict per record).
    """
    from sphyr_jax.scoring.metrics import ScoreItem, score_batch

    items = [ScoreItem(c, r["ground_truth"], r["input_grid"], _gravity(r) or DEFAULT_GRAVITY)
             for r, c in zip(records, completions, strict=True)]
    metrics = score_batch(items, cache, num_devices=num_devices, optimum=optimum,
                          progress=progress)
    out = {k: float(np.mean([float(getattr(m, k)) for m in metrics])) if metrics else 0.0
           for k in SUMMARY_KEYS}
    return {**out, "samples": len(metrics), "per_record": [m.as_dict() for m in metrics]}


def evaluate(model, records: Sequence[dict], hard: bool, cache=None,
             num_devices: int | None = None) -> dict:
    """Complete every record's input with the model and score it physically.

    Args:
        model: a trained :class:`~sphyr_jax.training.model.DensityNet`.
        records: ``{"input_grid", "ground_truth"}`` (+ optional ``"gravity_dir"``).
        hard: subject format (one decimal) or 0/1.
        cache: an :class:`~sphyr_jax.topopt.optimum.OptimumCache` shared between calls.
        num_devices: devices scoring is split over (None: all local).

    Returns:
        See :func:`score_completions`, plus ``completions`` (token grids).
    """
    completions = complete_records(model, records, hard)
    return {**score_completions(records, completions, cache, num_devices),
            "completions": completions}


def fill_baseline(records: Sequence[dict], token: str, cache=None,
                  num_devices: int | None = None) -> dict:
    """Score completions that put ``token`` (``"0"``: empty, ``"1"``: solid) in every V cell."""
    completions = [fill_masked(r["input_grid"], token) for r in records]
    return score_completions(records, completions, cache, num_devices)
