"""A plain NumPy/SciPy re-implementation of the reference yardstick's method.

This is an independent second implementation of the published scoring recipe
(the design notes' "The reference optimum"), written for two jobs:

* the side-by-side baseline of ``benchmarks/yardstick.py`` (one sample at a
  time, a sparse assembly and a SciPy ``spsolve`` per finite-element solve,
  exactly as the reference implementation works), and
* a second method for the tests: on a few samples the JAX ``reference``
  yardstick (:mod:`sphyr_jax.topopt.yardstick`) must give the same optimum.

Nothing here uses JAX; only the grid parsing (:mod:`sphyr_jax.problem.loadcase`, which
returns NumPy arrays) is shared with the library.

Method, per sample (design cells free, every other cell pinned to the answer,
whole-grid budget = the answer's volume fraction):

1. SIMP runs: cold at p = 1, 2, 3; a continuation chain p = 1 -> 2 -> 3 (each
   stage warm-started from the previous stage's physical densities); the answer
   itself and a p = 3 run warm-started from it.  Each run: cone filter of
   radius 1.2, sensitivities through the filter, optimality criteria with
   move limit 0.2 and a bisection on the multiplier over [1e-9, 1e9] until the
   relative bracket is <= 1e-6, stop when the largest design change is below
   1e-3 or after 500 iterations.  The first iteration solves the unfiltered
   start design.
2. Candidates: every run's design and a budget rounding of it (the densest
   design cells down to a threshold, ties all kept), in that order; the
   stiffest within budget at p = 3 wins (first one on ties).
3. Polish of the rounding of the winner: up to 3 passes; per pass the 16
   solid design cells of lowest strain energy (unit modulus) are paired with
   the 24 empty design cells of highest neighbour energy, and the first swap
   that improves on the best compliance so far by more than 1e-12 (source-major
   order) is kept; the polished design replaces the winner if it is stiffer and
   within budget.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.linalg import spsolve

E_MIN = 1e-9
NU = 0.3
RESIDUAL_TOL = 1e-6
FILTER_RADIUS = 1.2
MOVE_LIMIT = 0.2
TOLERANCE = 1e-3
MAX_ITERATIONS = 500
SCHEDULE = (1.0, 2.0, 3.0)
PENAL = 3.0
POLISH_PASSES = 3
POLISH_EVALUATIONS = 6000
SOURCE_LIMIT = 16
TARGET_LIMIT = 24
BUDGET_SLACK = 1e-9


def q4_stiffness(nu: float = NU) -> np.ndarray:
    """Unit-modulus plane-stress Q4 stiffness (8, 8) by 2x2 Gauss quadrature."""
    d = np.array([[1.0, nu, 0.0], [nu, 1.0, 0.0], [0.0, 0.0, 0.5 * (1.0 - nu)]]) / (1 - nu**2)
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    ke = np.zeros((8, 8))
    g = 1.0 / np.sqrt(3.0)
    for xi in (-g, g):
        for eta in (-g, g):
            dn = 0.25 * np.array([[-(1 - eta), 1 - eta, 1 + eta, -(1 + eta)],
                                  [-(1 - xi), -(1 + xi), 1 + xi, 1 - xi]])
            jac = dn @ corners
            dxy = np.linalg.solve(jac, dn)
            b = np.zeros((3, 8))
            b[0, 0::2], b[1, 1::2] = dxy[0], dxy[1]
            b[2, 0::2], b[2, 1::2] = dxy[1], dxy[0]
            ke += b.T @ d @ b * np.linalg.det(jac)
    return ke


class Model:
    """Sparse finite elements of one load case (fixed grid, supports and load).

    Args:
        shape: (nely, nelx).
        free_dofs: (n_dofs,) bool.
        force: (n_dofs,) load vector.
    """

    def __init__(self, shape, free_dofs, force):
        self.nely, self.nelx = shape
        self.nel = self.nely * self.nelx
        rows, cols = np.divmod(np.arange(self.nel), self.nelx)
        tl = rows * (self.nelx + 1) + cols
        nodes = np.stack([tl, tl + 1, tl + self.nelx + 2, tl + self.nelx + 1], axis=1)
        self.edofs = np.empty((self.nel, 8), int)
        self.edofs[:, 0::2], self.edofs[:, 1::2] = 2 * nodes, 2 * nodes + 1
        self.n = 2 * (self.nely + 1) * (self.nelx + 1)
        self.ke = q4_stiffness()
        self.free = np.flatnonzero(np.asarray(free_dofs, bool))
        self.force = np.asarray(force, np.float64)
        self._rows = np.repeat(self.edofs, 8, axis=1).ravel()
        self._cols = np.tile(self.edofs, (1, 8)).ravel()

    def solve(self, moduli):
        """(displacements (n,), compliance); inf when unsolvable or unloaded."""
        u = np.zeros(self.n)
        if self.free.size == 0 or not np.any(self.force):
            return u, np.inf
        vals = (np.asarray(moduli, float).reshape(-1)[:, None] * self.ke.ravel()[None]).ravel()
        k = coo_matrix((vals, (self._rows, self._cols)), shape=(self.n, self.n)).tocsc()
        kf = k[self.free, :][:, self.free].tocsc()
        ff = self.force[self.free]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                sol = np.asarray(spsolve(kf, ff), float)
            except Exception:  # noqa: BLE001 - a singular system is an invalid design
                return u, np.inf
        if not np.all(np.isfinite(sol)):
            return u, np.inf
        if np.linalg.norm(kf @ sol - ff) > RESIDUAL_TOL * max(np.linalg.norm(ff), 1.0):
            return u, np.inf
        u[self.free] = sol
        c = float(self.force @ u)
        return u, (c if np.isfinite(c) and c >= 0.0 else np.inf)

    def energies(self, u):
        """Unit-modulus element energies u_e^T K_e u_e, (nel,)."""
        ue = u[self.edofs]
        return np.einsum("ij,jk,ik->i", ue, self.ke, ue)

    def compliance(self, densities, penal=PENAL):
        return self.solve(moduli(densities, penal))[1]


def moduli(densities, penal):
    rho = np.clip(np.asarray(densities, float).reshape(-1), 0.0, 1.0)
    return E_MIN + rho**penal * (1.0 - E_MIN)


def density_filter(nely, nelx, radius=FILTER_RADIUS):
    """Sparse cone filter H (CSR) and its row sums."""
    reach = int(np.ceil(radius)) - 1
    rows, cols, vals = [], [], []
    for r in range(nely):
        for c in range(nelx):
            for rr in range(max(r - reach, 0), min(r + reach + 1, nely)):
                for cc in range(max(c - reach, 0), min(c + reach + 1, nelx)):
                    w = radius - np.hypot(r - rr, c - cc)
                    if w > 0.0:
                        rows.append(r * nelx + c)
                        cols.append(rr * nelx + cc)
                        vals.append(w)
    h = coo_matrix((vals, (rows, cols)), shape=(nely * nelx,) * 2).tocsr()
    return h, np.asarray(h.sum(axis=1)).ravel()


@dataclasses.dataclass
class Sample:
    """One scoring problem: load case, design region, pinned densities, budget."""

    model: Model
    free: np.ndarray  # (nel,) bool design cells (no L/S cells)
    pinned: np.ndarray  # (nel,) answer densities, L/S solid
    volume_fraction: float

    @property
    def free_budget(self) -> float:
        pinned_volume = float(self.pinned[~self.free].sum())
        total = float(self.volume_fraction) * self.model.nel
        return min(max(total - pinned_volume, 0.0), float(self.free.sum()))


def sample_from_load_case(case) -> Sample:
    """A :class:`Sample` from a (NumPy) :class:`sphyr_jax.problem.loadcase.LoadCase`."""
    shape = tuple(np.asarray(case.load_mask).shape)
    structural = (np.asarray(case.load_mask) | np.asarray(case.support_mask)).reshape(-1)
    pinned = np.clip(np.asarray(case.pinned, float).reshape(-1), 0.0, 1.0).copy()
    pinned[structural] = 1.0
    return Sample(Model(shape, case.free_dofs, case.force),
                  np.asarray(case.design_mask, bool).reshape(-1) & ~structural, pinned,
                  float(case.volume_fraction))


def simp_run(s: Sample, penal: float, start=None):
    """One SIMP run; returns the physical densities (nel,)."""
    m = s.model
    free, pinned = s.free, s.pinned
    if not free.any():
        return pinned.copy()
    h, hs = density_filter(m.nely, m.nelx)
    target = float(pinned[~free].sum()) + s.free_budget
    design = pinned.copy()
    if start is None:
        design[free] = s.free_budget / free.sum()
    else:
        design[free] = np.clip(np.asarray(start, float).reshape(-1), 1e-3, 1.0)[free]
    physical = design.copy()
    dv = h.T @ (np.ones(m.nel) * free / hs)
    for _ in range(MAX_ITERATIONS):
        u, c = m.solve(moduli(physical, penal))
        if not np.isfinite(c):
            break
        dc = -penal * np.maximum(physical, 1e-9) ** (penal - 1.0) * m.energies(u)
        dc = h.T @ (dc * free / hs)
        lo, hi = 1e-9, 1e9
        new = design
        while (hi - lo) / (lo + hi) > 1e-6:
            mid = 0.5 * (lo + hi)
            ratio = np.sqrt(np.maximum(-dc, 0.0) / np.maximum(dv, 1e-12) / mid)
            cand = np.clip(np.clip(design * ratio, design - MOVE_LIMIT, design + MOVE_LIMIT),
                           0.0, 1.0)
            new = np.where(free, cand, pinned)
            physical = np.where(free, (h @ new) / hs, pinned)
            if physical.sum() > target:
                lo = mid
            else:
                hi = mid
        change = float(np.max(np.abs(new[free] - design[free])))
        design = new
        if change < TOLERANCE:
            break
    return physical


def round_to_budget(densities, free, target_solid):
    """Budget rounding: design cells at or above the ``target``-th largest become 1."""
    x = np.asarray(densities, float)
    out = (x >= 0.5).astype(float)
    out[~free] = x[~free]
    if not free.any():
        return out
    t = int(np.floor(target_solid + 1e-9))
    vals = np.sort(x[free])[::-1]
    threshold = np.inf if t <= 0 else (-np.inf if t >= vals.size else vals[t - 1])
    out[free] = (x[free] >= threshold).astype(float)
    return out


def _neighbour_energy(energy, solid):
    """Largest energy among the 8 solid neighbours of each cell (0 if none)."""
    padded = np.pad(np.where(solid, energy, 0.0), 1)
    n, m = energy.shape
    best = np.zeros_like(energy)
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr or dc:
                best = np.maximum(best, padded[1 + dr: 1 + dr + n, 1 + dc: 1 + dc + m])
    return best


def polish(s: Sample, design):
    """Best-improvement single-swap search with ranked, truncated cell lists."""
    m = s.model
    x = np.asarray(design, float).copy()
    best = m.compliance(x)
    evaluations = 0
    for _ in range(POLISH_PASSES):
        u, _ = m.solve(moduli(x, PENAL))
        energy = m.energies(u).reshape(m.nely, m.nelx)
        grid = x.reshape(m.nely, m.nelx)
        free = s.free.reshape(m.nely, m.nelx)
        solid_cells = np.flatnonzero(((grid > 0.5) & free).ravel())
        void_cells = np.flatnonzero(((grid <= 0.5) & free).ravel())
        near = _neighbour_energy(energy, grid > 0.5).ravel()
        solid_cells = sorted(solid_cells, key=lambda e: energy.ravel()[e])[:SOURCE_LIMIT]
        void_cells = sorted(void_cells, key=lambda e: -near[e])[:TARGET_LIMIT]
        if not solid_cells or not void_cells:
            break
        swap = None
        for a in solid_cells:
            for b in void_cells:
                if evaluations >= POLISH_EVALUATIONS:
                    break
                cand = x.copy()
                cand[a], cand[b] = 0.0, 1.0
                c = m.compliance(cand)
                evaluations += 1
                if c < best - 1e-12:
                    best, swap = c, (a, b)
        if swap is None:
            break
        x[swap[0]], x[swap[1]] = 0.0, 1.0
    return x, best


@dataclasses.dataclass
class Optimum:
    densities: np.ndarray  # (nely, nelx)
    compliance: float
    winner: int  # index of the winning candidate (16: the polish)


def reference_optimum(case) -> Optimum:
    """The reference yardstick of one sample (a NumPy LoadCase)."""
    s = sample_from_load_case(case)
    m = s.model
    designs = [simp_run(s, p) for p in SCHEDULE]
    start = None
    for p in SCHEDULE:
        start = simp_run(s, p, start)
        designs.append(start)
    seed = s.pinned.copy()  # the answer (L/S solid)
    designs += [seed, simp_run(s, PENAL, seed)]
    candidates = []
    for d in designs:
        candidates += [d, round_to_budget(d, s.free, s.free_budget)]
    budget = s.volume_fraction * m.nel + BUDGET_SLACK
    best_x, best_c, winner = None, np.inf, -1
    for j, cand in enumerate(candidates):
        if cand.sum() > budget:
            continue
        c = m.compliance(cand)
        if c < best_c:
            best_x, best_c, winner = cand, c, j
    if best_x is None:
        best_x, winner = candidates[-1], len(candidates) - 1
        best_c = m.compliance(best_x)
    polished, pc = polish(s, round_to_budget(best_x, s.free, s.free_budget))
    if pc < best_c and polished.sum() <= budget:
        best_x, best_c, winner = polished, pc, len(candidates)
    return Optimum(np.asarray(best_x).reshape(m.nely, m.nelx), float(best_c), winner)


def score_record(completion_rho, case, cache: dict | None = None) -> dict:
    """Published metrics of one completion (densities with L/S set solid).

    The optimum is computed once per sample when ``cache`` (a dict) is shared
    between calls, as the reference implementation caches it.
    """
    s = sample_from_load_case(case)
    m = s.model
    rho = np.clip(np.asarray(completion_rho, float).reshape(-1), 0.0, 1.0)
    c = m.compliance(rho)
    c_gt = m.compliance(s.pinned)
    c_solid = m.compliance(np.ones(m.nel))
    key = (s.pinned.tobytes(), s.free.tobytes(), m.force.tobytes(), m.free.tobytes())
    if cache is not None and key in cache:
        c_opt = cache[key]
    else:
        c_opt = reference_optimum(case).compliance
        if cache is not None:
            cache[key] = c_opt
    carrying = bool(np.isfinite(c) and np.isfinite(c_solid) and c <= 1e3 * c_solid)
    vf, vf_gt = float(rho.mean()), float(s.pinned.mean())
    se = min(max(c_opt / c, 0.0), 1.0) if carrying and np.isfinite(c_opt) and c > 0 else 0.0
    me = min(1.0, vf_gt / vf) if carrying and vf > 0 else 0.0
    return {"compliance": c, "ground_truth_compliance": c_gt, "optimal_compliance": c_opt,
            "load_carrying": carrying, "topology_score": se * me}
