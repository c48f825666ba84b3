"""Static finite-element structures of a structured (nely, nelx) grid.

Conventions (shared by the whole library):

* One bilinear Q4 plane-stress element per grid cell, unit square.
* Nodes form an (nely + 1) x (nelx + 1) lattice numbered row-major, row 0 at the
  top of the printed grid.  Node ``n`` owns DOFs ``2n`` (x, along increasing
  column) and ``2n + 1`` (y, along increasing row, i.e. down the printed grid).
* Element (cell) ``e = row * nelx + col``; its local node order is top-left,
  top-right, bottom-right, bottom-left, so its local DOFs are
  ``[x_TL, y_TL, x_TR, y_TR, x_BR, y_BR, x_BL, y_BL]``.

Everything here depends only on the grid shape, so it is computed once per
shape with NumPy and closed over as constants by compiled JAX code.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

NU = 0.3
E0 = 1.0
EMIN = 1e-9

# (row, col) offset of each local node from the element's top-left node.
LOCAL_NODE_OFFSETS = ((0, 0), (0, 1), (1, 1), (1, 0))


def element_stiffness(nu: float = NU) -> np.ndarray:
    r"""Unit-modulus stiffness matrix (8, 8) of a unit-square Q4 element.

    Integrated with 2x2 Gauss quadrature, $K_e = \sum_g B_g^T D B_g \det J_g$,
    with the plane-stress constitutive matrix
    $D = \frac{1}{1-\nu^2}\begin{pmatrix}1&\nu&0\\\nu&1&0\\0&0&(1-\nu)/2\end{pmatrix}$.
    """
    d = np.array([[1.0, nu, 0.0], [nu, 1.0, 0.0], [0.0, 0.0, (1.0 - nu) / 2.0]]) / (1.0 - nu**2)
    g = 1.0 / np.sqrt(3.0)
    ke = np.zeros((8, 8))
    for xi in (-g, g):
        for eta in (-g, g):
            # Natural coordinates: x = (1 + xi) / 2, y = (1 + eta) / 2 (y points down).
            dn_dxi = 0.25 * np.array([-(1 - eta), (1 - eta), (1 + eta), -(1 + eta)])
            dn_deta = 0.25 * np.array([-(1 - xi), -(1 + xi), (1 + xi), (1 - xi)])
            dn_dx, dn_dy = 2.0 * dn_dxi, 2.0 * dn_deta  # Jacobian = diag(1/2, 1/2)
            b = np.zeros((3, 8))
            b[0, 0::2] = dn_dx
            b[1, 1::2] = dn_dy
            b[2, 0::2] = dn_dy
            b[2, 1::2] = dn_dx
            ke += b.T @ d @ b * 0.25
    return ke


@dataclasses.dataclass(frozen=True, eq=False)
class Mesh:
    r"""Connectivity and banded-solver plan of one grid shape.

    Attributes:
        nely, nelx: grid shape (rows, columns).
        n_dofs: $2 (n_{ely}+1)(n_{elx}+1)$.
        ke: element stiffness (8, 8) for unit modulus.
        edofs: global DOFs of every element, (nel, 8), in local order.
        half_bandwidth: $b$ with $K_{ij} = 0$ for $|i - j| > b$.
        block: columns eliminated per step of the banded factorisation ($s$).
        steps: elimination steps $T = \lceil n / s \rceil$.
        window: size $m = s + b$ of the dense active window.
        padded_dofs: size $P = (T + 1) s + b$ of the padded system.
        band_weights: (4, b + 1, 2) assembly weights of the row band
            $R_{2 v + \alpha, d} = K_{2 v + \alpha,\, 2 v + \alpha - b + d}
            = \sum_q W_{q, d, \alpha} E^{(q)}_v$, where $E^{(q)}_v$ is the
            modulus of the element whose local node $q$ is node $v$ (0 if none).
    """

    nely: int
    nelx: int
    n_dofs: int
    ke: np.ndarray
    edofs: np.ndarray
    half_bandwidth: int
    block: int
    steps: int
    window: int
    padded_dofs: int
    band_weights: np.ndarray

    @property
    def nel(self) -> int:
        return self.nely * self.nelx

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nely, self.nelx)


def element_dofs(nely: int, nelx: int) -> np.ndarray:
    """Global DOFs (nel, 8) of every element in local order."""
    rows, cols = np.divmod(np.arange(nely * nelx), nelx)
    top_left = rows * (nelx + 1) + cols
    nodes = np.stack([top_left, top_left + 1, top_left + nelx + 2, top_left + nelx + 1], axis=1)
    edofs = np.empty((nely * nelx, 8), dtype=np.int64)
    edofs[:, 0::2] = 2 * nodes
    edofs[:, 1::2] = 2 * nodes + 1
    return edofs


@functools.lru_cache(maxsize=32)
def get_mesh(nely: int, nelx: int, block: int = 4) -> Mesh:
    """Cached static structures of an (nely, nelx) grid.

    Args:
        nely, nelx: grid shape; both must be positive.
        block: columns eliminated per step of the banded Cholesky factorisation.
    """
    nely, nelx, block = int(nely), int(nelx), int(block)
    if nely <= 0 or nelx <= 0:
        raise ValueError(f"grid shape must be positive, got ({nely}, {nelx})")
    if block <= 0:
        raise ValueError(f"block must be positive, got {block}")
    n = 2 * (nely + 1) * (nelx + 1)
    ke = element_stiffness()
    edofs = element_dofs(nely, nelx)
    b = 2 * (nelx + 1) + 3
    steps = -(-n // block)

    # Row band R[i, d] = K[i, i - b + d] (d = b is the diagonal).  For local
    # DOFs (a, c) of an element, row DOF i = 2 node_a + alpha and column DOF
    # j = 2 node_c + gamma; node_c - node_a is the same for every element, so
    # each (a, c) adds E_e KE[a, c] at a fixed band offset d to the node of a.
    weights = np.zeros((4, b + 1, 2))  # (local node a, band offset d, alpha)
    for a in range(8):
        for c in range(8):
            na, alpha = divmod(a, 2)
            nc, gamma = divmod(c, 2)
            (ra, ca), (rc, cc) = LOCAL_NODE_OFFSETS[na], LOCAL_NODE_OFFSETS[nc]
            node_shift = (rc - ra) * (nelx + 1) + (cc - ca)
            offset = 2 * node_shift + gamma - alpha  # j - i
            if offset <= 0:
                weights[na, b + offset, alpha] += ke[a, c]

    return Mesh(
        nely=nely,
        nelx=nelx,
        n_dofs=n,
        ke=ke,
        edofs=edofs,
        half_bandwidth=b,
        block=block,
        steps=steps,
        window=block + b,
        padded_dofs=(steps + 1) * block + b,
        band_weights=weights,
    )
