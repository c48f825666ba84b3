"""Settings of the training problems, the model, the loss and the optimiser.

Frozen dataclasses (hashable, so they can be static arguments of compiled
functions); :func:`train_config_from_dict` rebuilds one from its JSON form.
Training problems come either from the benchmark generators' own rules
(:class:`DrawConfig`, 2D: :mod:`~sphyr_jax.training.drawing`) or from the
canonical in-graph sampler (:class:`ProblemConfig`, any grid and voxels:
:mod:`~sphyr_jax.training.problems`).
"""

from __future__ import annotations

import dataclasses

from sphyr_jax.data.datasets import VARIANTS

MASK_VARIANTS = VARIANTS  # the SPhyR mask variants, in convert's order
DIRECTION_NAMES = ("down", "right", "up", "left")  # k counter-clockwise turns of down
HARD_VALUES = ("decimal", "binary")  # how a model writes hard cells (ModelConfig.hard_values)
FAMILIES = ("v1", "v2")  # the generator families training problems are drawn by
_LEAST_GRID = {"v1": 3, "v2": 5}  # the generators' smallest grids


def parse_source(source: str) -> tuple[str, int]:
    """A training source ``"<family>:<grid size>"`` as ``(family, n)``: ``"v2:20"`` ->
    ``("v2", 20)``.

    Raises:
        ValueError: for an unknown family or a grid smaller than the family's least.
    """
    family, _, size = str(source).partition(":")
    if family not in FAMILIES or not size.isdigit():
        raise ValueError(f"a source is '<family>:<grid size>' with a family of {FAMILIES}, "
                         f"got {source!r}")
    if int(size) < _LEAST_GRID[family]:
        raise ValueError(f"{family} grids are at least {_LEAST_GRID[family]} cells wide, "
                         f"got {source!r}")
    return family, int(size)


@dataclasses.dataclass(frozen=True)
class ProblemConfig:
    """How random training problems are drawn.

    A problem is drawn in the canonical frame of the SPhyR generators (one load
    run on the top edge, one support run on the bottom edge, gravity down),
    masked like one of the eight SPhyR variants, optionally mirrored left-right,
    then turned by quarter turns together with its load direction, so loads
    and supports end up on any pair of opposite edges with the load pushing
    towards the supports (as in the published ``*_rotations`` data and
    ``python -m sphyr_jax generate --gravity_dirs``).

    Attributes:
        shape: grid shape (nely, nelx), square unless only down/up are drawn;
            or (nz, ny, nx) for voxel problems (load patch on the top layer,
            support patch on the bottom layer, load down only).
        load_run: (min, max) length of the load run on the (canonical) top row
            (3D: of each side of the load patch).
        support_run: (min, max) length of the support run on the bottom row
            (3D: of each side of the support patch).
        variant_weights: relative frequency of the mask variants of
            ``MASK_VARIANTS`` (drawn exactly like ``sphyr_jax.data.convert``: cells
            with replacement anywhere, L/S included; distinct inner rows;
            distinct columns, L/S included; full = rows 1..nely-2).
        hard_fraction: share of problems in the hard format (one decimal; the
            known cells and the rounded term of the loss use it), else 0/1.
        direction_weights: relative frequency of the load directions
            ``DIRECTION_NAMES`` (down, right, up, left).
        mirror_fraction: share of problems mirrored left-right in the canonical
            frame before the turn.
        pool_fraction: share of the full-mask problems whose boundary
            conditions and known (unmasked) cells come from a pool of plausible
            designs; the others draw fresh boundary conditions and leave known
            non-L/S cells empty.  Partial masks (cells, rows, columns) always
            show a pool design (with empty known cells a partial mask could
            not connect the load to the supports).
        pool_size: designs in the pool.
        pool_volume: (min, max) volume fraction the pool designs are optimised at.
        pool_iterations: SIMP iterations per pool design.
    """

    shape: tuple[int, int] = (10, 10)
    load_run: tuple[int, int] = (3, 10)
    support_run: tuple[int, int] = (3, 6)
    variant_weights: tuple[float, ...] = (1.0,) * len(MASK_VARIANTS)
    hard_fraction: float = 0.5
    direction_weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)
    mirror_fraction: float = 0.5
    pool_fraction: float = 0.0
    pool_size: int = 256
    pool_volume: tuple[float, float] = (0.2, 0.45)
    pool_iterations: int = 60

    def __post_init__(self):
        for name, n in (("variant_weights", len(MASK_VARIANTS)),
                        ("direction_weights", len(DIRECTION_NAMES))):
            w = getattr(self, name)
            if len(w) != n or min(w) < 0 or sum(w) <= 0:
                raise ValueError(f"{name} needs {n} non-negative weights with a positive "
                                 f"sum, got {w}")
        for name in ("hard_fraction", "mirror_fraction", "pool_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("load_run", "support_run"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (min, max) with 1 <= min <= max")
        if len(self.shape) not in (2, 3):
            raise ValueError(f"shape must be (nely, nelx) or (nz, ny, nx), got {self.shape}")
        if len(self.shape) == 3 and any(self.direction_weights[1:]):
            raise ValueError("voxel problems load downwards only: direction_weights must be "
                             f"(w, 0, 0, 0), got {self.direction_weights}")
        sideways = self.direction_weights[1] > 0 or self.direction_weights[3] > 0
        if sideways and self.shape[0] != self.shape[1]:
            raise ValueError(f"sideways load directions need a square grid, got {self.shape}")


