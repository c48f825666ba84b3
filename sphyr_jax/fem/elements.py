r"""Finite elements of structured grids in any dimension: Q4 (2D) and H8 (3D).

One grid cell is one element: a unit square (Q4, bilinear, plane stress) or a
unit cube (H8, trilinear, isotropic 3D elasticity).  Both are described by one
:class:`Element`, so structured-grid code (:mod:`sphyr_jax.fem.structured`) and the
solvers built on it are written once for every dimension.

Material: isotropic, $E_0 = 1$, $\nu = 0.3$; void cells keep $E_{min} = 10^{-9}$
(SIMP: $E(\rho) = E_{min} + \rho^p (E_0 - E_{min})$).

Axes and DOF conventions (the library's, in every dimension):

* Grid axes are printed axes: ``(row, col)`` in 2D and ``(layer, row, col)``
  in 3D; index 0 of every axis is printed first (row 0 at the top, layer 0
  the top layer), so increasing ``row``/``layer`` means going *down*.
* A node owns ``dim`` DOFs; DOF component ``k`` points along grid axis
  ``dim - 1 - k``: in 2D component 0 is x (along increasing column) and 1 is y
  (along increasing row); in 3D components 0, 1, 2 point along increasing
  column, row and layer.  Isotropic elasticity is invariant under reflections,
  so the handedness of this frame does not matter.
* Local node ``a`` of an element sits at ``node_offsets[a]`` (0/1 per grid
  axis) from the element's first node.  Q4: top-left, top-right, bottom-right,
  bottom-left; H8: the Q4
  square of the upper node plane (layer offset 0), then the same square one
  plane lower.  Local DOF ``dim * a + k`` is component ``k`` of node ``a``.

The stiffness matrices are integrated with full Gauss quadrature ($2^d$
points): $K_e = \sum_g w_g B_g^T D B_g \det J$ on the unit cell.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from sphyr_jax.runtime import bounded_cache

NU = 0.3
E0 = 1.0
EMIN = 1e-9


@dataclasses.dataclass(frozen=True, eq=False)
class Element:
    """A structured-grid element type (static; one per dimension).

    Attributes:
        name: ``"Q4"`` or ``"H8"``.
        dim: spatial dimension $d$ (also DOFs per node).
        node_offsets: per local node, its 0/1 offset along each grid axis
            (tuple of $2^d$ tuples of length $d$).
        ke: unit-modulus stiffness matrix, shape $(d\\,2^d, d\\,2^d)$.
        nu: Poisson's ratio.
        modes: deformation modes $V$, shape $(d\\,2^d, r)$: the eigenvectors of
            ``ke`` without its rigid-body modes ($r = 5$ for Q4, 18 for H8).
        mode_stiffness: their eigenvalues $\\Lambda$ (r,), so $K_e = V \\Lambda V^T$.
    """

    name: str
    dim: int
    node_offsets: tuple[tuple[int, ...], ...]
    ke: np.ndarray
    nu: float
    modes: np.ndarray
    mode_stiffness: np.ndarray

    @property
    def nodes(self) -> int:
        """Nodes per element, $2^d$."""
        return len(self.node_offsets)

    @property
    def dofs(self) -> int:
        """DOFs per element, $d\\,2^d$ (8 for Q4, 24 for H8)."""
        return self.dim * self.nodes


def node_offsets(dim: int) -> tuple[tuple[int, ...], ...]:
    """Local node offsets of the $2^d$-node element (see the module docstring).

    The last two axes follow the Q4 order (top-left, top-right, bottom-right,
    bottom-left); leading axes vary slowest.
    """
    if dim < 1:
        raise ValueError(f"dim must be positive, got {dim}")
    if dim == 1:
        return ((0,), (1,))
    square = ((0, 0), (0, 1), (1, 1), (1, 0))
    out = square
    for _ in range(dim - 2):
        out = tuple((o,) + s for o in (0, 1) for s in out)
    return out


def constitutive_matrix(dim: int, *, nu: float = NU) -> np.ndarray:
    r"""Unit-modulus constitutive matrix in Voigt notation (engineering shears).

    2D (plane stress), strains $(\varepsilon_{xx}, \varepsilon_{yy}, \gamma_{xy})$:
    $D = \frac{1}{1-\nu^2}\begin{pmatrix}1&\nu&0\\\nu&1&0\\0&0&(1-\nu)/2\end{pmatrix}$.
    3D, strains $(\varepsilon_{xx}, \varepsilon_{yy}, \varepsilon_{zz}, \gamma_{xy},
    \gamma_{yz}, \gamma_{zx})$: $D = \frac{1}{(1+\nu)(1-2\nu)}$ times
    $1-\nu$ / $\nu$ on the normal block and $(1-2\nu)/2$ on the shear diagonal.
    """
    if dim == 2:
        return np.array([[1.0, nu, 0.0], [nu, 1.0, 0.0], [0.0, 0.0, (1.0 - nu) / 2.0]]) / (
            1.0 - nu**2
        )
    if dim == 3:
        d = np.zeros((6, 6))
        d[:3, :3] = nu
        d[np.arange(3), np.arange(3)] = 1.0 - nu
        d[np.arange(3, 6), np.arange(3, 6)] = (1.0 - 2.0 * nu) / 2.0
        return d / ((1.0 + nu) * (1.0 - 2.0 * nu))
    raise ValueError(f"elasticity is defined here for dim 2 or 3, got {dim}")


def _shear_pairs(dim: int) -> tuple[tuple[int, int], ...]:
    return ((0, 1),) if dim == 2 else ((0, 1), (1, 2), (2, 0))


def strain_displacement(dim: int, offsets, point) -> np.ndarray:
    """Strain-displacement matrix $B$ (voigt, d 2^d) on the unit cell.

    Args:
        dim: dimension.
        offsets: local node offsets (grid-axis order).
        point: natural coordinates $\\xi_k \\in [-1, 1]$ per DOF component
            ($k = 0$: along the last grid axis).

    Returns:
        $B$ with $\\varepsilon = B u_e$; physical coordinates are
        $x_k = (1 + \\xi_k) / 2$, so $\\partial/\\partial x_k = 2\\,\\partial/\\partial\\xi_k$.
    """
    n = len(offsets)
    scale = 0.5**dim
    dn_dx = np.zeros((dim, n))
    for a, off in enumerate(offsets):
        signs = [2 * off[dim - 1 - k] - 1 for k in range(dim)]  # per component
        for k in range(dim):
            value = scale * signs[k]
            for j in range(dim):
                if j != k:
                    value = value * (1 + signs[j] * point[j])
            dn_dx[k, a] = 2.0 * value
    pairs = _shear_pairs(dim)
    b = np.zeros((dim + len(pairs), dim * n))
    for k in range(dim):
        b[k, k::dim] = dn_dx[k]
    for s, (i, j) in enumerate(pairs):
        b[dim + s, i::dim] = dn_dx[j]
        b[dim + s, j::dim] = dn_dx[i]
    return b


def element_stiffness(dim: int = 2, *, nu: float = NU) -> np.ndarray:
    r"""Unit-modulus stiffness of the unit $d$-cube element by $2^d$-point Gauss.

    $K_e = \sum_g B_g^T D B_g \, 2^{-d}$ (Gauss weights 1 in natural
    coordinates, $\det J = 2^{-d}$).  In 2D (plane stress) this equals the
    closed-form matrix of the classic 88-line code.
    """
    offsets = node_offsets(dim)
    d = constitutive_matrix(dim, nu=nu)
    g = 1.0 / np.sqrt(3.0)
    n = dim * len(offsets)
    ke = np.zeros((n, n))
    # Component 0 outermost, as in the 2D reference loop (xi outer, eta inner).
    for point in itertools.product((-g, g), repeat=dim):
        b = strain_displacement(dim, offsets, point)
        ke += b.T @ d @ b * 0.5**dim
    return ke


@bounded_cache(maxsize=8)
def get_element(dim: int, *, nu: float = NU) -> Element:
    """The cached element of a dimension: Q4 for 2, H8 for 3."""
    dim = int(dim)
    if dim not in (2, 3):
        raise ValueError(f"structured elements exist for dim 2 (Q4) and 3 (H8), got {dim}")
    ke = element_stiffness(dim, nu=nu)
    lam, vec = np.linalg.eigh(ke)
    keep = lam > 1e-10 * lam.max()
    modes, stiff = vec[:, keep], lam[keep]
    for a in (ke, modes, stiff):
        a.setflags(write=False)
    return Element(name="Q4" if dim == 2 else "H8", dim=dim, node_offsets=node_offsets(dim),
                   ke=ke, nu=float(nu), modes=modes, mode_stiffness=stiff)
