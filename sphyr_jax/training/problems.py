"""Random SPhyR-like problems and model features (pure JAX, seeded by keys).

A problem is drawn in the canonical frame of the SPhyR generators — a load run
on the top edge, a support run on the bottom edge, gravity down — with the
known cells empty or taken from a pool of plausible designs (short SIMP runs),
masked like one of the eight SPhyR variants, in the easy (0/1) or hard (one
decimal) format; it is then optionally mirrored left-right and turned by
quarter turns with its load direction (:mod:`sphyr_jax.problem.symmetry`), so every
load direction and every edge occurs.  :func:`build_problem` turns one into a
:class:`~sphyr_jax.problem.loadcase.LoadCase` (design cells = masked non-L/S cells) and
the model's input features; :func:`grid_features` computes the same features
from a dataset's input grid.
"""

from __future__ import annotations

import itertools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import fea
from sphyr_jax.problem.grids import as_grid, check_rectangular, densities_from_grid, token_masks
from sphyr_jax.problem.loadcase import (
    DEFAULT_GRAVITY,
    DEFAULT_GRAVITY_3D,
    LoadCase,
    normalise_gravity,
    unless_2d_default,
)
from sphyr_jax.problem.symmetry import AXIS_DIRECTIONS, mirror_planes, turn_planes
from sphyr_jax.topopt import simp
from sphyr_jax.training.config import MASK_VARIANTS, ProblemConfig

CHANNELS = ("load", "support", "masked", "known", "gravity_row", "gravity_col")
CHANNELS_3D = ("load", "support", "masked", "known", "gravity_layer", "gravity_row",
               "gravity_col")


def channels(ndim: int = 2) -> tuple[str, ...]:
    """Names of the model's input channels on grids of ``ndim`` axes."""
    return CHANNELS if ndim == 2 else CHANNELS_3D


def _node_sum(cells: jax.Array) -> jax.Array:
    """Sum of a cell field over the $2^d$ cells around each node, (*(cells + 1))."""
    d = cells.ndim
    return sum(jnp.pad(cells, [(o, 1 - o) for o in off])
               for off in itertools.product((0, 1), repeat=d))


def force_vector(load_mask: jax.Array, gravity: jax.Array) -> jax.Array:
    """Unit resultant split over the $2^d$ nodes of every load cell, (n_dofs,).

    The JAX twin of :func:`sphyr_jax.problem.loadcase.force_vector` (traceable): DOF k
    of a node points along grid axis $d - 1 - k$ (column, row[, layer]).
    """
    d = load_mask.ndim
    node = _node_sum(load_mask / (2.0 ** d * jnp.maximum(jnp.sum(load_mask), 1))).ravel()
    return jnp.stack([node * gravity[d - 1 - k] for k in range(d)], axis=-1).ravel()


def free_dofs(support_mask: jax.Array) -> jax.Array:
    """False on every DOF of the nodes of every support cell, (n_dofs,)."""
    d = support_mask.ndim
    return jnp.repeat(_node_sum(support_mask.astype(jnp.int32)).ravel() == 0, d)


def input_features(load, support, masked, known, gravity) -> jax.Array:
    """Model input of one grid, (len(channels(d)), *cells) float64.

    Args:
        load: (*cells) visible L cells ((nely, nelx) or (nz, ny, nx)).
        support: (*cells) visible S cells.
        masked: (*cells) V cells.
        known: (*cells) densities of visible cells (L/S solid), 0 on V cells.
        gravity: (d,) unit load direction ((row, col) or (layer, row, col)).
    """
    ones = jnp.ones(jnp.shape(load), jnp.float64)
    g = jnp.asarray(gravity, jnp.float64)
    planes = [jnp.asarray(a, jnp.float64) for a in (load, support, masked, known)]
    return jnp.stack(planes + [g[k] * ones for k in range(g.shape[0])])


def feature_gravity(features: jax.Array) -> jax.Array:
    """The load direction (d,) a model input (C, *cells) carries in its gravity channels."""
    d = features.ndim - 1
    return features[4:4 + d].reshape(d, -1)[:, 0]


