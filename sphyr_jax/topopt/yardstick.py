"""The ``reference`` yardstick: the published optimum, recipe step for step.

For one sample (design cells free, every other cell pinned to the dataset
answer, L/S solid, whole-grid budget = the answer's volume fraction) the
published scoring takes the stiffest within-budget design among

* 8 designs: cold SIMP runs at p = 1, 2, 3; a continuation chain p = 1 -> 2 -> 3
  (its first stage *is* the cold p = 1 run; later stages start from the
  previous stage's physical densities); the answer; a p = 3 run from the answer;
* the budget rounding of each (:func:`~sphyr_jax.topopt.budget.round_to_budget`), in the order
  design, rounding, design, rounding, ...; first one wins a tie;

then polishes the rounding of the winner by single swaps
(:mod:`sphyr_jax.topopt.yardstick_polish`) and keeps the polish if it is stiffer and
within budget (:mod:`sphyr_jax.topopt.budget`).  Settings:
:class:`~sphyr_jax.topopt.options.ReferenceOptions`.

Voxel grids (SPhyR-3D) run the same program with
:data:`~sphyr_jax.topopt.options.VOXEL_REFERENCE`:
the six runs share two pool slots per sample, every solve is a multigrid CG
(to :data:`SIMP_SOLVE_TOL` inside SIMP, 1e-10 for scores), the filter is
the 3D cone (a voxel and its 6 face neighbours at radius 1.2), and each swap
of the polish is solved outright.
Every step follows the published method, including its quirks: the first
SIMP iteration solves the *unfiltered* start design, the sensitivity is
$-p \\max(\\rho, 10^{-9})^{p-1} u_e^T K_e u_e$, the multiplier bisection returns the
design of its last midpoint, a rounding keeps every cell tied with the
threshold, the polish ranks truncated cell lists by strain energy.  So the
figures it produces are the published ones (``optimal_compliance`` and
``topology_score`` to 1e-6 on the stored records).

Compilation budget: all SIMP runs of a batch are one ``lax.while_loop`` (four
slots per sample: the chain slot runs its three stages one after the other,
each stage starting when the previous one stops, as data), candidate scoring
and polish follow in the same compiled program, and batch sizes are rounded
up to a few buckets (padding samples are inactive), so one grid shape
compiles once per bucket and process.

Arrays are batch-first; designs are flattened to (B, nel) inside.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import fea
from sphyr_jax.fem.array_types import Densities
from sphyr_jax.fem.solvers import AbstractSolver, Banded, Multigrid
from sphyr_jax.fem.structured import get_grid
from sphyr_jax.problem.loadcase import LoadCase, fix_samples
from sphyr_jax.runtime import bounded_cache
from sphyr_jax.sharding import batch_call, device_count
from sphyr_jax.topopt import yardstick_polish
from sphyr_jax.topopt.budget import budget_limit, free_budget, round_to_budget
from sphyr_jax.topopt.options import (
    DEFAULT_REFERENCE,
    Progress,
    ReferenceOptions,
    grid_options,
)
from sphyr_jax.topopt.result import OptimumResult

BUCKETS = (1, 4, 16, 64)  # samples per compiled program (padded inside)
VOXEL_BUCKETS = (1, 2, 4, 8, 16)  # the same on voxel grids (every slot costs a solve)
SIMP_SOLVE_TOL = 1e-8  # relative CG residual of the iterative SIMP solves
SIMP_MULTIGRID_CELLS = 1600  # 2D grids from this many cells (40x40) solve SIMP steps by multigrid
BISECTION_TOL = 1e-6
BISECTION_BRACKET = (1e-9, 1e9)


# ----------------------------------------------------------------------------
# Pieces (pure JAX, batch-first, flat designs (..., nel)).


@bounded_cache(maxsize=16)
def filter_stencil(shape: tuple[int, ...], radius: float):
    """Cone filter as a stencil: neighbour indices and weights (nel, K).

    Args:
        shape: grid shape, (nely, nelx) or (nz, ny, nx).
        radius: filter radius in cells.

    Terms are listed in increasing neighbour index (the order in which a
    sparse row of the filter sums them); missing neighbours point at the cell
    itself with weight 0 (adding an exact zero changes nothing).
    """
    shape = tuple(int(n) for n in shape)
    reach = int(np.ceil(radius)) - 1
    offsets = [o for o in itertools.product(range(-reach, reach + 1), repeat=len(shape))
               if radius - math.hypot(*o) > 0.0]
    nel = math.prod(shape)
    coords = np.unravel_index(np.arange(nel), shape)
    idx = np.zeros((nel, len(offsets)), np.int32)
    w = np.zeros((nel, len(offsets)))
    for k, off in enumerate(offsets):
        moved = [c + o for c, o in zip(coords, off, strict=True)]
        inside = np.all([(m >= 0) & (m < n) for m, n in zip(moved, shape, strict=True)], axis=0)
        flat = np.ravel_multi_index([np.clip(m, 0, n - 1) for m, n in zip(moved, shape,
                                                                           strict=True)], shape)
        idx[:, k] = np.where(inside, flat, np.arange(nel))
        w[:, k] = np.where(inside, radius - math.hypot(*off), 0.0)
    return idx, w


def apply_stencil(x, idx, w):
    """$H x$ for a symmetric stencil (also $H^T x$), summed term by term."""
    out = w[:, 0] * x[..., idx[:, 0]]
    for k in range(1, idx.shape[1]):
        out = out + w[:, k] * x[..., idx[:, k]]
    return out


def _pow(x, e):
    """$x^e$ for exponents 0, 1, 2 exactly as a multiplication (else ``power``).

    ``e`` broadcasts against ``x``; ``power`` (tens of ns per element) is only
    evaluated when some exponent is not 0, 1 or 2.
    """
    def exact(x, e):
        return jnp.where(e == 0.0, 1.0, jnp.where(e == 1.0, x, x * x))

    def general(x, e):
        return jnp.where((e == 0.0) | (e == 1.0) | (e == 2.0), exact(x, e), jnp.power(x, e))

    small = jnp.all((e == 0.0) | (e == 1.0) | (e == 2.0))
    return jax.lax.cond(small, exact, general, x, jnp.broadcast_to(e, jnp.shape(x)))


def simp_solver(shape: tuple[int, ...]) -> tuple[AbstractSolver, bool]:
    """The solver of the SIMP steps on a grid: (solver, iterative).

    2D grids: the banded factorisation wherever it runs on LAPACK (CPU
    programs from 12x12) or is small (below :data:`SIMP_MULTIGRID_CELLS`
    cells, the published 10x10 included).  Larger 2D grids off the CPU and
    voxel grids: the multigrid CG to a relative residual of
    :data:`SIMP_SOLVE_TOL`, each step starting from the slot's previous
    displacements (a SIMP step changes the design a little, so fewer
    iterations are needed).  The XLA banded factorisation costs
    $O(n b^2)$ per solve, $b \\approx 2 n_{elx}$, so it grows as $n_{elx}^4$
    on square grids while a multigrid iteration grows as $n_{elx}^2$, which
    sets the crossover; with LAPACK only the slots running a run pay a
    factorisation (a slot without a run costs nothing, see :func:`_energies`).
    ``benchmarks/scaling.py`` times the three methods per solve and grid size.
    """
    if len(shape) == 2 and (math.prod(shape) < SIMP_MULTIGRID_CELLS
                            or Banded().uses_lapack(get_grid(shape))):
        return Banded(), False
    return Multigrid(tol=SIMP_SOLVE_TOL), True


def _energies(case: LoadCase, x, penal, live, u0=None):
    """Compliance (S,), unit-modulus element energies (S, nel) and displacements
    (S, n) of designs (S, nel), solved by :func:`simp_solver` (from ``u0``).

    A slot without a run (``live`` False) solves nothing (:func:`fix_samples`).
    """
    shape = case.shape
    solver, _ = simp_solver(shape)
    case = fix_samples(case, live)
    sol = fea.solve(case, x.reshape((-1,) + shape), penal=penal, solver=solver, x0=u0,
                    keep_factor=False)
    e = fea.element_strain_energy(case, sol.displacements)
    return sol.compliance, e.reshape(x.shape), sol.displacements


def multiplier_threshold(scaled, x, mask, dv, target, rest, move, *, max_steps: int = 100):
    r"""Where the published bisection's volume test changes sign, per slot (S,).

    The optimality-criteria design at multiplier $\lambda$ is
    $x_e(\lambda) = \mathrm{clip}(s_e / \sqrt{\lambda}, a_e, b_e)$ on design cells,
    with $a_e = \max(x_e - m, 0)$, $b_e = \min(x_e + m, 1)$ and $s_e$ = ``scaled``;
    its volume $V(t) = \sum_e dv_e\, \mathrm{clip}(s_e t, a_e, b_e) + r$ is
    piecewise linear and non-decreasing in $t = \lambda^{-1/2}$.  A safeguarded
    Newton iteration on $V(t) = $ ``target`` inside the bisection's bracket
    (a geometric bisection step wherever Newton's would leave it; exact once
    inside the right linear piece, so a few steps) returns $\lambda^*$ with
    $V > $ target exactly where $\lambda < \lambda^*$, to rounding:
    $+\infty$ where the design at the bracket's top is still over, 0 where
    the one at its bottom is not.  Slots without a crossing, or not settled
    after ``max_steps`` steps, return an estimate the caller's check rejects.

    Args:
        scaled: (S, nel) $s_e$.
        x: (S, nel) the current design.
        mask: (S, nel) design cells.
        dv: (S, nel) volume weights.
        target: (S,) volume target.
        rest: (S,) the volume off the design cells.
        move: move limit $m$.

    Returns:
        (S,) $\lambda^*$.
    """
    low = jnp.maximum(x - move, 0.0)
    high = jnp.minimum(x + move, 1.0)
    weight = jnp.where(mask, dv, 0.0)

    def value_and_slope(t):
        st = scaled * t[:, None]
        inside = (st > low) & (st < high)
        return (jnp.sum(weight * jnp.clip(st, low, high), axis=-1) + rest,
                jnp.sum(jnp.where(inside, weight * scaled, 0.0), axis=-1))

    def body(c):
        lo, hi, t, k, done = c
        v, slope = value_and_slope(t)
        below = v <= target
        lo = jnp.where(below & ~done, jnp.maximum(lo, t), lo)
        hi = jnp.where(~below & ~done, jnp.minimum(hi, t), hi)
        newton = t + (target - v) / jnp.where(slope > 0.0, slope, 1.0)
        inside = (slope > 0.0) & (newton > lo) & (newton < hi)
        finished = done | (jnp.abs(v - target) <= 1e-14 * jnp.abs(target)) | (
            hi - lo <= 1e-15 * hi)
        t = jnp.where(finished, t, jnp.where(inside, newton, jnp.sqrt(lo * hi)))
        return lo, hi, t, k + 1, finished

    # Only the bisection's bracket matters: outside it every test agrees.
    t_lo = jnp.full(target.shape, BISECTION_BRACKET[1] ** -0.5)
    t_hi = jnp.full(target.shape, BISECTION_BRACKET[0] ** -0.5)
    v_lo, v_hi = value_and_slope(t_lo)[0], value_and_slope(t_hi)[0]
    trivial = (v_lo > target) | (v_hi <= target)
    _, _, t, _, _ = jax.lax.while_loop(
        lambda c: jnp.any(~c[4]) & (c[3] < max_steps), body,
        (t_lo, t_hi, jnp.sqrt(t_lo * t_hi), 0, trivial))
    return jnp.where(v_lo > target, jnp.inf, jnp.where(v_hi <= target, 0.0, 1.0 / (t * t)))


def _bisect(volume, target, live, threshold, unroll: int = 8):
    r"""The published multiplier bisection: its last midpoint (S,).

    From $[10^{-9}, 10^9]$ the midpoint replaces the lower end where the
    design's volume is over ``target``, else the upper end, until the
    relative width is :data:`BISECTION_TOL` (slots not ``live`` do not move).

    The volume test is first *predicted* from ``threshold``
    (:func:`multiplier_threshold`: over exactly where the midpoint is below
    it) and the bisection replayed on the slots' scalars alone, ``unroll``
    steps per loop pass.  The volume is monotone in the multiplier (every
    operation in it is, in floating point too), and every midpoint tested
    lies outside the final bracket, so checking the two final ends (over at
    the lower end unless it never moved, not over at the upper one) proves
    every predicted test equal to the real one.  Where that check fails the
    bisection is run as published, testing the volume at every midpoint.
    """
    def open_(c):
        lo, hi, _ = c
        return ((hi - lo) / (lo + hi) > BISECTION_TOL) & live

    def step(c, over):
        lo, hi, mid = c
        go = open_(c)
        mm = 0.5 * (lo + hi)
        up = over(mm)
        return (jnp.where(go & up, mm, lo), jnp.where(go & ~up, mm, hi), jnp.where(go, mm, mid))

    def running(c):
        return jnp.any(open_(c))

    lo = jnp.full(target.shape, BISECTION_BRACKET[0])
    hi = jnp.full(target.shape, BISECTION_BRACKET[1])
    start = (lo, hi, 0.5 * (lo + hi))

    def replay(c):
        for _ in range(unroll):
            c = step(c, lambda mm: mm < threshold)
        return c

    lo, hi, mid = jax.lax.while_loop(running, replay, start)
    moved_lo, moved_hi = lo != BISECTION_BRACKET[0], hi != BISECTION_BRACKET[1]
    proven = ~live | ((~moved_lo | (volume(lo) > target)) & (~moved_hi | (volume(hi) <= target)))

    def published(_):
        return jax.lax.while_loop(running, lambda c: step(c, lambda mm: volume(mm) > target),
                                  start)[2]

    return jax.lax.cond(jnp.all(proven), lambda _: mid, published, None)


# ----------------------------------------------------------------------------
# SIMP: every run of a batch in one while loop, over a pool of slots.

# Runs of a sample, in scheduling priority: the chain first (its stages are the
# critical path), then the independent runs.  (penalty index, parent kind,
# start): penalty index 0..2 into the schedule, 3 = ``penal``; start 0 = cold
# (uniform budget), 1 = the seed, 2 = the parent's physical densities.
_KINDS = ((0, -1, 0), (1, 0, 2), (2, 1, 2), (1, -1, 0), (2, -1, 0), (3, -1, 1))
_DESIGN_KINDS = (0, 3, 4, 0, 1, 2, -1, 5)  # the 8 published designs (-1: the seed)


def slot_count(n_samples: int, *, ndim: int = 2) -> int:
    """Slots of the SIMP pool for a batch.

    2D: one per sample, at least four.  Voxel grids: two per sample — the
    chain's three stages in one, the three other runs in the other, so when
    every run takes about as long, no slot idles (on a CPU every slot costs a
    solve per iteration, busy or not).
    """
    return 2 * n_samples if ndim == 3 else max(4, n_samples)


def pool_sizes(n_slots: int) -> tuple[int, ...]:
    """Slot counts the SIMP pool shrinks through: ``n_slots``, then /4 while at
    least 4 slots.

    Every slot costs a solve per iteration, busy or not, so once the runs left
    (running or waiting for a parent) fit a smaller pool, the live slots move
    into one and the stragglers stop paying for finished slots.  A run's
    arithmetic does not depend on the pool around it (the solves and the
    optimality-criteria steps are per slot), so its result is the same.  Each
    pool size is another copy of the SIMP step in the program (compilation
    time and memory), so small pools do not shrink: a smaller pool pays only
    when it saves many slots' solves (``benchmarks/optimum3d.py`` measures
    the voxel yardstick's time and memory).
    """
    out = [n_slots]
    while out[-1] // 4 >= 4:
        out.append(out[-1] // 4)
    return tuple(out)


def _compact(st: dict, size: int) -> dict:
    """The pool's state with its live slots first, cut to ``size`` slots."""
    order = jnp.argsort(st["run"] < 0, stable=True)[:size]
    slot_keys = ("run", "x", "phys", "its", "u")
    return {k: (v[order] if k in slot_keys else v) for k, v in st.items()}


