"""Unrolled linear algebra for many tiny symmetric positive-definite matrices.

Written with plain element-wise operations (no LAPACK custom calls), so the
code vectorises over any batch and runs safely when several XLA CPU devices
execute concurrently.  Matrices are (..., k, k) arrays with small static k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cholesky_entries(m):
    """Lower Cholesky factor of SPD (..., k, k) as a dict {(i, j): (...) array}.

    Non-positive pivots give NaN (callers treat the matrix as unusable).
    """
    k = m.shape[-1]
    low = {}
    for j in range(k):
        d = m[..., j, j] - sum(low[(j, p)] ** 2 for p in range(j))
        ljj = jnp.sqrt(jnp.where(d > 0, d, jnp.nan))
        low[(j, j)] = ljj
        for i in range(j + 1, k):
            low[(i, j)] = (m[..., i, j] - sum(low[(i, p)] * low[(j, p)] for p in range(j))) / ljj
    return low


def spd_inverse(m):
    """Inverse of SPD matrices (..., k, k) via an unrolled Cholesky factorisation."""
    k = m.shape[-1]
    low = cholesky_entries(m)
    # Columns of L^{-1} by forward substitution.
    linv = {}
    for j in range(k):
        for i in range(j, k):
            acc = (1.0 if i == j else 0.0) - sum(low[(i, p)] * linv[(p, j)]
                                                 for p in range(j, i))
            linv[(i, j)] = acc / low[(i, i)]
    rows = []
    for i in range(k):
        row = []
        for j in range(k):
            row.append(sum(linv[(p, i)] * linv[(p, j)] for p in range(max(i, j), k)))
        rows.append(jnp.stack(row, axis=-1))
    return jnp.stack(rows, axis=-2)


def spd_quadratic(m, w):
    """$w^T M^{-1} w$ for SPD (..., k, k) and (..., k); NaN if not positive definite."""
    k = m.shape[-1]
    low = cholesky_entries(m)
    total = 0.0
    z = []
    for i in range(k):
        zi = (w[..., i] - sum(low[(i, p)] * z[p] for p in range(i))) / low[(i, i)]
        z.append(zi)
        total = total + zi * zi
    return total


def cholesky_loop(m):
    """Lower Cholesky factors of SPD matrices (..., n, n) by a ``fori_loop`` over columns.

    For moderate n (tens to a few hundred), where unrolling would blow up the
    program: column j is scaled by its pivot, then the trailing block takes a
    rank-1 update.  Plain element-wise work, no LAPACK custom call (batched
    LAPACK kernels share XLA's CPU thread pool and can deadlock when several
    run at once).
    """
    n = m.shape[-1]
    idx = jnp.arange(n)

    def body(j, a):
        col = a[..., :, j]
        pivot = jnp.sqrt(col[..., j])
        col = jnp.where(idx >= j, col / pivot[..., None], 0.0)
        trailing = jnp.where(idx > j, col, 0.0)
        a = a - trailing[..., :, None] * trailing[..., None, :]
        return a.at[..., :, j].set(col)

    low = jax.lax.fori_loop(0, n, body, m)
    return jnp.where(idx[:, None] >= idx[None, :], low, 0.0)


def spd_inverse_loop(m):
    """Inverses $X^T X$, $X = L^{-1}$, of SPD matrices (..., n, n) (symmetric PSD by construction).

    ``L`` from :func:`cholesky_loop`, ``X`` by forward substitution on the
    identity (a ``fori_loop`` over rows), so applying the inverse later is one
    matrix-vector product instead of two sequential substitutions.
    """
    n = m.shape[-1]
    idx = jnp.arange(n)
    low = cholesky_loop(m)
    eye = jnp.broadcast_to(jnp.eye(n, dtype=m.dtype), m.shape)

    def forward(i, x):
        row = low[..., i, :] * (idx < i)
        xi = (eye[..., i, :] - jnp.einsum("...p,...pj->...j", row, x)) / low[..., i, i, None]
        return x.at[..., i, :].set(xi)

    x = jax.lax.fori_loop(0, n, forward, jnp.zeros_like(m))
    return jnp.einsum("...pi,...pj->...ij", x, x)