def problem_load_case(load, support, gravity, known, masked) -> LoadCase:
    """The load case of a problem: its loads pushing along ``gravity``, its supports
    fixed, ``known`` as the pinned densities with L/S solid (their volume fraction
    the budget), the masked non-L/S cells free to design.

    Args:
        load: (*cells) bool, L cells.
        support: (*cells) bool, S cells.
        gravity: (d,) unit load direction.
        known: (*cells) densities of the non-L/S cells.
        masked: (*cells) bool, V cells.
    """
    structural = load | support
    pinned = jnp.where(structural, 1.0, known)
    free = free_dofs(support)
    return LoadCase(
        load_mask=load, support_mask=support, design_mask=masked & ~structural,
        pinned=pinned, force=force_vector(load, gravity) * free, free_dofs=free,
        gravity=jnp.asarray(gravity, jnp.float64), volume_fraction=jnp.mean(pinned))


def visible_load_case(features: jax.Array, densities: jax.Array) -> LoadCase:
    """The load case an input shows, carrying ``densities``: its visible loads and
    supports, its load direction, ``densities`` (visible L/S solid) as the pinned
    design (:func:`problem_load_case`).

    Args:
        features: (C, *cells) model features (:func:`input_features`).
        densities: (*cells) the design to carry.
    """
    load, support, masked = (features[i] > 0.5 for i in range(3))
    return problem_load_case(load, support, feature_gravity(features), densities, masked)


def energy_field(features: jax.Array, *, penal: float = 3.0) -> jax.Array:
    """The finite elements' reading of an input: where its load paths run, (*cells).

    The input's design with every masked cell solid (known cells as shown,
    visible L/S solid) is solved under its visible loads and supports, and
    each cell's strain energy $e_i = E(\\rho_i)\\, u_i^T K_0 u_i$ is returned
    as $\\log(1 + e_i / \\bar e)$ ($\\bar e$ the grid's mean).  Zero where
    nothing is carried (no visible load or support).  A function of the
    input alone (no gradient reaches it), computed the same way for every
    input, so a turned or mirrored input gets the turned or mirrored field
    up to rounding; the model evaluates it in its canonical frame, which
    keeps its equivariance exact.

    Args:
        features: (C, *cells) model features (:func:`input_features`).
        penal: SIMP exponent of the solve.
    """
    rho = jnp.where(features[2] > 0.5, 1.0, jnp.clip(features[3], 0.0, 1.0))
    case = visible_load_case(features, rho)
    sol = fea.solve(case, rho, penal=penal, keep_factor=False)
    e = fea.element_strain_energy(case, sol.displacements) * fea.simp_moduli(rho, penal=penal)
    e = jnp.where(jnp.isfinite(e) & (e > 0.0), e, 0.0)
    return jnp.log1p(e / jnp.maximum(jnp.mean(e), jnp.finfo(e.dtype).tiny))


def build_problem(load, support, gravity, known, masked) -> tuple[LoadCase, jax.Array]:
    """Load case and model features of one problem.

    Args:
        load: (nely, nelx) bool, the true L cells (the physics).
        support: (nely, nelx) bool, the true S cells.
        gravity: (2,) unit load direction.
        known: (nely, nelx) densities of the non-L/S cells (shown where unmasked).
        masked: (nely, nelx) bool, V cells of the input (L/S cells may be hidden).

    Returns:
        (LoadCase whose design cells are the masked non-L/S cells, whose pinned
        densities are ``known`` with L/S solid and whose budget is their volume
        fraction; features (len(CHANNELS), nely, nelx)).
    """
    case = problem_load_case(load, support, gravity, known, masked)
    features = input_features(load & ~masked, support & ~masked, masked,
                              jnp.where(masked, 0.0, case.pinned), gravity)
    return case, features


