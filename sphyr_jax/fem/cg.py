r"""Preconditioned conjugate gradients, in lockstep over a batch of systems.

The one CG loop of the library: the ``CG`` solver runs it with a Jacobi
(diagonal) preconditioner, the ``Multigrid`` solver with one geometric-multigrid
V-cycle per iteration (:mod:`sphyr_jax.fem.multigrid`).  Vectors have the batch
on their *last* axis and any layout before it (flat DOF vectors (n, B) or
lattice fields (d, *nodes, B)); inner products sum over every other axis.

Each system stops on its own once $\|r\|_2 \le \text{tol}\,\|b\|_2$ (a finished
system takes zero-length steps while the others go on), and the loop is a
bounded ``lax.while_loop``: it never runs past ``max_iter`` iterations and
reports, per system, whether the tolerance was reached and after how many
iterations.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def _dot(a, b):
    return jnp.sum(a * b, axis=tuple(range(a.ndim - 1)))


def pcg(matvec, precondition, rhs: Float[Array, "*layout batch"], *, tol: float,
        max_iter: int, x0: Float[Array, "*layout batch"] | None = None
        ) -> tuple[Float[Array, "*layout batch"], Bool[Array, " batch"], Int[Array, " batch"]]:
    """Solve $A x = b$ for a batch of SPD systems.

    Args:
        matvec: ``x -> A x`` (batch-last, any layout).
        precondition: ``r -> M^{-1} r`` with $M$ symmetric positive definite.
        rhs: right-hand sides $b$ (..., B).
        tol: relative residual at which a system stops.
        max_iter: bound on iterations.
        x0: initial guess (zero by default).

    Returns:
        ``(x, converged, iterations)``: x like ``rhs``; converged (B,) bool
        (a zero right-hand side counts as converged); iterations (B,) int32,
        the steps each system took.  An unconverged system's iterate is
        returned as it stands.
    """
    bnorm = jnp.sqrt(_dot(rhs, rhs))
    if x0 is None:
        x0 = jnp.zeros_like(rhs)
        r0 = rhs
    else:
        r0 = rhs - matvec(x0)
    z0 = precondition(r0)
    rnorm0 = jnp.sqrt(_dot(r0, r0))
    done0 = (rnorm0 <= tol * bnorm) | (bnorm == 0.0)

    def cond(state):
        return (state[5] < max_iter) & ~jnp.all(state[7])

    def body(state):
        x, r, p, rz, _, it, its, done = state
        ap = matvec(p)
        pap = _dot(p, ap)
        alpha = jnp.where(done, 0.0, rz / jnp.where(pap == 0.0, 1.0, pap))
        x = x + alpha * p
        r = r - alpha * ap
        z = precondition(r)
        rz_new = _dot(r, z)
        beta = jnp.where(done, 0.0, rz_new / jnp.where(rz == 0.0, 1.0, rz))
        p = jnp.where(done, p, z + beta * p)
        rnorm = jnp.sqrt(_dot(r, r))
        its = its + jnp.where(done, 0, 1)
        done = done | (rnorm <= tol * bnorm) | ~jnp.isfinite(rnorm)
        return x, r, p, rz_new, rnorm, it + 1, its, done

    its0 = jnp.zeros(bnorm.shape, jnp.int32)
    state = (x0, r0, z0, _dot(r0, z0), rnorm0, jnp.asarray(0), its0, done0)
    x, _, _, _, rnorm, _, its, _ = jax.lax.while_loop(cond, body, state)
    converged = (rnorm <= tol * bnorm) | (bnorm == 0.0)
    return x, converged, its