class _Samples(NamedTuple):
    """What the SIMP runs of each sample need, derived once (batch-first, flat)."""

    mask: jax.Array  # (B, nel) design cells (L/S cells excluded)
    pinned: jax.Array  # (B, nel) densities off the design cells (L/S solid)
    budget: jax.Array  # (B,) material left for the design cells
    target: jax.Array  # (B,) volume target of the whole grid
    seed: jax.Array  # (B, nel) the seed design
    uniform: jax.Array  # (B, nel) the cold start: the budget spread evenly
    dv: jax.Array  # (B, nel) volume weights: the physical volume is dv . x + rest
    rest: jax.Array  # (B,) physical volume off the design cells


def _samples(case: LoadCase, seed, hs, stencil) -> _Samples:
    nb = case.load_mask.shape[0]
    nel = hs.shape[0]
    structural = (case.load_mask | case.support_mask).reshape(nb, nel)
    mask = case.design_mask.reshape(nb, nel) & ~structural
    pinned = jnp.where(structural, 1.0, jnp.clip(case.pinned.reshape(nb, nel), 0.0, 1.0))
    budget, pinned_volume = free_budget(mask, pinned, case.volume_fraction)
    uniform = jnp.where(mask, (budget / jnp.maximum(jnp.sum(mask, axis=-1), 1))[:, None], pinned)
    # Volume of the physical design is linear in the design: sum_j dv_j x_j + rest.
    dv = apply_stencil(mask / hs, *stencil)
    return _Samples(
        mask=mask, pinned=pinned, budget=budget, target=pinned_volume + budget,
        seed=jnp.where(mask, jnp.clip(seed, 0.0, 1.0), pinned), uniform=uniform, dv=dv,
        rest=jnp.sum(jnp.where(mask, 0.0, dv * pinned + pinned), axis=-1))


