"""Geometric-multigrid levels on structured grids: plan, transfer, Galerkin operators.

The static part of :mod:`sphyr_jax.fem.multigrid`: level $l + 1$ halves every
axis of level $l$ (an odd count is padded with one empty, zero-stiffness cell
first); prolongation is (bi/tri)linear interpolation on the node lattice
(static slices, no gathers) and restriction its transpose; coarse element
matrices are Galerkin products $P^T K P$ of the unconstrained stiffness, linear
in the fine moduli: a level-$l$ element's matrix is $\\sum_f E_f G_f$ over its
$2^{l d}$ fine descendants $f$ with constant $G_f = P_f^T K_e P_f$, so a level
is one fused product-sum over the fine moduli (:func:`galerkin_from_fine`);
deep levels, whose tables of $G_f$ would be large, are formed from the level
above (:func:`coarse_element_matrices`).  Fields are lattice arrays (d, *nodes, ...),
element matrices (m, m, *cells, ...), as in :mod:`sphyr_jax.fem.structured`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from sphyr_jax.fem import structured as st
from sphyr_jax.runtime import bounded_cache

# ----------------------------------------------------------------------------
# Static hierarchy plan.


@dataclasses.dataclass(frozen=True, eq=False)
class Level:
    """Static shapes of one level: ``cells`` (element counts) and their even padding."""

    cells: tuple[int, ...]

    @property
    def node_shape(self) -> tuple[int, ...]:
        return tuple(n + 1 for n in self.cells)

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(n + n % 2 for n in self.cells)

    @property
    def coarse(self) -> tuple[int, ...]:
        return tuple(p // 2 for p in self.padded)

    def n_dofs(self) -> int:
        return len(self.cells) * math.prod(self.node_shape)


@bounded_cache(maxsize=64)
def plan(cells: tuple[int, ...], *, max_coarse_dofs: int = 100,
         levels: int | None = None) -> tuple[Level, ...]:
    """The levels, finest first, for a grid of ``cells`` elements."""
    out = [Level(tuple(cells))]
    while True:
        last = out[-1]
        if levels is not None:
            if len(out) > levels:
                break
        elif last.n_dofs() <= max_coarse_dofs:
            break
        if max(last.cells) <= 1:
            break
        out.append(Level(last.coarse))
    return tuple(out)


@bounded_cache(maxsize=16)
def descendant_weights(dim: int, depth: int = 1) -> np.ndarray:
    """Nodal interpolation weights $S_f$ of every fine descendant $f$ of a
    level-``depth`` element: (2^{depth d}, 2^d, 2^d), fine-local node x coarse-local node.

    Descendant $f$ (row-major over $\\{0 .. 2^{depth} - 1\\}^d$) is the fine element
    at offset $f$; its local node $a$ lies at $(f + o_a) / 2^{depth}$ in the
    coarse element, where coarse node $b$ has the (multi)linear weight
    $\\prod_i w((f_i + o_{a,i}) / 2^{depth}, o_{b,i})$ (the composition of
    ``depth`` prolongations).  The DOF interpolation is $P_f = S_f \\otimes I_d$;
    ``depth=1`` gives the $2^d$ children.
    """
    offsets = st.get_grid((1,) * dim).element.node_offsets
    n = 2**depth
    out = []
    for f in itertools.product(range(n), repeat=dim):
        s = np.ones((len(offsets), len(offsets)))
        for a, oa in enumerate(offsets):
            for b, ob in enumerate(offsets):
                for i in range(dim):
                    pos = (f[i] + oa[i]) / n
                    s[a, b] *= pos if ob[i] == 1 else 1.0 - pos
        out.append(s)
    table = np.stack(out)
    table.setflags(write=False)
    return table


# ----------------------------------------------------------------------------
# Grid transfer on lattice fields (d, *nodes, B).


def _prolong_axis(x, axis: int, n_fine: int):
    m1 = x.shape[axis]
    lo = jax.lax.slice_in_dim(x, 0, m1 - 1, axis=axis)
    hi = jax.lax.slice_in_dim(x, 1, m1, axis=axis)
    mid = 0.5 * (lo + hi)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, 1)
    mid = jnp.pad(mid, pad)
    both = jnp.stack([x, mid], axis=axis + 1)
    shape = x.shape[:axis] + (2 * m1,) + x.shape[axis + 1 :]
    return jax.lax.slice_in_dim(both.reshape(shape), 0, n_fine, axis=axis)


def _restrict_axis(x, axis: int, n_coarse: int):
    n_fine = x.shape[axis]
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, 2 * n_coarse - n_fine)
    x = jnp.pad(x, pad)
    shape = x.shape[:axis] + (n_coarse, 2) + x.shape[axis + 1 :]
    x = x.reshape(shape)
    even = jnp.take(x, 0, axis=axis + 1)
    odd = jnp.take(x, 1, axis=axis + 1)  # fine 2c + 1; the last one is padding
    shift = [(0, 0)] * odd.ndim
    shift[axis] = (1, 0)
    odd_prev = jax.lax.slice_in_dim(jnp.pad(odd, shift), 0, n_coarse, axis=axis)
    return even + 0.5 * (odd + odd_prev)


def prolong(fine: Level, coarse_field):
    """$P e$: coarse lattice field (d, *coarse nodes, ...) -> fine lattice field."""
    x = coarse_field
    for i, n in enumerate(fine.node_shape):
        x = _prolong_axis(x, 1 + i, n)
    return x


def restrict(fine: Level, fine_field):
    """$P^T r$: fine lattice field (d, *fine nodes, ...) -> coarse lattice field."""
    x = fine_field
    for i, n in enumerate(fine.coarse):
        x = _restrict_axis(x, 1 + i, n + 1)
    return x


# ----------------------------------------------------------------------------
# Galerkin coarse element matrices.


def _pad_cells(level: Level, x, lead: int):
    """Zero-pad the cell axes (after ``lead`` leading axes) to even counts."""
    pad = [(0, 0)] * x.ndim
    for i, (n, p) in enumerate(zip(level.cells, level.padded, strict=True)):
        pad[lead + i] = (0, p - n)
    return jnp.pad(x, pad)


def _child(x, j, lead: int):
    idx = (slice(None),) * lead + tuple(slice(ji, None, 2) for ji in j)
    return x[idx]


def _galerkin(sj, g):
    """$P_j^T G P_j$ for symmetric element matrices g (m, m, ...): two plain matmuls.

    $P_j = S_j \\otimes I_d$ ($S_j$ the $2^d \\times 2^d$ nodal weights), so
    $T = P_j^T G$ is one matmul of $S_j^T$ over the node index of the leading
    axis; swapping the two leading axes gives $T^T = G P_j$ (G symmetric), and
    $P_j^T (G P_j)$ is a second such matmul ($d$ times fewer flops than with $P_j$).
    """
    nodes = sj.shape[0]
    t = (sj.T @ g.reshape(nodes, -1)).reshape(g.shape)
    t = jnp.swapaxes(t, 0, 1)
    return (sj.T @ t.reshape(nodes, -1)).reshape(g.shape)


def coarse_element_matrices(level: Level, kes):
    """Galerkin element matrices of the next level.

    Args:
        kes: (m, m, *cells, B) symmetric element matrices of this level.

    Returns:
        (m, m, *coarse cells, B) with $K_C = \\sum_j P_j^T K^{(2C + j)} P_j$.
    """
    dim = len(level.cells)
    pj = jnp.asarray(descendant_weights(dim), kes.dtype)
    kes = _pad_cells(level, kes, 2)
    total = None
    for c, j in enumerate(itertools.product((0, 1), repeat=dim)):
        part = _galerkin(pj[c], _child(kes, j, 2))
        total = part if total is None else total + part
    return total


@bounded_cache(maxsize=16)
def descendant_matrices(dim: int, depth: int) -> np.ndarray:
    """$G_f = P_f^T K_e P_f$ of every fine descendant $f$ of a level-``depth``
    element ($P_f$ from :func:`descendant_weights`).

    Returns:
        (m m, 2^{depth d}) with column $f$ the flattened (m, m) matrix $G_f$.
    """
    ke = st.get_grid((1,) * dim).element.ke
    eye = np.eye(dim)
    table = np.stack([(np.kron(s, eye).T @ ke @ np.kron(s, eye)).reshape(-1)
                      for s in descendant_weights(dim, depth)], axis=1)
    table.setflags(write=False)
    return table


def galerkin_from_fine(levels, depth: int, moduli):
    """Element matrices of level ``depth``, $\\sum_f E_f G_f$, in one fused pass.

    Written as a product-sum over the descendants (not a matrix product), so
    each element's sum is taken in the same order whatever the batch size and
    the surrounding program.

    Args:
        levels: the plan (finest first).
        depth: level index (>= 1).
        moduli: (*cells, B) fine moduli (cells past the grid count as empty).

    Returns:
        (m, m, *level cells, B): the element matrices of $P^T K P$ with $P$ the
        composite prolongation from level ``depth`` to the fine grid.
    """
    dim = moduli.ndim - 1
    cells = levels[depth].cells
    k = 2**depth
    pad = [(0, c * k - n) for c, n in zip(cells, moduli.shape[:dim], strict=True)] + [(0, 0)]
    e = jnp.pad(moduli, pad)
    split = []
    for c in cells:
        split += [c, k]
    e = e.reshape(tuple(split) + moduli.shape[dim:])
    order = [2 * i + 1 for i in range(dim)] + [2 * i for i in range(dim)] + [2 * dim]
    e = e.transpose(order).reshape(k**dim, -1)  # (descendants, cells * B)
    table = jnp.asarray(descendant_matrices(dim, depth), moduli.dtype)
    m = math.isqrt(table.shape[0])
    out = jnp.sum(table[:, :, None] * e[None], axis=1)
    return out.reshape((m, m) + tuple(cells) + moduli.shape[dim:])
