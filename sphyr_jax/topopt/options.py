"""Settings of the two yardsticks, and which settings a grid gets.

A completion is scored against an optimum of its masked region; the yardstick
says which optimum:

* ``"reference"`` (:class:`ReferenceOptions`, the default) follows the
  published recipe step for step (:mod:`sphyr_jax.topopt.yardstick`) and
  reproduces the published ``optimal_compliance`` and ``topology_score``;
* ``"strong"`` (:class:`StrongOptions`) searches harder
  (:mod:`sphyr_jax.topopt.strong`): at least as stiff as the published optimum
  on every stored sample, so its scores are stricter.

On voxel grids both names select the reference recipe with
:data:`VOXEL_REFERENCE` settings (:func:`grid_options`): there is no published
3D optimum, and the strong search's polish needs a factorisation to update,
which 3D solves do not keep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal, TypeAlias

from sphyr_jax.topopt import simp, strong_polish

YardstickName: TypeAlias = Literal["reference", "strong"]
YARDSTICKS: tuple[YardstickName, ...] = ("reference", "strong")  # default first
Progress: TypeAlias = Callable[[str, int, int], None]  # progress(stage, done, total)
REFERENCE_VERSION = 1
STRONG_VERSION = 2


@dataclasses.dataclass(frozen=True)
class ReferenceOptions:
    """Settings of the reference yardstick (the published values).

    Attributes:
        filter_radius: cone filter radius (1.2: a cell and its 4 edge neighbours).
        move_limit: largest design change per OC step.
        tol: SIMP stops when the largest design change falls below this.
        max_iterations: SIMP iterations per run.
        penal_schedule: penalties of the cold runs and of the chain.
        penal: penalty of the seeded run and of every score.
        polish_passes: swap passes.
        source_limit: solid cells (lowest strain energy) offered per pass.
        target_limit: empty cells (highest neighbour energy) offered per pass.
        num_devices: devices a batch is split over (None: all local).
    """

    filter_radius: float = 1.2
    move_limit: float = 0.2
    tol: float = 1e-3
    max_iterations: int = 500
    penal_schedule: tuple[float, float, float] = (1.0, 2.0, 3.0)
    penal: float = 3.0
    polish_passes: int = 3
    source_limit: int = 16
    target_limit: int = 24
    num_devices: int | None = None

    def key(self) -> dict:
        """Everything the optimum depends on (cache keys)."""
        out = dataclasses.asdict(self)
        out.pop("num_devices")
        out["penal_schedule"] = list(self.penal_schedule)
        return {"yardstick": "reference", "version": REFERENCE_VERSION, **out}

    def static(self) -> tuple:
        """The hashable settings a compiled program depends on."""
        return (self.filter_radius, self.move_limit, self.tol, self.max_iterations,
                tuple(self.penal_schedule), self.penal, self.polish_passes,
                self.source_limit, self.target_limit)


DEFAULT_REFERENCE = ReferenceOptions()
# The same recipe on voxel grids (SPhyR-3D has no published optimum): SIMP
# runs stop at a largest design change of 1e-2 (the usual 3D setting, as in
# top3d) or after 100 iterations; the swap polish offers the 4 least strained
# solid voxels x the 6 empty voxels beside the most strained ones per pass,
# each pair solved outright (:func:`sphyr_jax.topopt.yardstick_polish.polish_exact`).
VOXEL_REFERENCE = ReferenceOptions(tol=1e-2, max_iterations=100, source_limit=4,
                                   target_limit=6)


@dataclasses.dataclass(frozen=True)
class StrongOptions:
    """Settings of the strong search (:mod:`sphyr_jax.topopt.strong`).

    Attributes:
        simp: SIMP settings (filter radius, move limit, tolerance, iterations).
        penal_schedule: penalties of the cold runs and the continuation chain.
        penal: penalty every candidate is scored at.
        polish_starts: rounded designs polished per sample (best first).
        polish_passes: bound on passes per polished design.
        tabu_passes: passes without a new best the final tabu search may take
            (0: no tabu search).
        tabu_tenure: passes a moved cell stays tabu.
        extra_chain_radius: filter radius of a second continuation chain that
            starts from the cold p = schedule[0] run (None: no second chain);
            1.0 switches the filter off, which breaks symmetries the filtered
            runs keep and often leads to other 0/1 basins.
        pool: slots of the SIMP run pool.
        segment: SIMP iterations per pool step.
        num_devices: devices the batches are split over (None: all local).
    """

    simp: simp.SimpOptions = simp.DEFAULT_OPTIONS
    penal_schedule: tuple[float, ...] = (1.0, 2.0, 3.0)
    penal: float = 3.0
    polish_starts: int = 3
    polish_passes: int = strong_polish.DEFAULT_MAX_PASSES
    tabu_passes: int = 12
    tabu_tenure: int = strong_polish.DEFAULT_TENURE
    extra_chain_radius: float | None = 1.0
    pool: int = 128
    segment: int = 25
    num_devices: int | None = None

    def key(self) -> dict:
        """Everything the optimum depends on (cache keys)."""
        s = self.simp
        solver = s.solver if isinstance(s.solver, str) or s.solver is None else s.solver.name
        return {
            "yardstick": "strong",
            "version": STRONG_VERSION,
            "filter_radius": s.filter_radius,
            "move_limit": s.move_limit,
            "tol": s.tol,
            "max_iterations": s.max_iterations,
            "solver": solver or "banded",  # None: the 2D default
            "penal_schedule": list(self.penal_schedule),
            "penal": self.penal,
            "polish_starts": self.polish_starts,
            "polish_passes": self.polish_passes,
            "tabu_passes": self.tabu_passes,
            "tabu_tenure": self.tabu_tenure,
            "extra_chain_radius": self.extra_chain_radius,
        }


DEFAULT_STRONG = StrongOptions()
Options: TypeAlias = ReferenceOptions | StrongOptions
Yardstick: TypeAlias = YardstickName | Options  # what ``yardstick=`` accepts


def yardstick_options(yardstick: Yardstick = "reference", *, num_devices: int | None = None
                      ) -> Options:
    """Settings of a yardstick by name (``"reference"`` or ``"strong"``).

    A :class:`ReferenceOptions` or :class:`StrongOptions` is returned as it is
    (``num_devices`` then ignored).

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(yardstick, (ReferenceOptions, StrongOptions)):
        return yardstick
    if yardstick == "reference":
        return dataclasses.replace(DEFAULT_REFERENCE, num_devices=num_devices)
    if yardstick == "strong":
        return dataclasses.replace(DEFAULT_STRONG, num_devices=num_devices)
    raise ValueError(f"unknown yardstick {yardstick!r}: use one of {', '.join(YARDSTICKS)}")


def yardstick_name(options: Options) -> YardstickName:
    """``"reference"`` or ``"strong"``: the yardstick a settings object selects."""
    return "reference" if isinstance(options, ReferenceOptions) else "strong"


def grid_options(options: Options, ndim: int) -> Options:
    """The settings used on grids of ``ndim`` axes.

    2D grids use ``options`` as they are.  On voxel grids the strong settings
    and the published (2D) reference settings become :data:`VOXEL_REFERENCE`
    (``num_devices`` kept); other reference settings are used as they are.
    """
    if ndim == 2:
        return options
    plain = dataclasses.replace(options, num_devices=None)
    if isinstance(options, StrongOptions) or plain == DEFAULT_REFERENCE:
        return dataclasses.replace(VOXEL_REFERENCE, num_devices=options.num_devices)
    return options