class _Runs(NamedTuple):
    """The SIMP runs of a batch (run ``k * B + i`` is kind ``k`` of sample ``i``)."""

    sample: jax.Array  # (R,) the sample of each run
    parent: jax.Array  # (R,) the run it continues (-1: none)
    penal: jax.Array  # (R,) its penalty
    start: jax.Array  # (R,) 0: cold, 1: the seed, 2: the parent's physical densities


def _runs(nb: int, schedule, penal) -> _Runs:
    kinds = np.asarray(_KINDS)
    run_kind = jnp.asarray(np.repeat(np.arange(len(_KINDS)), nb))
    parent = np.where(kinds[:, 1] >= 0, kinds[:, 1], 0)[:, None] * nb + np.arange(nb)
    pens = jnp.asarray(tuple(schedule) + (penal,), jnp.float64)
    return _Runs(
        sample=jnp.asarray(np.tile(np.arange(nb), len(_KINDS))),
        parent=jnp.asarray(np.where(kinds[:, 1:2] >= 0, parent, -1).reshape(-1)),
        penal=pens[jnp.asarray(kinds[:, 0])][run_kind],
        start=jnp.asarray(kinds[:, 2])[run_kind])


def _assign(st: dict, runs: _Runs, smp: _Samples) -> dict:
    """Idle slots of the pool take the ready runs, in priority order."""
    n_runs = runs.sample.shape[0]
    status = st["status"]
    parent_done = jnp.where(runs.parent >= 0, status[jnp.maximum(runs.parent, 0)] == 2, True)
    ready = (status == 0) & parent_done
    idle = st["run"] < 0
    slot_rank = jnp.cumsum(idle) - 1
    run_rank = jnp.cumsum(ready) - 1
    match = ready[None, :] & (run_rank[None, :] == slot_rank[:, None]) & idle[:, None]
    take = jnp.any(match, axis=1)
    new = jnp.argmax(match, axis=1)
    sample = runs.sample[new]
    parent = st["out"][jnp.maximum(runs.parent[new], 0)]
    cold = (runs.start[new] == 0)[:, None]
    start = jnp.where(cold, smp.uniform[sample],
                      jnp.where((runs.start[new] == 1)[:, None], smp.seed[sample], parent))
    start = jnp.where(smp.mask[sample], jnp.clip(start, 1e-3, 1.0), smp.pinned[sample])
    start = jnp.where(cold, smp.uniform[sample], start)
    keep = ~take[:, None]
    warm = {} if "u" not in st else {"u": jnp.where(keep, st["u"], 0.0)}
    return {
        **st,
        **warm,
        "run": jnp.where(take, new, st["run"]),
        "x": jnp.where(keep, st["x"], start),
        "phys": jnp.where(keep, st["phys"], start),  # the first solve is unfiltered
        "its": jnp.where(take, 0, st["its"]),
        "status": status.at[jnp.where(take, new, n_runs)].set(1, mode="drop"),
    }


