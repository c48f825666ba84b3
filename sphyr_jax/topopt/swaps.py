r"""Material swaps scored exactly: the algebra both polishes share.

A swap moves one cell of material from a solid design cell $s$ to an empty
design cell $t$.  Between 0/1 cells it changes two element moduli by $\mp\delta$
($\delta = E(1) - E(0) = E_0 - E_{min}$ at any penalty), a low-rank change of
the stiffness: with the element's deformation modes $K_e = V \Lambda V^T$
(rigid-body modes dropped; :attr:`sphyr_jax.fem.elements.Element.modes`),

$$\Delta K = W D W^T,\quad W = [P_s V, P_t V],\quad
D = \mathrm{diag}(-\delta\Lambda, \delta\Lambda),$$

so by the Sherman-Morrison-Woodbury identity the compliance after the swap is

$$c' = c - w^T (D^{-1} + W^T \tilde K^{-1} W)^{-1} w,\qquad w = W^T u,$$

one small system per pair (:func:`swap_gain`).  :func:`exact` is the exact
solve of a batch of designs whose factor both polishes update or reuse: any
factorising solver (:class:`~sphyr_jax.fem.solvers.AbstractFactorSolver`,
:data:`FACTOR` by default) serves them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import fea, small_spd
from sphyr_jax.fem import structured as st
from sphyr_jax.fem.array_types import FlatDesigns
from sphyr_jax.fem.elements import E0, EMIN
from sphyr_jax.fem.solvers import AbstractFactorSolver, Banded
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.runtime import bounded_cache

DELTA = E0 - EMIN  # modulus change of a 0 <-> 1 swap (any penalty)
FACTOR: AbstractFactorSolver = Banded()  # the default factorisation of the low-rank scores


@bounded_cache(maxsize=8)
def modes(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Deformation modes $V$ (m, r) and their stiffnesses $\\Lambda$ (r,) of the grid's element."""
    element = st.get_grid(tuple(shape)).element
    return element.modes, element.mode_stiffness


def exact(case: LoadCase, x: FlatDesigns, *, penal: float = 3.0,
          factor: AbstractFactorSolver = FACTOR):
    """Exact solve of designs (B, nel): (factor, u (n, B), free (n, B), c (B,)).

    ``c`` is $f \\cdot u$ where it is a finite non-negative number for a load
    case with a load, else $+\\infty$.  The factor (batch-last, ``factor``'s
    state) serves ``factor.forward`` and ``factor.inverse_quadratic`` for the
    low-rank scores.
    """
    shape = case.shape
    grid = st.get_grid(shape)
    nb = x.shape[0]
    moduli = jnp.moveaxis(fea.simp_moduli(x.reshape((nb,) + shape), penal=penal), 0, -1)
    free = jnp.asarray(case.free_dofs, jnp.float64).T  # (n, B)
    fac = factor.init(grid, moduli, free)
    f = jnp.asarray(case.force, jnp.float64).T * free
    u = factor.compute(grid, fac, f)[0]
    c = jnp.sum(f * u, axis=0)
    has_load = jnp.any(f != 0.0, axis=0)
    c = jnp.where(has_load & jnp.isfinite(c) & (c >= 0.0), c, jnp.inf)
    return fac, u, free, c


def swap_gain(g_ss, g_tt, g_st, w_s, w_t, lam):
    r"""Compliance decrease $q = w^T A^{-1} w$ of swaps, $A = D^{-1} + W^T \tilde K^{-1} W$.

    With $r$ deformation modes per element, for sources $s$ and targets $t$
    (leading axes broadcast):

    Args:
        g_ss: (..., S, 1, r, r) $V^T Z_{ss} V$ ($Z = \tilde K^{-1}$).
        g_tt: (..., 1, T, r, r) $V^T Z_{tt} V$.
        g_st: (..., S, T, r, r) $V^T Z_{st} V$.
        w_s: (..., S, 1, r) $V^T u_s$.
        w_t: (..., 1, T, r) $V^T u_t$.
        lam: (r,) mode stiffnesses $\Lambda$.

    Returns:
        (..., S, T) $q$; the swap's compliance is $c - q$.

    $A = [[A_{ss}, G], [G^T, A_{tt}]]$ is solved by blocks: the addition block
    $A_{tt} = \Lambda^{-1}/\delta + G_{tt}$ first (positive definite), then the
    removal's Schur complement $A_{ss} - G A_{tt}^{-1} G^T$ (negative
    definite; nearly singular only for swaps that cut the load path, whose
    scores then come out huge, as they should).  Unrolled $r \times r$ algebra
    (:mod:`sphyr_jax.fem.small_spd`): no batched LAPACK call, which shares XLA's
    CPU thread pool and can deadlock when several devices run one.
    """
    a_ss = g_ss + jnp.diag(-1.0 / (DELTA * lam))  # indefinite
    a_tt = g_tt + jnp.diag(1.0 / (DELTA * lam))  # SPD
    inv_tt = small_spd.spd_inverse(a_tt)
    y = jnp.einsum("...kl,...l->...k", inv_tt, w_t)
    v = w_s - jnp.einsum("...kl,...l->...k", g_st, y)
    schur = a_ss - jnp.einsum("...kl,...lm,...nm->...kn", g_st, inv_tt, g_st)
    return jnp.sum(w_t * y, axis=-1) - small_spd.spd_quadratic(-schur, v)
