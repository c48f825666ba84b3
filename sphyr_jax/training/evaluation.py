"""Completing dataset inputs with a model, and scoring the completions physically.

Completions keep every known token of the input and fill the ``V`` cells in
the subject's format (``0``/``1`` at threshold 0.5, or one decimal); a design
that drops its load is decoded again at lower thresholds until it carries it
(:data:`CARRY_THRESHOLDS`).  They are
scored like every other record of the project
(:func:`sphyr_jax.scoring.records.score_records`: the dataset answer's boundary
conditions and volume fraction, the record's ``input_grid`` and
``gravity_dir``), so a completion scored here carries the same fields and
values as through a rescore, the evaluation harness or the RL reward;
:func:`score_summary` adds the means of :data:`SUMMARY_KEYS`.
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.evaluation.baselines import fill_cells, fill_masked
from sphyr_jax.fem import fea
from sphyr_jax.problem.grids import as_grid, check_rectangular
from sphyr_jax.scoring.records import score_records
from sphyr_jax.sharding import batch_call
from sphyr_jax.topopt.optimum import OptimumCache
from sphyr_jax.topopt.options import Yardstick
from sphyr_jax.training.model import predict
from sphyr_jax.training.problems import grid_features, visible_load_case

SUMMARY_KEYS = ("topology_score", "load_carrying", "structural_efficiency",
                "material_efficiency", "volume_fraction", "ground_truth_volume_fraction")
"""The metrics :func:`score_summary` averages over records."""

CARRY_THRESHOLDS = (0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0)
"""Thresholds a completion that drops its load is decoded at again, in order: every
masked cell whose density reaches the threshold is written solid, and the first
design that carries the load is kept (0.0: every masked cell solid)."""


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


def _carries(features, designs):
    """(B,) whether designs (B, *cells) — read on the masked cells, the input's known
    cells elsewhere, visible L/S solid — carry the load their input features
    (B, C, *cells) show: the scorer's test (:func:`sphyr_jax.fem.fea.analyze`)."""
    rho = jnp.where(features[:, 2] > 0.5, designs, jnp.clip(features[:, 3], 0.0, 1.0))
    case = jax.vmap(visible_load_case)(features, rho)
    return fea.analyze(case, case.pinned).load_carrying


def _carrying(features: np.ndarray, designs: np.ndarray) -> np.ndarray:
    """:func:`_carries` as NumPy, one compiled program per batch-size bucket."""
    return np.asarray(batch_call(_carries, np.asarray(features, np.float64),
                                 np.asarray(designs, np.float64), num_devices=1))


def _carrying_tokens(features: np.ndarray, rho: np.ndarray, tokens: np.ndarray,
                     solid: str) -> np.ndarray:
    """The tokens of each grid, decoded again where they drop the load (see
    :data:`CARRY_THRESHOLDS`; every retry of every such grid in one batched check);
    a grid that no threshold makes carry keeps its tokens."""
    dropped = np.flatnonzero(~_carrying(features, tokens.astype(float)))
    if not dropped.size:
        return tokens
    n = len(CARRY_THRESHOLDS)
    tries = np.stack([np.where(rho[dropped] >= t, solid, tokens[dropped])
                      for t in CARRY_THRESHOLDS], axis=1)  # (k, n, *cells)
    ok = _carrying(np.repeat(features[dropped], n, axis=0),
                   tries.reshape((-1,) + tries.shape[2:]).astype(float)).reshape(-1, n)
    fixed = ok.any(axis=1)
    tokens = tokens.copy()
    tokens[dropped[fixed]] = tries[fixed, ok[fixed].argmax(axis=1)]
    return tokens