def _oc_step(x, dc, live, m, p, dvs, tgt, rst, *, move, stencil, hs):
    """The published optimality-criteria step of each slot: (design, physical design)."""
    # x sqrt(B / mid) as (x sqrt(B)) / sqrt(mid): one square root per slot
    # and step of the bisection rather than one per cell.
    scaled = x * jnp.sqrt(jnp.maximum(-dc, 0.0) / jnp.maximum(dvs, 1e-12))

    def design_at(mid):
        cand = jnp.clip(scaled / jnp.sqrt(mid)[:, None], x - move, x + move)
        return jnp.where(m, jnp.clip(cand, 0.0, 1.0), p)

    def volume(mid):
        return jnp.sum(jnp.where(m, dvs * design_at(mid), 0.0), axis=-1) + rst

    mid = _bisect(volume, tgt, live, multiplier_threshold(scaled, x, m, dvs, tgt, rst, move))
    new = design_at(mid)
    return new, jnp.where(m, apply_stencil(new, *stencil) / hs, p)


def _simp_step(st: dict, case: LoadCase, runs: _Runs, smp: _Samples, stencil, hs,
               static) -> dict:
    """One SIMP iteration of every slot; runs that stop free their slot for the next."""
    _, move, tol, max_it = static[:4]
    n_runs = runs.sample.shape[0]
    run = st["run"]
    live = run >= 0
    sample = runs.sample[jnp.maximum(run, 0)]
    m, p = smp.mask[sample], smp.pinned[sample]
    pen = runs.penal[jnp.maximum(run, 0)]
    c, ue, u = _energies(jax.tree.map(lambda a: a[sample], case), st["phys"], pen, live,
                         st.get("u"))
    finite = jnp.isfinite(c)
    dc = (-pen[:, None] * _pow(jnp.maximum(st["phys"], 1e-9), pen[:, None] - 1.0)) * ue
    # Materialised before the filter, whose gathers would otherwise
    # recompute the energies once per neighbour.
    dc = apply_stencil(jax.lax.optimization_barrier(dc * m / hs), *stencil)
    new, phys = _oc_step(st["x"], dc, live & finite, m, p, smp.dv[sample], smp.target[sample],
                         smp.rest[sample], move=move, stencil=stencil, hs=hs)
    change = jnp.max(jnp.where(m, jnp.abs(new - st["x"]), 0.0), axis=-1)
    step = live & finite
    its = st["its"] + live.astype(jnp.int32)
    stop = live & (~finite | (change < tol) | (its >= max_it))
    phys = jnp.where(step[:, None], phys, st["phys"])
    slot_run = jnp.where(stop, run, n_runs)
    warm = {} if "u" not in st else {"u": jnp.where(finite[:, None], u, 0.0)}
    st = {
        **warm,
        "run": jnp.where(stop, -1, run),
        "x": jnp.where(step[:, None], new, st["x"]),
        "phys": phys,
        "its": its,
        "status": st["status"].at[slot_run].set(2, mode="drop"),
        "out": st["out"].at[slot_run].set(phys, mode="drop"),
        "run_its": st["run_its"].at[slot_run].set(its, mode="drop"),
        "capped": st["capped"].at[slot_run].set(finite & (change >= tol), mode="drop"),
    }
    return _assign(st, runs, smp)