def round_to_format(x: jax.Array, hard, *, binary_hard: bool = False) -> jax.Array:
    """0/1 at threshold 0.5 (easy) or one decimal (hard), like the completions.

    Args:
        x: (..., nely, nelx) densities.
        hard: bool, or a bool array of x's leading (batch) shape: per-sample format.
        binary_hard: hard cells are 0/1 too (a model whose ``hard_values`` is
            ``"binary"``).
    """
    if binary_hard:
        return (x >= 0.5).astype(x.dtype)
    hard = jnp.asarray(hard)
    hard = hard.reshape(hard.shape + (1,) * (x.ndim - hard.ndim))
    return jnp.where(hard, jnp.round(x * 10.0) / 10.0, (x >= 0.5).astype(x.dtype))


def _run(key, n: int, lengths: tuple[int, int]) -> jax.Array:
    """A contiguous run of random length in ``lengths`` at a random place on n cells."""
    k1, k2 = jax.random.split(key)
    length = jax.random.randint(k1, (), min(lengths[0], n), min(lengths[1], n) + 1)
    start = jax.random.randint(k2, (), 0, n - length + 1)
    idx = jnp.arange(n)
    return (idx >= start) & (idx < start + length)


def _draw(key, weights) -> jax.Array:
    w = jnp.asarray(weights, jnp.float64)
    return jax.random.choice(key, len(weights), p=w / jnp.sum(w))


def sample_boundary(key, cfg: ProblemConfig):
    """Canonical-frame boundary conditions of one problem.

    Returns:
        (load (*shape) bool: a run on the top row — in 3D a rectangular patch
        of the top layer, each side a run —, support: the same on the bottom
        row / layer, gravity (d,): down).
    """
    k1, k2 = jax.random.split(key)
    top = jnp.arange(cfg.shape[0]) == 0
    bottom = jnp.arange(cfg.shape[0]) == cfg.shape[0] - 1

    def patch(k, first, lengths):
        ks = [k] if len(cfg.shape) == 2 else jax.random.split(k, len(cfg.shape) - 1)
        out = first
        for axis, n in enumerate(cfg.shape[1:]):
            run = _run(ks[axis], n, lengths)
            out = out[..., None] & run.reshape((1,) * (axis + 1) + (n,))
        return out

    load = patch(k1, top, cfg.load_run)
    support = patch(k2, bottom, cfg.support_run)
    gravity = (1.0,) + (0.0,) * (len(cfg.shape) - 1)
    return load, support, jnp.asarray(gravity, jnp.float64)


def variant_mask(key, variant, shape: tuple[int, ...]) -> jax.Array:
    """The canonical-frame mask (*shape) bool of a SPhyR variant (index into ``MASK_VARIANTS``).

    Drawn like :func:`sphyr_jax.data.convert.mask_grid` (2D) and
    :func:`sphyr_jax.data.convert.mask_grid_3d`: ``<n>_random_cell`` = n draws with
    replacement anywhere (L/S cells included); ``<n>_random_row`` = n distinct
    rows among 1..nely-2 (3D: n distinct rows of the interior layers);
    ``<n>_random_column`` = n distinct columns, L/S included (3D: vertical
    columns through every layer); ``full`` = rows 1..nely-2 (3D: layers
    1..nz-2).
    """
    shape = tuple(shape)
    first = shape[0]
    nel = math.prod(shape)
    kc, kr, kk = jax.random.split(key, 3)
    inner = (jnp.arange(first) >= 1) & (jnp.arange(first) <= first - 2)
    inner = inner.reshape((first,) + (1,) * (len(shape) - 1))
    # Row-like units: a row (2D) or a row of an interior layer (3D), (*shape[:-1]).
    row_units = jnp.broadcast_to(inner, shape[:-1] + (1,))[..., 0]
    # Column-like units: a column (2D) or a vertical column of voxels (3D), (*shape[1:]).
    col_shape = shape[1:]
    options = []
    max_cells = max(int(v.split("_")[0]) for v in MASK_VARIANTS if v.endswith("cell"))
    picks = jax.random.randint(kc, (max_cells,), 0, nel)
    row_pick = jax.random.uniform(kr, shape[:-1])
    col_pick = jax.random.uniform(kk, col_shape)

    def distinct(u, eligible, n):
        u = jnp.where(eligible, u, 2.0).ravel()
        return (jnp.argsort(jnp.argsort(u)) < n).reshape(eligible.shape)

    for name in MASK_VARIANTS:
        if name == "full":
            options.append(jnp.broadcast_to(inner, shape))
            continue
        n, kind = int(name.split("_")[0]), name.split("_")[-1]
        if kind == "cell":
            cells = jnp.zeros(nel, bool).at[picks].max(jnp.arange(max_cells) < n)
            options.append(cells.reshape(shape))
        elif kind == "row":
            options.append(jnp.broadcast_to(distinct(row_pick, row_units, n)[..., None], shape))
        else:
            cols = distinct(col_pick, jnp.ones(col_shape, bool), n)
            options.append(jnp.broadcast_to(cols[None], shape))
    return jnp.stack(options)[variant]


