r"""Dimension-generic structured grids: node lattice, DOFs and matrix-free operators.

A grid of ``cells = (n_0, ..., n_{d-1})`` elements (one :class:`~sphyr_jax.
elements.Element` per cell: Q4 in 2D, H8 in 3D) has a node lattice of shape
``(n_0 + 1, ..., n_{d-1} + 1)`` numbered row-major (C order).  Axes are printed
axes: ``(row, col)`` in 2D, ``(layer, row, col)`` in 3D, index 0 printed first.

DOF order: node ``n`` owns DOFs
``d n + k``, component ``k`` pointing along grid axis ``d - 1 - k`` (2D: x then
y-down; 3D: along increasing column, row, layer).  A *flat* nodal vector has
shape ``(n_dofs, ...)``.

Internally (and in every ``*_lattice`` function) nodal fields use the
component-first *lattice* layout ``(d, n_0 + 1, ..., n_{d-1} + 1, ...)`` and
element fields the local-DOF-first layout ``(d 2^d, n_0, ..., n_{d-1}, ...)``
(local DOF ``d a + k`` = component ``k`` of local node ``a``).  Trailing axes
``...`` are batch axes (batch *last*, the layout of every solver), so every
operation is a fused vector loop over the batch and nothing gathers or
scatters: element extraction is $2^d$ static slices, nodal accumulation $2^d$
static pads.

The masked operator used by every solver is
$\tilde K = D K D + (I - D)$, $D = \mathrm{diag}(\text{free})$, with
$K = \sum_e E_e K_e$ assembled from unit-modulus element matrices.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from sphyr_jax.fem.array_types import FreeMask, Moduli, Vectors
from sphyr_jax.fem.elements import Element, get_element
from sphyr_jax.runtime import bounded_cache


@dataclasses.dataclass(frozen=True, eq=False)
class StructuredGrid:
    """Static description of one grid shape.

    Attributes:
        cells: element counts per grid axis, e.g. ``(nely, nelx)`` or
            ``(nz, ny, nx)``.
        element: the element of every cell (Q4 or H8 by dimension).
    """

    cells: tuple[int, ...]
    element: Element

    @property
    def dim(self) -> int:
        return len(self.cells)

    @property
    def node_shape(self) -> tuple[int, ...]:
        """Lattice shape $(n_0 + 1, \\ldots, n_{d-1} + 1)$."""
        return tuple(n + 1 for n in self.cells)

    @property
    def n_nodes(self) -> int:
        return math.prod(self.node_shape)

    @property
    def n_dofs(self) -> int:
        return self.dim * self.n_nodes

    @property
    def n_cells(self) -> int:
        return math.prod(self.cells)


@bounded_cache(maxsize=64)
def get_grid(cells: tuple[int, ...]) -> StructuredGrid:
    """The cached grid of a shape (2 or 3 positive element counts)."""
    cells = tuple(int(n) for n in cells)
    if len(cells) not in (2, 3) or min(cells) <= 0:
        raise ValueError(f"grid shape must be 2 or 3 positive element counts, got {cells}")
    return StructuredGrid(cells=cells, element=get_element(len(cells)))


# ----------------------------------------------------------------------------
# Static connectivity (NumPy; for sparse assembly, tests and inspection).


def element_dofs(grid: StructuredGrid) -> np.ndarray:
    """Global (flat) DOFs of every element in local order, shape (n_cells, d 2^d).

    Elements are numbered row-major over ``cells``.  In 2D element
    ``e = row * nelx + col`` has DOFs ``[x_TL, y_TL, x_TR, y_TR, x_BR, y_BR,
    x_BL, y_BL]`` of its corner nodes (top-left, top-right, bottom-right,
    bottom-left).
    """
    d = grid.dim
    idx = np.indices(grid.cells).reshape(d, -1)  # (d, n_cells)
    strides = np.array([math.prod(grid.node_shape[i + 1 :]) for i in range(d)])
    nodes = np.stack(
        [((idx + np.array(off)[:, None]) * strides[:, None]).sum(0)
         for off in grid.element.node_offsets], axis=1)  # (n_cells, 2^d)
    return (d * nodes[:, :, None] + np.arange(d)).reshape(grid.n_cells, -1)


# ----------------------------------------------------------------------------
# Layout conversions.


def to_lattice(grid: StructuredGrid, flat: jax.Array) -> jax.Array:
    """Flat nodal vector (n_dofs, ...) -> lattice layout (d, *node_shape, ...)."""
    rest = flat.shape[1:]
    x = flat.reshape(grid.node_shape + (grid.dim,) + rest)
    return jnp.moveaxis(x, grid.dim, 0)


def from_lattice(grid: StructuredGrid, lattice: jax.Array) -> jax.Array:
    """Lattice layout (d, *node_shape, ...) -> flat nodal vector (n_dofs, ...)."""
    rest = lattice.shape[1 + grid.dim :]
    return jnp.moveaxis(lattice, 0, grid.dim).reshape((grid.n_dofs,) + rest)


def _node_slices(grid: StructuredGrid, offset) -> tuple:
    return (slice(None),) + tuple(slice(o, o + n) for o, n in zip(offset, grid.cells, strict=True))


def element_values_lattice(grid: StructuredGrid, lattice: jax.Array) -> jax.Array:
    """Element DOF vectors of a lattice field.

    Args:
        lattice: (d, *node_shape, ...) nodal field.

    Returns:
        (d 2^d, *cells, ...): entry ``d a + k`` holds component ``k`` at local
        node ``a`` of every element.
    """
    return jnp.concatenate(
        [lattice[_node_slices(grid, off)] for off in grid.element.node_offsets], axis=0)


def nodal_accumulate_lattice(grid: StructuredGrid, elem: jax.Array) -> jax.Array:
    """Sum element DOF vectors (d 2^d, *cells, ...) into a lattice field (d, *node_shape, ...).

    The transpose of :func:`element_values_lattice`.
    """
    d = grid.dim
    rest = elem.ndim - 1 - d
    total = None
    for a, off in enumerate(grid.element.node_offsets):
        pad = ((0, 0),) + tuple((o, 1 - o) for o in off) + ((0, 0),) * rest
        part = jnp.pad(elem[d * a : d * (a + 1)], pad)
        total = part if total is None else total + part
    return total


def apply_ke(grid: StructuredGrid, xe: jax.Array) -> jax.Array:
    """$K_e x_e$ (unit modulus) for element vectors (d 2^d, *cells, ...)."""
    ke = jnp.asarray(grid.element.ke, xe.dtype)
    flat = xe.reshape(xe.shape[0], -1)
    return (ke @ flat).reshape(xe.shape)


def apply_element_matrices(kes: jax.Array, xe: jax.Array) -> jax.Array:
    """Per-element matrices times element vectors.

    Args:
        kes: (m, m, *cells, ...) element matrices.
        xe: (m, *cells, ...) element vectors.

    Returns:
        (m, *cells, ...) with $y_{a} = \\sum_b K_{ab} x_b$ per element.
    """
    return jnp.sum(kes * xe[None], axis=1)


# ----------------------------------------------------------------------------
# Masked operator, lattice layout.


def matvec_lattice(grid: StructuredGrid, moduli, free, x, *, stencil: bool = False):
    """$\\tilde K x$, matrix-free.

    Args:
        moduli: (*cells, ...) element moduli $E_e$.
        free: (d, *node_shape, ...) free-DOF mask (0/1 floats).
        x: (d, *node_shape, ...).
        stencil: evaluate $K x$ as one fused nodal stencil
            (:func:`_stencil_product`: fewer passes over memory on
            quadrilateral grids; more arithmetic than the element products on
            voxel grids, with their 81 neighbour blocks) instead of element by
            element (element vectors, one small matrix product with $K_e$,
            nodal sums).  Both are the same operator up to rounding.

    Returns:
        $\\tilde K x = D K D x + (1 - D) x$, same shape as ``x``.
    """
    if stencil:
        return _stencil_product(grid, moduli, x * free) * free + x * (1.0 - free)
    xe = element_values_lattice(grid, x * free)
    ye = apply_ke(grid, xe) * moduli[None]
    return nodal_accumulate_lattice(grid, ye) * free + x * (1.0 - free)


def _stencil_product(grid: StructuredGrid, moduli, x):
    """$K x$ as a nodal stencil: component $k$ at node $n$ is
    $\\sum_{e \\ni n} E_e \\sum_b (K_e)_{a(n) d + k,\\, b}\\, x_b$, the entries of
    $K_e$ as constants and every term a shifted view, so XLA fuses the whole
    product into one loop over the nodes and the batch.

    Args:
        moduli: (*cells, ...); x: (d, *node_shape, ...) lattice field.
    """
    d = grid.dim
    ke, offsets = grid.element.ke, grid.element.node_offsets
    rest = ((0, 0),) * (x.ndim - 1 - d)
    xp = jnp.pad(x, ((0, 0),) + ((1, 1),) * d + rest)
    ep = jnp.pad(moduli, ((1, 1),) * d + rest)
    nodes = grid.node_shape

    def shifted_x(comp, shift):  # x_comp at node + shift
        return xp[(comp,) + tuple(slice(1 + t, 1 + t + n) for t, n in zip(shift, nodes,
                                                                            strict=True))]

    def element_at(offset):  # modulus of the element whose local node at `offset` is the node
        return ep[tuple(slice(1 - o, 1 - o + n) for o, n in zip(offset, nodes, strict=True))]

    out = []
    for k in range(d):
        total = None
        for a, oa in enumerate(offsets):
            inner = None
            for b, ob in enumerate(offsets):
                shift = tuple(o - p for o, p in zip(ob, oa, strict=True))
                for c in range(d):
                    coef = float(ke[d * a + k, d * b + c])
                    if coef != 0.0:
                        term = coef * shifted_x(c, shift)
                        inner = term if inner is None else inner + term
            part = element_at(oa) * inner
            total = part if total is None else total + part
        out.append(total)
    return jnp.stack(out)


def diagonal_lattice(grid: StructuredGrid, moduli, free):
    """Diagonal of $\\tilde K$ in lattice layout, (d, *node_shape, ...)."""
    kd = jnp.asarray(np.diag(grid.element.ke), moduli.dtype)
    kd = kd.reshape((-1,) + (1,) * moduli.ndim)
    diag = nodal_accumulate_lattice(grid, kd * moduli[None])
    return diag * free + (1.0 - free)


def element_energy_lattice(grid: StructuredGrid, a, b):
    """$a_e^T K_e b_e$ (unit modulus) per element, (*cells, ...).

    Quadrilaterals: the sum $\\sum_{ij} (K_e)_{ij}\\, a_i b_j$ with the entries
    of $K_e$ as constants, which XLA fuses into one loop over the cells and
    the batch.  Hexahedra: $a_e \\cdot (K_e b_e)$ with one matrix product.
    Their 576 constant terms, unrolled, made a kernel whose compilation XLA
    repeats for each consumer it is fused into (the voxel yardstick has four),
    so the product compiles faster.
    """
    ae = element_values_lattice(grid, a)
    be = element_values_lattice(grid, b)
    ke = grid.element.ke
    if grid.dim == 3:
        kb = jnp.tensordot(jnp.asarray(ke, be.dtype), be, axes=1)  # (24, *cells, ...)
        return jnp.sum(ae * kb, axis=0)
    total = None
    for i in range(ke.shape[0]):
        row = None
        for j in range(ke.shape[1]):
            if ke[i, j] != 0.0:
                term = float(ke[i, j]) * be[j]
                row = term if row is None else row + term
        part = ae[i] * row
        total = part if total is None else total + part
    return total


# ----------------------------------------------------------------------------
# Flat-layout wrappers (the layout of LoadCase.force / free_dofs).


def element_values(grid: StructuredGrid, nodal: jax.Array) -> jax.Array:
    """Flat nodal vector (n_dofs, ...) -> element DOF vectors (d 2^d, *cells, ...)."""
    return element_values_lattice(grid, to_lattice(grid, nodal))


def nodal_accumulate(grid: StructuredGrid, elem: jax.Array) -> jax.Array:
    """Element DOF vectors (d 2^d, *cells, ...) -> flat nodal sums (n_dofs, ...)."""
    return from_lattice(grid, nodal_accumulate_lattice(grid, elem))


def matvec(grid: StructuredGrid, moduli: Moduli, free: FreeMask, x: Vectors) -> Vectors:
    """$\\tilde K x$ for flat vectors: moduli (*cells, ...), free and x (n_dofs, ...)."""
    out = matvec_lattice(grid, moduli, to_lattice(grid, free), to_lattice(grid, x))
    return from_lattice(grid, out)


def diagonal(grid: StructuredGrid, moduli: Moduli, free: FreeMask) -> Vectors:
    """Diagonal of $\\tilde K$, flat (n_dofs, ...); free is flat (n_dofs, ...)."""
    return from_lattice(grid, diagonal_lattice(grid, moduli, to_lattice(grid, free)))


def element_energy(grid: StructuredGrid, a: Vectors, b: Vectors) -> Moduli:
    """$a_e^T K_e b_e$ per element for flat vectors (n_dofs, ...), shape (*cells, ...)."""
    return element_energy_lattice(grid, to_lattice(grid, a), to_lattice(grid, b))


# ----------------------------------------------------------------------------
# Dense assembly (small grids: the dense solver, fallbacks, tests).


def assemble_dense(grid: StructuredGrid, kes):
    """Dense flat matrices (B, n_dofs, n_dofs) of element matrices (m, m, *cells, B)."""
    edofs = jnp.asarray(element_dofs(grid))  # (n_cells, m)
    nb = kes.shape[-1]
    m = kes.shape[0]
    vals = jnp.moveaxis(kes.reshape(m, m, -1, nb), (3, 2), (0, 1))  # (B, n_cells, m, m)
    k = jnp.zeros((nb, grid.n_dofs, grid.n_dofs), kes.dtype)
    return k.at[:, edofs[:, :, None], edofs[:, None, :]].add(vals)


def dense_matrix(grid: StructuredGrid, moduli: Moduli, free: FreeMask
                 ) -> Float[Array, "batch dofs dofs"]:
    """Dense masked stiffness $\\tilde K$ (B, n_dofs, n_dofs) from batch-last inputs.

    Args:
        moduli: (*cells, B) element moduli.
        free: (n_dofs, B) free-DOF mask (0/1 floats).
    """
    ke = jnp.asarray(grid.element.ke, moduli.dtype)
    kes = ke.reshape(ke.shape + (1,) * moduli.ndim) * moduli[None, None]
    fr = jnp.moveaxis(free, -1, 0)  # (B, n)
    k = assemble_dense(grid, kes)
    return k * fr[:, :, None] * fr[:, None, :] + jax.vmap(jnp.diag)(1.0 - fr)