def _simp_runs(case: LoadCase, seed, active, static):
    """The 8 published designs of every sample, (B, 8, nel).

    The 6 SIMP runs of each sample (cold p = 1, 2, 3; the chain's p = 2 and
    p = 3 stages, whose p = 1 stage is the cold p = 1 run; the run from the
    seed) share a pool of :func:`slot_count` slots inside one while loop: a
    slot whose run stops takes the next ready run (chain stages first, as soon
    as their parent stops), so few slots idle and the chains set the pace; the
    pool shrinks (:func:`pool_sizes`) once the runs left fit a smaller one.

    Args:
        case: batched load cases (B).
        seed: (B, nel) seed designs (the dataset answers).
        active: (B,) bool; inactive (padding) samples do not iterate.
        static: :meth:`~sphyr_jax.topopt.options.ReferenceOptions.static`.

    Returns:
        (designs (B, 8, nel), iterations (B,), capped (B,): a run hit the
        iteration bound, design mask (B, nel), pinned (B, nel), free budget (B,)).
    """
    radius, schedule, penal = static[0], static[4], static[5]
    shape = case.shape
    nb = case.load_mask.shape[0]
    nel = math.prod(shape)
    n_slots = slot_count(nb, ndim=case.ndim)
    idx_np, w_np = filter_stencil(shape, radius)
    stencil = (jnp.asarray(idx_np), jnp.asarray(w_np))
    hs = apply_stencil(jnp.ones((nel,)), *stencil)
    smp = _samples(case, seed, hs, stencil)
    runs = _runs(nb, schedule, penal)
    n_runs = runs.sample.shape[0]

    # Iterative solves start from each slot's previous displacements.
    warm = ({"u": jnp.zeros((n_slots, case.force.shape[-1]))} if simp_solver(shape)[1]
            else {})
    st = _assign({
        **warm,
        "run": jnp.full((n_slots,), -1),
        "x": jnp.zeros((n_slots, nel)),
        "phys": jnp.zeros((n_slots, nel)),
        "its": jnp.zeros((n_slots,), jnp.int32),
        "status": jnp.where(active[runs.sample], 0, 2),
        "out": jnp.zeros((n_runs, nel)),
        "run_its": jnp.zeros((n_runs,), jnp.int32),
        "capped": jnp.zeros((n_runs,), bool),
    }, runs, smp)
    sizes = pool_sizes(n_slots)
    for size, smaller in zip(sizes, sizes[1:] + (0,), strict=True):
        if size < st["run"].shape[0]:
            st = _compact(st, size)

        def cond(st, smaller=smaller):
            pending = jnp.sum(st["status"] != 2)  # running or waiting for a slot
            return (pending > 0) & (pending > smaller)

        st = jax.lax.while_loop(
            cond, lambda st: _simp_step(st, case, runs, smp, stencil, hs, static), st)
    out = st["out"].reshape(len(_KINDS), nb, nel)
    designs = jnp.stack([smp.seed if k < 0 else out[k] for k in _DESIGN_KINDS], axis=1)
    its = jnp.sum(st["run_its"].reshape(len(_KINDS), nb), axis=0)
    capped = jnp.any(st["capped"].reshape(len(_KINDS), nb), axis=0)
    return designs, its, capped, smp.mask, smp.pinned, smp.budget


