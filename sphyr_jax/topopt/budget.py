"""The material budget of an optimum: what a design may spend, and 0/1 roundings to it.

One rule for every optimiser.  A sample's budget is its dataset answer's volume
fraction of the whole grid, $V = vf\\,n$ cells; the pinned (non-design)
material is paid first, so the design cells may spend

$$V_{free} = \\mathrm{clip}(vf\\,n - V_{pinned},\\ 0,\\ n_{design}),$$

and a candidate design is *within budget* when its total material is at most
$vf\\,n$ plus :data:`BUDGET_SLACK` (round-off of a sum of cells).

Two roundings of a continuous design to 0/1 design cells:
:func:`round_to_budget` (the published one: a threshold at the budget's
largest design density, every tied cell kept) and :func:`binarize` (the
strong search's: exactly the densest ``floor(V_free)`` cells, ties broken by
cell order, so it never overspends).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from sphyr_jax.fem.array_types import Densities

BUDGET_SLACK = 1e-9  # cells; a candidate may spend vf * n + slack


def _flat(a, ndim: int):
    a = jnp.asarray(a)
    return a.reshape(a.shape[: a.ndim - ndim] + (-1,)) if ndim != 1 else a


def free_budget(design_mask: Bool[ArrayLike, "*batch_cells"], pinned: Densities,
                volume_fraction: Float[ArrayLike, "*batch"], *, ndim: int = 1
                ) -> tuple[Float[Array, "*batch"], Float[Array, "*batch"]]:
    """Material (cells) left for the design cells, and the pinned material.

    Args:
        design_mask: (..., *cells) bool.
        pinned: (..., *cells) densities off the design mask.
        volume_fraction: (...) budget as a volume fraction of the whole grid.
        ndim: number of trailing cell axes (1: flat designs (..., nel)).

    Returns:
        (free budget $V_{free}$ (...), pinned volume $V_{pinned}$ (...)); the
        target volume of the whole grid is their sum.
    """
    mask = _flat(design_mask, ndim)
    pinned = _flat(pinned, ndim)
    nel = mask.shape[-1]
    pinned_volume = jnp.sum(jnp.where(mask, 0.0, pinned), axis=-1)
    n_design = jnp.sum(mask, axis=-1).astype(pinned.dtype)
    return jnp.clip(volume_fraction * nel - pinned_volume, 0.0, n_design), pinned_volume


def budget_limit(volume_fraction, nel: int):
    """Most material (cells) a candidate may hold: $vf\\,n$ + :data:`BUDGET_SLACK`."""
    return volume_fraction * nel + BUDGET_SLACK


def round_to_budget(x: Float[Array, "*batch cells"], design_mask: Bool[Array, "*batch cells"],
                    budget: Float[Array, "*batch"]) -> Float[Array, "*batch cells"]:
    """The published budget rounding of designs (..., nel).

    With $t = \\lfloor budget + 10^{-9} \\rfloor$ the design cells at or above the
    $t$-th largest design-cell density become 1 (every cell tied with that
    threshold included), the other design cells 0; other cells keep their
    value.  $t \\le 0$: all design cells 0; $t \\ge$ their count: all 1.
    """
    t = jnp.floor(budget + 1e-9).astype(jnp.int32)
    n_design = jnp.sum(design_mask, axis=-1)
    ordered = -jnp.sort(jnp.where(design_mask, -x, jnp.inf), axis=-1)  # descending
    kth = jnp.take_along_axis(ordered, jnp.clip(t - 1, 0, x.shape[-1] - 1)[..., None],
                              axis=-1)[..., 0]
    threshold = jnp.where(t <= 0, jnp.inf, jnp.where(t >= n_design, -jnp.inf, kth))
    return jnp.where(design_mask, (x >= threshold[..., None]).astype(x.dtype), x)


def binarize(densities: Densities, design_mask, pinned, target_solid, *, ndim: int = 2
             ) -> jax.Array:
    """Budget-preserving 0/1 rounding of design cells (pure JAX, batched).

    The ``floor(target_solid)`` densest design cells become solid (ties broken
    by cell order), every other design cell empty, every other cell keeps its
    pinned value; rounding is downwards, so a design never overspends.

    Args:
        densities: (..., *cells).
        design_mask: (..., *cells) bool.
        pinned: (..., *cells) values off the design mask.
        target_solid: (...) material (in cells) available to the design cells.
        ndim: number of grid axes (2, or 3 for voxels).
    """
    densities = jnp.asarray(densities)
    batch = jnp.broadcast_shapes(densities.shape, jnp.shape(design_mask), jnp.shape(pinned))
    densities = jnp.broadcast_to(densities, batch)
    lead = batch[: len(batch) - ndim]
    flat = densities.reshape(lead + (-1,))
    mask = jnp.broadcast_to(jnp.asarray(design_mask), batch).reshape(flat.shape)
    pinned = jnp.broadcast_to(jnp.asarray(pinned), batch)
    # Stable order: density descending, then cell index; non-design cells last.
    key = jnp.where(mask, -flat, jnp.inf)
    order = jnp.argsort(key, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    count = jnp.broadcast_to(jnp.floor(jnp.asarray(target_solid) + 1e-9), lead)
    solid = mask & (rank < count[..., None])
    out = jnp.where(mask, solid.astype(flat.dtype),
                    pinned.reshape(flat.shape))
    return out.reshape(batch)
