"""Settings of the training problems, the model, the loss and the optimiser.

Frozen dataclasses (hashable, so they can be static arguments of compiled
functions); :func:`train_config_from_dict` rebuilds one from its JSON form.
"""

from __future__ import annotations

import dataclasses

MASK_KINDS = ("full", "rows", "columns", "cells")


@dataclasses.dataclass(frozen=True)
class ProblemConfig:
    """How random training problems are drawn.

    Attributes:
        shape: grid shape (nely, nelx).
        load_run: (min, max) length of the load run on the top row.
        support_run: (min, max) length of the support run on the bottom row.
        mask_weights: relative frequency of the mask kinds of ``MASK_KINDS``
            (full = rows 1..nely-2, random rows, random columns, random cells).
        row_counts, column_counts, cell_counts: counts the random masks draw from
            (cells are drawn with replacement; rows never include the edges;
            columns and cells may hide load and support cells).
        random_gravity: draw the load direction from the four axis directions
            (else always down).
        pool_fraction: share of the partial-mask (not full) problems whose
            boundary conditions and known (unmasked) cells come from a pool of
            plausible designs; the others (and all full-mask problems) draw
            fresh boundary conditions and leave known non-L/S cells empty.
        pool_size: designs in the pool.
        pool_volume: (min, max) volume fraction the pool designs are optimised at.
        pool_iterations: SIMP iterations per pool design.
        hard: one-decimal densities (hard subjects) instead of 0/1, both for the
            pool designs and for the rounded term of the loss.
    """

    shape: tuple[int, int] = (10, 10)
    load_run: tuple[int, int] = (3, 10)
    support_run: tuple[int, int] = (3, 6)
    mask_weights: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0)
    row_counts: tuple[int, ...] = (1, 3)
    column_counts: tuple[int, ...] = (1, 3)
    cell_counts: tuple[int, ...] = (1, 5, 10)
    random_gravity: bool = False
    pool_fraction: float = 0.0
    pool_size: int = 256
    pool_volume: tuple[float, float] = (0.2, 0.45)
    pool_iterations: int = 60
    hard: bool = False

    def __post_init__(self):
        if len(self.mask_weights) != len(MASK_KINDS) or min(self.mask_weights) < 0 \
                or sum(self.mask_weights) <= 0:
            raise ValueError(f"mask_weights needs {len(MASK_KINDS)} non-negative weights "
                             f"{MASK_KINDS} with a positive sum, got {self.mask_weights}")
        if not 0.0 <= self.pool_fraction <= 1.0:
            raise ValueError(f"pool_fraction must be in [0, 1], got {self.pool_fraction}")
        for name in ("load_run", "support_run"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (min, max) with 1 <= min <= max")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of :class:`~sphyr_jax.training.model.DensityNet`.

    Attributes:
        width: feature channels.
        dilations: one residual 3x3 conv block per entry, with that dilation.
        init_density: density every design cell starts at.
    """

    width: int = 32
    dilations: tuple[int, ...] = (1, 2, 4, 1, 2, 4)
    init_density: float = 0.3


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Physics loss (see :func:`sphyr_jax.training.loop.batch_loss`).

    Attributes:
        volume_weight: material price lambda on the whole-grid volume fraction.
        penal: SIMP exponent of the soft design's compliance at the end.
        initial_penal: SIMP exponent of the soft term at the start; it moves
            linearly to ``penal`` over the first half of training (continuation:
            a low p gives empty cells a gradient, so the model cannot get stuck
            in an all-empty design).
        rounded_weight: final weight w of the rounded design's term.
        rounded_start: training progress (0..1) at which w starts to ramp up
            (linearly, reaching ``rounded_weight`` at the end).
        initial_sharpness: logit scale at the start; it grows geometrically to 1
            at the end of training (the model is used at scale 1).
        leak: floor added to the sigmoid's derivative (value unchanged), so
            saturated cells still receive gradient.
        solver: linear solver of the FEA (``"banded"``: fastest to run;
            ``"dense"``: fastest to compile, fine for small grids).
    """

    volume_weight: float = 6.0
    penal: float = 3.0
    initial_penal: float = 1.0
    rounded_weight: float = 0.5
    rounded_start: float = 0.2
    initial_sharpness: float = 0.5
    leak: float = 0.0
    solver: str = "banded"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser and schedule, plus the nested problem, model and loss settings."""

    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    clip_norm: float = 1.0
    log_every: int = 25
    seed: int = 0
    problem: ProblemConfig = ProblemConfig()
    model: ModelConfig = ModelConfig()
    loss: LossConfig = LossConfig()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _build(cls, values: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def model_config_from_dict(values: dict) -> ModelConfig:
    """A :class:`ModelConfig` from its ``dataclasses.asdict`` / JSON form."""
    return _build(ModelConfig, values)


def train_config_from_dict(values: dict) -> TrainConfig:
    """A :class:`TrainConfig` from its ``as_dict`` / JSON form."""
    values = dict(values)
    nested = {"problem": ProblemConfig, "model": ModelConfig, "loss": LossConfig}
    for name, cls in nested.items():
        if name in values:
            values[name] = _build(cls, values[name])
    return TrainConfig(**values)