# ----------------------------------------------------------------------------
# Candidates and the polish.


def _program(case: LoadCase, seed, active, *, static):
    """The whole yardstick for a batch: SIMP runs, candidates, polish."""
    shape = case.shape
    nb = case.load_mask.shape[0]
    nel = math.prod(shape)
    penal = static[5]
    designs, its, capped, mask, pinned, budget = _simp_runs(case, seed, active, static)
    # Padding samples solve nothing from here on and have no cell to polish.
    case = fix_samples(case, active)
    mask = mask & active[:, None]
    rounded = round_to_budget(designs, mask[:, None], budget[:, None])
    cands = jnp.stack([designs, rounded], axis=2).reshape(nb, 16, nel)  # d0, r0, d1, ...
    c = fea.compliance(case, cands.transpose(1, 0, 2).reshape((16, nb) + shape),
                       penal=penal).T
    limit = budget_limit(case.volume_fraction, nel)
    ok = (jnp.sum(cands, axis=-1) <= limit[:, None]) & (c < jnp.inf)
    winner = jnp.where(jnp.any(ok, axis=-1), jnp.argmin(jnp.where(ok, c, jnp.inf), axis=-1), 15)
    best_x = jnp.take_along_axis(cands, winner[:, None, None], axis=1)[:, 0]
    best_c = jnp.take_along_axis(c, winner[:, None], axis=1)[:, 0]
    if static[6] == 0:  # no polish
        return {"densities": best_x.reshape((nb,) + shape), "compliance": best_c,
                "winner": winner, "iterations": its, "converged": ~capped}
    start = round_to_budget(best_x, mask, budget)
    if case.ndim == 2:
        polished, pc = yardstick_polish.polish(case, start, mask, static=static)
    else:  # no factorisation to update: every swap is solved (multigrid CG)
        polished, pc = yardstick_polish.polish_exact(case, start, mask, static=static,
                                                    solver="multigrid")
    # The same design scores the same (the published method solves it the same way).
    changed = jnp.any(polished != best_x, axis=-1)
    better = (pc < best_c) & changed & (jnp.sum(polished, axis=-1) <= limit)
    return {
        "densities": jnp.where(better[:, None], polished, best_x).reshape((nb,) + shape),
        "compliance": jnp.where(better, pc, best_c),
        "winner": jnp.where(better, 16, winner),
        "iterations": its,
        "converged": ~capped,
    }