@dataclasses.dataclass(frozen=True)
class DrawConfig:
    """Training problems drawn by the benchmark generators' rules (see
    :mod:`sphyr_jax.training.drawing`).

    Attributes:
        sources: ``"<family>:<grid size>"`` sources (families ``v1``, ``v2``;
            the default draws v1 at 9 and 11, since nearly every v1 layout at
            10x10 lies near a sample of the embedded v1 set).
        source_weights: relative frequency of each source among the problems
            of its grid size.
        grid_sizes: the grid sizes of the sources, ascending (a step draws one
            grid size; every problem of a batch has it).
        size_weights: relative frequency of the steps of each grid size.
        batch_sizes: problems per step of each grid size.
        variant_weights: relative frequency of the mask variants of ``MASK_VARIANTS``.
        hard_fraction: share of one-decimal (hard) problems.
        pool_fraction: share of full masks that show a pool answer's known
            cells (partial masks always do).
        bank_size: layouts drawn per source.
        pool_sizes: layouts solved per source (its pool).
        exclude_benchmarks: refuse every layout the benchmark index calls too
            close to a benchmark sample (:mod:`sphyr_jax.data.exclusion`).
    """

    sources: tuple[str, ...] = ("v1:9", "v2:10", "v1:11", "v2:20")
    source_weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)
    size_weights: tuple[float, ...] = (1.0, 1.5, 1.0, 1.5)
    batch_sizes: tuple[int, ...] = (32, 32, 32, 8)
    variant_weights: tuple[float, ...] = (1.0,) * len(MASK_VARIANTS)
    hard_fraction: float = 0.5
    pool_fraction: float = 0.5
    bank_size: int = 1024
    pool_sizes: tuple[int, ...] = (256, 256, 256, 64)
    exclude_benchmarks: bool = True

    def __post_init__(self):
        for source in self.sources:
            parse_source(source)
        per_source = (("source_weights", self.source_weights), ("pool_sizes", self.pool_sizes))
        per_size = (("size_weights", self.size_weights), ("batch_sizes", self.batch_sizes))
        for name, values in per_source + per_size:
            want = len(self.sources) if name in ("source_weights", "pool_sizes") else len(
                self.grid_sizes)
            if len(values) != want or min(values) < 0:
                raise ValueError(f"{name} needs {want} non-negative values, got {values}")
        if len(self.variant_weights) != len(MASK_VARIANTS) or min(self.variant_weights) < 0:
            raise ValueError(f"variant_weights needs {len(MASK_VARIANTS)} non-negative weights")
        for name in ("hard_fraction", "pool_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if min(self.batch_sizes) < 1 or self.bank_size < 1:
            raise ValueError("batch_sizes and bank_size must be positive")

    @property
    def grid_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({parse_source(s)[1] for s in self.sources}))

    @property
    def shape(self) -> tuple[int, int]:
        """The largest grid (the trainer's problems are square)."""
        n = self.grid_sizes[-1]
        return (n, n)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of :class:`~sphyr_jax.training.model.DensityNet`.

    Attributes:
        width: feature channels.
        dilations: one residual 3x3 conv block per entry, with that dilation.
        init_density: density every design cell starts at.
        canonical: turn every input so its load points down before the conv
            net and turn the output back (the model is then exactly
            equivariant to quarter turns of a grid with its load direction).
        mirror_average: average the logits of the (canonical) input and of
            its left-right mirror image, mirrored back (exact mirror
            equivariance; twice the forward cost).
        ndim: grid axes: 2 (Conv2d) or 3 (Conv3d on voxel grids, whose load
            points down: ``canonical`` does nothing there).
        hard_values: how the model writes a hard (one-decimal) subject's
            cells: ``"decimal"`` its densities to one decimal, ``"binary"``
            ``0.0``/``1.0`` at threshold 0.5 (at p = 3 a grey cell is poor
            value: a 0.5 cell pays half the material for an eighth of the
            stiffness).  The loss's rounded term rounds the same way.
        energy_channel: add one input channel computed by the finite
            elements from the input alone: the strain energy density of the
            input with every masked cell solid
            (:func:`~sphyr_jax.training.problems.energy_field`), where a full
            grid's load paths run.
    """

    width: int = 32
    dilations: tuple[int, ...] = (1, 2, 4, 1, 2, 4)
    init_density: float = 0.3
    canonical: bool = True
    mirror_average: bool = True
    ndim: int = 2
    hard_values: str = "decimal"
    energy_channel: bool = False

    def __post_init__(self):
        if self.ndim not in (2, 3):
            raise ValueError(f"ndim must be 2 or 3, got {self.ndim}")
        if self.hard_values not in HARD_VALUES:
            raise ValueError(f"hard_values must be one of {HARD_VALUES}, got "
                             f"{self.hard_values!r}")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Physics loss (see :func:`sphyr_jax.training.loop.batch_loss`).

    Attributes:
        volume_weight: material price lambda on the whole-grid volume fraction.
        excess_weight: price kappa on the material above a problem's target
            volume fraction, $\\kappa \\max(0, \\log(v_f / t))$ (problems drawn by
            the generators' rules carry a target, the answer's volume
            fraction; others none).
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
        solver: linear solver of the FEA, a :mod:`sphyr_jax.fem.solvers` name
            (None: the grid's default, the banded Cholesky in 2D and the
            multigrid CG in 3D; ``"dense"``: fastest to compile, fine for small
            2D grids).
    """

    volume_weight: float = 6.0
    excess_weight: float = 0.0
    penal: float = 3.0
    initial_penal: float = 1.0
    rounded_weight: float = 0.5
    rounded_start: float = 0.2
    initial_sharpness: float = 0.5
    leak: float = 0.0
    solver: str | None = None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser and schedule, plus the nested problem, model and loss settings.

    ``batch_size`` is the batch of a :class:`ProblemConfig`; a
    :class:`DrawConfig` has its own per grid size.
    """

    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    clip_norm: float = 1.0
    log_every: int = 25
    seed: int = 0
    problem: ProblemConfig | DrawConfig = ProblemConfig()
    model: ModelConfig = ModelConfig()
    loss: LossConfig = LossConfig()

    def __post_init__(self):
        if len(self.problem.shape) != self.model.ndim:
            raise ValueError(f"a {self.model.ndim}D model cannot train on problems of shape "
                             f"{self.problem.shape}: set model.ndim")

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
    problem = DrawConfig if "sources" in values.get("problem", {}) else ProblemConfig
    nested = {"problem": problem, "model": ModelConfig, "loss": LossConfig}
    for name, cls in nested.items():
        if name in values:
            values[name] = _build(cls, values[name])
    return TrainConfig(**values)