def sample_mask_and_variant(key, cfg: ProblemConfig):
    """A canonical-frame mask (nely, nelx) bool and its variant (index into ``MASK_VARIANTS``),
    drawn by ``variant_weights``; see :func:`variant_mask`."""
    k1, k2 = jax.random.split(key)
    variant = _draw(k1, cfg.variant_weights)
    return variant_mask(k2, variant, cfg.shape), variant


def sample_mask(key, cfg: ProblemConfig) -> jax.Array:
    """A random canonical SPhyR mask (nely, nelx) bool; see :func:`sample_mask_and_variant`."""
    return sample_mask_and_variant(key, cfg)[0]


class ProblemInfo(eqx.Module):
    """What was drawn for a problem (batched like the problems).

    Attributes:
        variant: index into ``MASK_VARIANTS``.
        hard: one-decimal format (else 0/1).
        direction: load direction, index into ``DIRECTION_NAMES`` (= the
            counter-clockwise quarter turns applied to the canonical frame).
        mirrored: mirrored left-right in the canonical frame.
    """

    variant: jax.Array
    hard: jax.Array
    direction: jax.Array
    mirrored: jax.Array


class Pool(eqx.Module):
    """Plausible canonical-frame designs whose known cells training problems show.

    Attributes:
        load: (P, nely, nelx) bool.
        support: (P, nely, nelx) bool.
        densities: (P, nely, nelx) SIMP densities (L/S solid), rounded to each
            problem's format when used.
    """

    load: jax.Array
    support: jax.Array
    densities: jax.Array


def make_pool(key, cfg: ProblemConfig) -> Pool:
    """Optimise ``pool_size`` random canonical problems with short SIMP runs.

    Each problem gets a random budget in ``pool_volume`` with every non-L/S cell
    a design cell.  Rounded like completions (0/1 at 0.5, or one decimal) about
    98 % of these designs still carry the load.
    """
    kb, kv = jax.random.split(key)
    load, support, gravity = jax.vmap(lambda k: sample_boundary(k, cfg))(
        jax.random.split(kb, cfg.pool_size))
    zeros = jnp.zeros((cfg.pool_size,) + cfg.shape)
    everything = jnp.ones((cfg.pool_size,) + cfg.shape, bool)
    case, _ = jax.vmap(build_problem)(load, support, gravity, zeros, everything)
    vf = jax.random.uniform(kv, (cfg.pool_size,), minval=cfg.pool_volume[0],
                            maxval=cfg.pool_volume[1])
    case = eqx.tree_at(lambda c: c.volume_fraction, case, vf)
    res = simp.optimize(case, penal=3.0,
                        options=simp.SimpOptions(max_iterations=cfg.pool_iterations))
    rho = jnp.where(case.design_mask, res.densities, 1.0)
    return Pool(load=load, support=support, densities=rho)


