"""Random SPhyR-like problems and model features (pure JAX, seeded by keys).

A problem is a load run on the top edge, a support run on the bottom edge (as
in SPhyR v1), a load direction, a mask of the kind the SPhyR variants use
(full, random rows, random columns, random cells) and the densities of the
known cells: empty, or a plausible design from a pool optimised by short SIMP
runs.  :func:`build_problem` turns one into a
:class:`~sphyr_jax.loadcase.LoadCase` (design cells = masked non-L/S cells) and
the model's input features; :func:`grid_features` computes the same features
from a dataset's input grid.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax import simp
from sphyr_jax.grids import LOAD, MASK, SUPPORT, as_grid, check_rectangular, parse_number
from sphyr_jax.loadcase import DEFAULT_GRAVITY, LoadCase, normalise_gravity
from sphyr_jax.training.config import MASK_KINDS, ProblemConfig

CHANNELS = ("load", "support", "masked", "known", "gravity_row", "gravity_col")
GRAVITIES = ((1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0))


def _node_sum(cells: jax.Array) -> jax.Array:
    """Sum of a cell field over the four cells around each node, (nely+1, nelx+1)."""
    return sum(jnp.pad(cells, ((dr, 1 - dr), (dc, 1 - dc))) for dr in (0, 1) for dc in (0, 1))


def force_vector(load_mask: jax.Array, gravity: jax.Array) -> jax.Array:
    """Unit resultant split over the four nodes of every load cell, (n_dofs,).

    The JAX twin of :func:`sphyr_jax.loadcase.force_vector` (traceable).
    """
    node = _node_sum(load_mask / (4.0 * jnp.maximum(jnp.sum(load_mask), 1))).ravel()
    return jnp.stack([node * gravity[1], node * gravity[0]], axis=-1).ravel()


def free_dofs(support_mask: jax.Array) -> jax.Array:
    """False on both DOFs of the four nodes of every support cell, (n_dofs,)."""
    return jnp.repeat(_node_sum(support_mask.astype(jnp.int32)).ravel() == 0, 2)


def input_features(load, support, masked, known, gravity) -> jax.Array:
    """Model input of one grid, (len(CHANNELS), nely, nelx) float64.

    Args:
        load, support: (nely, nelx) visible L / S cells.
        masked: (nely, nelx) V cells.
        known: (nely, nelx) densities of visible cells (L/S solid), 0 on V cells.
        gravity: (2,) unit load direction (row, col).
    """
    ones = jnp.ones(jnp.shape(load), jnp.float64)
    g = jnp.asarray(gravity, jnp.float64)
    planes = [jnp.asarray(a, jnp.float64) for a in (load, support, masked, known)]
    return jnp.stack(planes + [g[0] * ones, g[1] * ones])


def build_problem(load, support, gravity, known, masked) -> tuple[LoadCase, jax.Array]:
    """Load case and model features of one problem.

    Args:
        load, support: (nely, nelx) bool, the true L / S cells (the physics).
        gravity: (2,) unit load direction.
        known: (nely, nelx) densities of the non-L/S cells (shown where unmasked).
        masked: (nely, nelx) bool, V cells of the input (L/S cells may be hidden).

    Returns:
        (LoadCase whose design cells are the masked non-L/S cells, whose pinned
        densities are ``known`` with L/S solid and whose budget is their volume
        fraction; features (len(CHANNELS), nely, nelx)).
    """
    structural = load | support
    pinned = jnp.where(structural, 1.0, known)
    free = free_dofs(support)
    case = LoadCase(
        load_mask=load, support_mask=support, design_mask=masked & ~structural,
        pinned=pinned, force=force_vector(load, gravity) * free, free_dofs=free,
        gravity=jnp.asarray(gravity, jnp.float64), volume_fraction=jnp.mean(pinned))
    features = input_features(load & ~masked, support & ~masked, masked,
                              jnp.where(masked, 0.0, pinned), gravity)
    return case, features


def round_to_format(x: jax.Array, hard: bool) -> jax.Array:
    """0/1 at threshold 0.5 (easy) or one decimal (hard), like the completions."""
    return jnp.round(x * 10.0) / 10.0 if hard else (x >= 0.5).astype(x.dtype)


def _run(key, n: int, lengths: tuple[int, int]) -> jax.Array:
    """A contiguous run of random length in ``lengths`` at a random place on n cells."""
    k1, k2 = jax.random.split(key)
    length = jax.random.randint(k1, (), min(lengths[0], n), min(lengths[1], n) + 1)
    start = jax.random.randint(k2, (), 0, n - length + 1)
    idx = jnp.arange(n)
    return (idx >= start) & (idx < start + length)


def _pick_lines(key, eligible: jax.Array, count) -> jax.Array:
    """``count`` distinct eligible entries, uniformly at random."""
    u = jnp.where(eligible, jax.random.uniform(key, eligible.shape), 2.0)
    return jnp.argsort(jnp.argsort(u)) < count


def sample_boundary(key, cfg: ProblemConfig):
    """(load (nely, nelx) bool, support (nely, nelx) bool, gravity (2,)) of one problem."""
    nely, nelx = cfg.shape
    k1, k2, k3 = jax.random.split(key, 3)
    rows = jnp.arange(nely)[:, None]
    load = (rows == 0) & _run(k1, nelx, cfg.load_run)[None, :]
    support = (rows == nely - 1) & _run(k2, nelx, cfg.support_run)[None, :]
    if cfg.random_gravity:
        gravity = jnp.asarray(GRAVITIES)[jax.random.randint(k3, (), 0, len(GRAVITIES))]
    else:
        gravity = jnp.asarray(DEFAULT_GRAVITY)
    return load, support, gravity


def sample_mask_and_kind(key, cfg: ProblemConfig):
    """A random SPhyR-style mask (nely, nelx) bool and its kind (index into ``MASK_KINDS``).

    The kind is drawn by ``mask_weights``: full (rows 1..nely-2), random inner
    rows, random columns (L/S cells included) or random cells (drawn with
    replacement, L/S cells included).
    """
    nely, nelx = cfg.shape
    ks = jax.random.split(key, 7)
    weights = jnp.asarray(cfg.mask_weights, jnp.float64)
    kind = jax.random.choice(ks[0], len(MASK_KINDS), p=weights / jnp.sum(weights))
    rows = jnp.arange(nely)
    inner = (rows >= 1) & (rows <= nely - 2)
    n_rows = jax.random.choice(ks[1], jnp.asarray(cfg.row_counts))
    n_cols = jax.random.choice(ks[2], jnp.asarray(cfg.column_counts))
    n_cells = jax.random.choice(ks[3], jnp.asarray(cfg.cell_counts))
    max_cells = max(cfg.cell_counts)
    picks = jax.random.randint(ks[4], (max_cells,), 0, nely * nelx)
    cells = jnp.zeros(nely * nelx, bool).at[picks].max(jnp.arange(max_cells) < n_cells)
    full = (nely, nelx)
    options = jnp.stack([
        jnp.broadcast_to(inner[:, None], full),
        jnp.broadcast_to(_pick_lines(ks[5], inner, n_rows)[:, None], full),
        jnp.broadcast_to(_pick_lines(ks[6], jnp.ones(nelx, bool), n_cols)[None, :], full),
        cells.reshape(full),
    ])
    return options[kind], kind


def sample_mask(key, cfg: ProblemConfig) -> jax.Array:
    """A random SPhyR-style mask (nely, nelx) bool; see :func:`sample_mask_and_kind`."""
    return sample_mask_and_kind(key, cfg)[0]


class Pool(eqx.Module):
    """Plausible designs whose known cells training problems show (batch-first).

    Attributes:
        load, support: (P, nely, nelx) bool.
        gravity: (P, 2).
        densities: (P, nely, nelx) rounded designs (L/S solid).
    """

    load: jax.Array
    support: jax.Array
    gravity: jax.Array
    densities: jax.Array


def make_pool(key, cfg: ProblemConfig) -> Pool:
    """Optimise ``pool_size`` random problems with short SIMP runs, then round them.

    Each problem gets a random budget in ``pool_volume`` with every non-L/S cell
    a design cell; the densities are rounded like completions: one decimal
    (hard) or 0/1 at threshold 0.5 (easy; about 98 % of these designs still
    carry the load).
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
    res = simp.optimize(case, 3.0, options=simp.SimpOptions(max_iterations=cfg.pool_iterations))
    rho = jnp.where(case.design_mask, round_to_format(res.densities, cfg.hard), 1.0)
    return Pool(load=load, support=support, gravity=gravity, densities=rho)