def complete_grids(model, input_grids: Sequence, *, hard: bool, gravity_dirs=None,
                   carry: bool = True) -> list:
    """Fill the ``V`` cells of many input grids of one shape (one batched forward pass).

    Args:
        model: a :class:`~sphyr_jax.training.model.DensityNet`.
        input_grids: masked grids (text or token rows; 3D: layers of rows),
            all of one shape.
        hard: one-decimal tokens (``0.0``/``1.0`` for a model whose
            ``binary_hard`` is set), else ``0``/``1``.
        gravity_dirs: load direction per grid (default: down).
        carry: check each completion with one finite-element solve under the
            input's visible loads and supports, and decode one that drops
            its load again at the lower thresholds of :data:`CARRY_THRESHOLDS`
            (the first design that carries it is kept); False: the
            densities at threshold 0.5 (or to one decimal) as they are.

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
    tokens = to_token(rho)
    if carry:
        tokens = _carrying_tokens(feats, rho, tokens, "1.0" if hard else "1")
    return [fill_cells(grid, values) for grid, values in zip(grids, tokens, strict=True)]


def complete_grid(model, input_grid, *, hard: bool, gravity_dir=None, carry: bool = True
                  ) -> list:
    """The input grid with every ``V`` cell filled in the subject's format (token rows;
    ``carry``: see :func:`complete_grids`)."""
    return complete_grids(model, [input_grid], hard=hard, gravity_dirs=[gravity_dir],
                          carry=carry)[0]


def complete_records(model, records: Sequence[dict], *, hard: bool, carry: bool = True) -> list:
    """Completions of records (grouped by grid shape for batched forward passes;
    ``carry``: see :func:`complete_grids`)."""
    by_shape: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        by_shape.setdefault(check_rectangular(as_grid(r["input_grid"])), []).append(i)
    completions: list = [None] * len(records)
    for idx in by_shape.values():
        done = complete_grids(model, [records[i]["input_grid"] for i in idx], hard=hard,
                              gravity_dirs=[_gravity(records[i]) for i in idx], carry=carry)
        for i, c in zip(idx, done, strict=True):
            completions[i] = c
    return completions


def mean_scores(per_record: Sequence[dict]) -> dict:
    """Means of :data:`SUMMARY_KEYS` over scored records (0.0 for none)."""
    return {k: float(np.mean([float(m[k]) for m in per_record])) if per_record else 0.0
            for k in SUMMARY_KEYS}


def score_summary(records: Sequence[dict], completions: Sequence, *,
                  cache: OptimumCache | None = None, num_devices: int | None = None,
                  optimum: Yardstick | None = None, progress=None) -> dict:
    """Score completions of dataset records and summarise them.

    Args:
        records: dataset records ``{"input_grid", "ground_truth"}`` (+ optional
            ``"gravity_dir"``).
        completions: one completion per record (text or token grid).
        cache: an :class:`~sphyr_jax.topopt.optimum.OptimumCache` shared between calls.
        num_devices: devices scoring is split over (None: all local).
        optimum: the yardstick (``"reference"``, the default, or ``"strong"``;
            None: the cache's).
        progress: optional callable(stage, done, total) of the scoring.

    Returns:
        :func:`mean_scores` of the records, ``samples`` (count) and
        ``per_record`` (every metric of each record,
        :func:`~sphyr_jax.scoring.records.score_records`).
    """
    per = score_records([{**r, "completion": c} for r, c in zip(records, completions, strict=True)],
                        cache=cache, num_devices=num_devices, optimum=optimum, progress=progress)
    return {**mean_scores(per), "samples": len(per), "per_record": per}


def complete_and_score(model, records: Sequence[dict], *, hard: bool,
                       cache: OptimumCache | None = None,
                       num_devices: int | None = None) -> dict:
    """Complete every record's input with the model and score it physically.

    Args:
        model: a trained :class:`~sphyr_jax.training.model.DensityNet`.
        records: ``{"input_grid", "ground_truth"}`` (+ optional ``"gravity_dir"``).
        hard: subject format (one decimal) or 0/1.
        cache: an :class:`~sphyr_jax.topopt.optimum.OptimumCache` shared between calls.
        num_devices: devices scoring is split over (None: all local).

    Returns:
        See :func:`score_summary`, plus ``completions`` (token grids).
    """
    completions = complete_records(model, records, hard=hard)
    return {**score_summary(records, completions, cache=cache, num_devices=num_devices),
            "completions": completions}


def fill_baseline(records: Sequence[dict], token: str, *, cache: OptimumCache | None = None,
                  num_devices: int | None = None) -> dict:
    """Score completions that put ``token`` (``"0"``: empty, ``"1"``: solid) in every V cell
    (see :func:`score_summary`)."""
    completions = [fill_masked(r["input_grid"], token) for r in records]
    return score_summary(records, completions, cache=cache, num_devices=num_devices)