def sample_problem(key, cfg: ProblemConfig, pool: Pool | None = None):
    """One random problem: (LoadCase, features, :class:`ProblemInfo`).

    Canonical boundary conditions and known cells (with a pool: a pool design
    rounded to the drawn format for every partial mask and for a share
    ``pool_fraction`` of the full masks; else fresh runs and empty cells),
    a mask variant, a format, then a left-right mirror (``mirror_fraction``)
    and the quarter turns of the drawn load direction, applied to the load,
    support, known and masked cells alike; see :func:`build_problem`.  Voxel
    problems (a 3D ``cfg.shape``) are mirrored but not turned: their load
    points down.
    """
    ks = jax.random.split(key, 7)
    masked, variant = sample_mask_and_variant(ks[0], cfg)
    load, support, _ = sample_boundary(ks[1], cfg)
    hard = jax.random.uniform(ks[2]) < cfg.hard_fraction
    known = jnp.zeros(cfg.shape)
    if pool is not None:
        i = jax.random.randint(ks[3], (), 0, pool.load.shape[0])
        full = variant == MASK_VARIANTS.index("full")
        use = ~full | (jax.random.uniform(ks[4]) < cfg.pool_fraction)
        load = jnp.where(use, pool.load[i], load)
        support = jnp.where(use, pool.support[i], support)
        known = jnp.where(use, round_to_format(pool.densities[i], hard), known)
    mirrored = jax.random.uniform(ks[5]) < cfg.mirror_fraction
    direction = _draw(ks[6], cfg.direction_weights)
    planes = jnp.stack([load, support, masked, known]).astype(jnp.float64)
    planes = mirror_planes(planes, mirrored)
    if len(cfg.shape) == 2:
        planes = turn_planes(planes, direction)
        gravity = jnp.asarray(AXIS_DIRECTIONS, jnp.float64)[direction]
    else:  # voxel problems keep the canonical frame: the load points down
        gravity = jnp.asarray(DEFAULT_GRAVITY_3D)
    load, support, masked = (planes[i] > 0.5 for i in range(3))
    known = planes[3]
    case, features = build_problem(load, support, gravity, known, masked)
    info = ProblemInfo(variant=variant, hard=hard, direction=direction, mirrored=mirrored)
    return case, features, info


def needs_pool(cfg: ProblemConfig) -> bool:
    """Whether problems of ``cfg`` show pool designs (partial masks drawn, or ``pool_fraction``)."""
    partial = any(w > 0 for v, w in zip(MASK_VARIANTS, cfg.variant_weights, strict=True)
                  if v != "full")
    return partial or cfg.pool_fraction > 0


def sample_problems(key, batch_size: int, cfg: ProblemConfig, pool: Pool | None = None):
    """A batch of random problems: (LoadCase with leading axis B, features (B, C, *shape),
    :class:`ProblemInfo` of (B,) arrays)."""
    return jax.vmap(lambda k: sample_problem(k, cfg, pool))(jax.random.split(key, batch_size))


def grid_features(input_grid, gravity_dir=None) -> np.ndarray:
    """Model features of a dataset input grid (text or tokens), (C, *cells).

    ``L``/``S`` tokens are visible load/support cells (solid), ``V`` tokens masked
    cells, numbers known densities (clipped to [0, 1]; unparsable tokens read 0).
    A grid of layers (3D) gives voxel features; ``gravity_dir`` defaults to
    down ((1, 0) or (1, 0, 0); the 2D default also means down on voxels).
    """
    grid = as_grid(input_grid)
    ndim = len(check_rectangular(grid, what="input grid"))
    load, support, masked = token_masks(grid)
    known, _ = densities_from_grid(grid)  # L/S solid; V and unparsable tokens 0
    gravity_dir = unless_2d_default(gravity_dir, ndim)
    if gravity_dir is None:
        gravity_dir = DEFAULT_GRAVITY if ndim == 2 else DEFAULT_GRAVITY_3D
    feats = input_features(load, support, masked, known, normalise_gravity(gravity_dir, ndim=ndim))
    return np.asarray(feats)