def sample_problem(key, cfg: ProblemConfig, pool: Pool | None = None):
    """One random problem: (LoadCase, features); see :func:`build_problem`.

    Full masks always get fresh boundary conditions and empty known cells (as
    in SPhyR, whose first and last rows hold little but L/S); other masks take
    a pool design (its BCs and densities) with probability ``pool_fraction``.
    """
    k1, k2, k3, k4 = jax.random.split(key, 4)
    masked, kind = sample_mask_and_kind(k2, cfg)
    load, support, gravity = sample_boundary(k1, cfg)
    known = jnp.zeros(cfg.shape)
    if pool is not None and cfg.pool_fraction > 0:
        i = jax.random.randint(k3, (), 0, pool.load.shape[0])
        use = (jax.random.uniform(k4) < cfg.pool_fraction) & (kind != MASK_KINDS.index("full"))
        load = jnp.where(use, pool.load[i], load)
        support = jnp.where(use, pool.support[i], support)
        gravity = jnp.where(use, pool.gravity[i], gravity)
        known = jnp.where(use, pool.densities[i], known)
    return build_problem(load, support, gravity, known, masked)


def sample_problems(key, batch_size: int, cfg: ProblemConfig, pool: Pool | None = None):
    """A batch of random problems: (LoadCase with leading axis B, features (B, C, H, W))."""
    return jax.vmap(lambda k: sample_problem(k, cfg, pool))(jax.random.split(key, batch_size))


def grid_features(input_grid, gravity_dir=DEFAULT_GRAVITY) -> np.ndarray:
    """Model features of a dataset input grid (text or tokens), (C, nely, nelx).

    ``L``/``S`` tokens are visible load/support cells (solid), ``V`` tokens masked
    cells, numbers known densities (clipped to [0, 1]; unparsable tokens read 0).
    """
    grid = as_grid(input_grid)
    shape = check_rectangular(grid, "input grid")
    tokens = np.array([[str(t).strip() for t in row] for row in grid], dtype=object)
    known = np.zeros(shape)
    for (r, c), t in np.ndenumerate(tokens):
        if t in (LOAD, SUPPORT):
            known[r, c] = 1.0
        elif t != MASK:
            v = parse_number(t)
            known[r, c] = 0.0 if v is None else min(max(v, 0.0), 1.0)
    feats = input_features(tokens == LOAD, tokens == SUPPORT, tokens == MASK, known,
                           normalise_gravity(gravity_dir))
    return np.asarray(feats)