def _bucket(n: int, ndim: int = 2) -> int:
    buckets = BUCKETS if ndim == 2 else VOXEL_BUCKETS
    return next((b for b in buckets if b >= n), buckets[-1])


def reference_optimum_batch(load_case: LoadCase, seeds: Densities | None = None, *,
                            options: ReferenceOptions = DEFAULT_REFERENCE,
                            progress: Progress | None = None) -> OptimumResult:
    """Reference-yardstick optima of many samples.

    Args:
        load_case: batched load cases (leading axis B); ``volume_fraction`` is
            each sample's budget and ``pinned`` its dataset answer.
        seeds: optional (B, *cells) seed designs (default: the answers).
        options: settings (the published ones by default; on voxel grids see
            :func:`~sphyr_jax.topopt.options.grid_options`).
        progress: optional callable(stage, done, total).

    Returns:
        An :class:`~sphyr_jax.topopt.result.OptimumResult` (NumPy) whose
        ``winner`` says which candidate won (0..15 in the published order,
        16: the polish).
    """
    fea.require_x64()
    case_np = jax.tree.map(np.asarray, load_case)
    nb = case_np.load_mask.shape[0]
    ndim = load_case.ndim
    options = grid_options(options, ndim)
    shape = tuple(case_np.load_mask.shape[1:])
    seeds = case_np.pinned if seeds is None else np.asarray(seeds, np.float64)
    seeds = seeds.reshape(nb, -1)
    static = options.static()
    largest = (BUCKETS if ndim == 2 else VOXEL_BUCKETS)[-1]
    outs = []
    for lo in range(0, nb, largest):
        idx = np.arange(lo, min(nb, lo + largest))
        size = _bucket(len(idx), ndim)
        pad = np.concatenate([idx, np.full(size - len(idx), idx[0])])
        active = np.arange(size) < len(idx)
        part = jax.tree.map(lambda a, pad=pad: a[pad], case_np)
        devices = max(1, min(device_count(options.num_devices), size))
        res = batch_call(_program, part, seeds[pad], active, static=static,
                         num_devices=devices)
        outs.append({k: np.asarray(v)[: len(idx)] for k, v in res.items()})
        if progress is not None:
            progress("optima", int(idx[-1]) + 1, nb)
    out = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    return OptimumResult(
        densities=out["densities"].reshape((nb,) + shape),
        compliance=out["compliance"],
        volume_fraction=out["densities"].reshape(nb, -1).mean(axis=1),
        iterations=out["iterations"],
        converged=out["converged"],
        winner=out["winner"],
    )
