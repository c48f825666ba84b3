"""Unrolled linear algebra for many tiny symmetric positive-definite matrices.

Written with plain element-wise operations (no LAPACK custom calls), so the
code vectorises over any batch and runs safely when several XLA CPU devices
execute concurrently.  Matrices are (..., k, k) arrays with small static k.
"""

from __future__ import annotations

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
