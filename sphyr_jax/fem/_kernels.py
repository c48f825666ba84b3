"""Batch-last linear-solver kernels with a batching rule of their own.

Every array here has the batch on its *last* axis (moduli (nely, nelx, B),
vectors (n_dofs, B), banded factors (T, s, m, B)): the structured solvers of
:mod:`sphyr_jax.fem._banded` run as fused vector loops over that axis.  A user who
writes ``jax.vmap(sj.compliance)`` would otherwise get a batch axis put in
*front* of every operation of a one-sample solve; instead each kernel is a
:func:`jax.custom_batching.custom_vmap` whose rule folds the mapped axis into
the last one and calls the batch-last kernel once, so the vmapped public
functions run the same code as a native batch.

The kernels are never differentiated themselves: :mod:`sphyr_jax.fem.fea` puts
them behind ``lax.custom_linear_solve`` (factorisations see
``stop_gradient`` inputs), which supplies both differentiation modes.

Fixed DOFs are masked: the system is $\\tilde K = D K D + (I - D)$ with
$D = \\mathrm{diag}(\\text{free})$; right-hand sides must vanish on fixed DOFs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from sphyr_jax.fem import _banded
from sphyr_jax.fem import multigrid as mg
from sphyr_jax.fem import structured as st
from sphyr_jax.fem.mesh import Mesh, get_mesh

KINDS = ("banded", "dense", "cg", "multigrid")


@dataclasses.dataclass(frozen=True)
class Solver:
    """Static choice of linear solver.

    Attributes:
        kind: ``"banded"``, ``"dense"``, ``"cg"`` (Jacobi preconditioner) or
            ``"multigrid"`` (geometric-multigrid-preconditioned CG,
            :mod:`sphyr_jax.fem.multigrid`).  On 3D grids ``"banded"`` means
            ``"multigrid"`` (a band of a 3D grid is far too wide).
        tol: relative residual at which the CG solvers stop.
        max_iter: CG iteration bound (default: 4 x number of DOFs for Jacobi,
            100 for multigrid, after which small grids fall back to a direct
            solve, see :mod:`sphyr_jax.fem.multigrid`).
        chunk: samples per chunk of the batch (None: backend default, 0: no chunking).
        block: columns per step of the banded factorisation.
    """

    kind: str = "banded"
    tol: float = 1e-10
    max_iter: int | None = None
    chunk: int | None = None
    block: int = 4

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown solver {self.kind!r}: use one of {KINDS}")


def as_solver(solver) -> Solver:
    """A :class:`Solver` from a name or a Solver."""
    if isinstance(solver, Solver):
        return solver
    if isinstance(solver, str):
        return Solver(kind=solver)
    raise TypeError(f"solver must be a name or a Solver, got {type(solver).__name__}")


def default_chunk(solver: Solver) -> int:
    """Samples per chunk: 64 on CPU (cache-sized windows), no chunking elsewhere."""
    if solver.chunk is not None:
        return solver.chunk
    return 64 if jax.default_backend() == "cpu" else 0


# ----------------------------------------------------------------------------
# Element-level helpers (batch-last).


def nodal_accumulate(mesh: Mesh, elem: jax.Array) -> jax.Array:
    """Sum element DOF vectors (nely, nelx, 8, B) into a nodal vector (n, B)."""
    batch = elem.shape[3:]
    total = 0.0
    for q, (dr, dc) in enumerate(((0, 0), (0, 1), (1, 1), (1, 0))):
        pad = ((dr, 1 - dr), (dc, 1 - dc), (0, 0)) + ((0, 0),) * len(batch)
        total = total + jnp.pad(elem[:, :, 2 * q : 2 * q + 2], pad)
    return total.reshape((mesh.n_dofs,) + batch)


def apply_ke(mesh: Mesh, xe: jax.Array) -> jax.Array:
    """$K_e x_e$ for element vectors (nely, nelx, 8, ...)."""
    ke = jnp.asarray(mesh.ke).reshape((1, 1, 8, 8) + (1,) * (xe.ndim - 3))
    return jnp.sum(ke * xe[:, :, None], axis=3)


def element_energy(mesh: Mesh, a: jax.Array, b: jax.Array) -> jax.Array:
    """$a_e^T K_e b_e$ for unit modulus: vectors (n, B) -> (nely, nelx, B)."""
    ae = _banded.element_values(mesh, a)
    be = _banded.element_values(mesh, b)
    return jnp.sum(ae * apply_ke(mesh, be), axis=2)


def matvec(mesh: Mesh, moduli, free, x):
    """$\\tilde K x$ with $\\tilde K = D K D + (I - D)$, matrix-free (batch-last)."""
    xe = _banded.element_values(mesh, x * free)
    ye = apply_ke(mesh, xe) * moduli[:, :, None]
    return nodal_accumulate(mesh, ye) * free + x * (1.0 - free)


def dense_matrix(mesh: Mesh, moduli, free):
    """Dense masked stiffness, batch-first (B, n, n), from batch-last inputs."""
    nb = moduli.shape[-1]
    e = jnp.moveaxis(moduli.reshape(mesh.nel, nb), -1, 0)  # (B, nel)
    vals = e[:, :, None, None] * jnp.asarray(mesh.ke)[None, None]
    edofs = jnp.asarray(mesh.edofs)
    k = jnp.zeros((nb, mesh.n_dofs, mesh.n_dofs), moduli.dtype)
    k = k.at[:, edofs[:, :, None], edofs[:, None, :]].add(vals)
    fr = jnp.moveaxis(free, -1, 0)
    return k * fr[:, :, None] * fr[:, None, :] + jax.vmap(jnp.diag)(1.0 - fr)


def diagonal(mesh: Mesh, moduli, free):
    """Diagonal of $\\tilde K$ (n, B)."""
    return _banded.row_band(mesh, moduli, free)[: mesh.n_dofs, mesh.half_bandwidth]


def chunked(fn, chunk: int, *arrays):
    """Apply a batch-last ``fn`` chunk by chunk (``lax.map``) when the batch is large.

    Every leaf of ``arrays`` and of the output has the batch on its last axis;
    a ragged last chunk is padded by repeating the last sample (padding must
    stay a well-posed problem) and cut off again.
    """
    leaves = jax.tree.leaves(arrays)
    nb = leaves[0].shape[-1]
    if not chunk or nb <= chunk:
        return fn(*arrays)
    n_chunks = -(-nb // chunk)
    pad = n_chunks * chunk - nb

    def split(a):
        if pad:
            a = jnp.concatenate([a, jnp.repeat(a[..., -1:], pad, axis=-1)], axis=-1)
        a = a.reshape(a.shape[:-1] + (n_chunks, chunk))
        return jnp.moveaxis(a, -2, 0)

    outs = jax.lax.map(lambda xs: fn(*xs), jax.tree.map(split, arrays))

    def join(o):
        o = jnp.moveaxis(o, 0, -2)
        return o.reshape(o.shape[:-2] + (n_chunks * chunk,))[..., :nb]

    return jax.tree.map(join, outs)


# ----------------------------------------------------------------------------
# Solvers (batch-last, any batch size).


def pcg(op, solver: Solver, moduli, free, rhs):
    """Jacobi-preconditioned CG in lockstep over the batch; bounded iterations.

    Args:
        op: the :class:`Kernels` of the grid (its ``matvec`` and ``diagonal``).

    Returns:
        (x (n, B), converged (B,), iterations (B,)); a system whose relative
        residual did not reach ``solver.tol`` within ``max_iter`` iterations is
        reported as not converged (its iterate is returned as it stands).
    """
    max_iter = solver.max_iter or 4 * rhs.shape[0]
    bnorm = jnp.sqrt(jnp.sum(rhs * rhs, axis=0))
    inv_d = 1.0 / op.diagonal(moduli, free)
    z0 = inv_d * rhs

    def cond(state):
        it, done = state[5], state[7]
        return (it < max_iter) & ~jnp.all(done)

    def body(state):
        x, r, z, p, rz, it, its, done = state
        ap = op.matvec(moduli, free, p)
        pap = jnp.sum(p * ap, axis=0)
        alpha = jnp.where(done, 0.0, rz / jnp.where(pap == 0.0, 1.0, pap))
        x = x + alpha * p
        r = r - alpha * ap
        z = inv_d * r
        rz_new = jnp.sum(r * z, axis=0)
        beta = jnp.where(done, 0.0, rz_new / jnp.where(rz == 0.0, 1.0, rz))
        p = z + beta * p
        rnorm = jnp.sqrt(jnp.sum(r * r, axis=0))
        its = its + jnp.where(done, 0, 1)
        done = done | (rnorm <= solver.tol * bnorm) | ~jnp.isfinite(rnorm)
        return x, r, z, p, rz_new, it + 1, its, done

    its0 = jnp.zeros(bnorm.shape, jnp.int32)
    state = (jnp.zeros_like(rhs), rhs, z0, z0, jnp.sum(rhs * z0, axis=0), jnp.asarray(0),
             its0, bnorm == 0.0)
    x, r, _, _, _, _, its, _ = jax.lax.while_loop(cond, body, state)
    rnorm = jnp.sqrt(jnp.sum(r * r, axis=0))
    converged = (rnorm <= solver.tol * bnorm) | (bnorm == 0.0)
    return x, converged, its


def _factor_impl(op, moduli, free):
    """The solver's reusable data: banded factor, dense Cholesky or CG operator."""
    if op.kind == "banded":
        return _banded.factor(op.mesh, _banded.row_band(op.mesh, moduli, free))
    if op.kind == "dense":
        return jnp.moveaxis(jnp.linalg.cholesky(dense_matrix(op.mesh, moduli, free)), 0, -1)
    return moduli, free


def _apply_impl(op, fac, rhs):
    """Solve with :func:`_factor_impl`'s data: (x, converged, iterations)."""
    nb = rhs.shape[-1]
    if op.kind == "cg":
        return pcg(op, op.solver, fac[0], fac[1], rhs)
    if op.kind == "multigrid":
        return mg.pcg(op.mg_options, fac[0], fac[1], rhs)
    if op.kind == "banded":
        x = _banded.solve(op.mesh, fac, rhs)
    else:
        chol = jnp.moveaxis(fac, -1, 0)
        x = jnp.moveaxis(jax.scipy.linalg.cho_solve((chol, True), jnp.moveaxis(rhs, -1, 0)[
            ..., None])[..., 0], 0, -1)
    return x, jnp.ones((nb,), bool), jnp.zeros((nb,), jnp.int32)


def _batch_last_vmap(kernel):
    """``kernel`` (batch-last in and out) with a batching rule that folds the
    mapped axis into the batch axis and calls ``kernel`` once."""
    wrapped = custom_vmap(kernel)

    @wrapped.def_vmap
    def _rule(axis_size, in_batched, *args):
        def fold(a, batched):
            if not batched:
                a = jnp.broadcast_to(a, (axis_size,) + a.shape)
            a = jnp.moveaxis(a, 0, -2)  # (..., V, B)
            return a.reshape(a.shape[:-2] + (-1,))

        out = wrapped(*jax.tree.map(fold, list(args), list(in_batched)))

        def unfold(o):
            o = o.reshape(o.shape[:-1] + (axis_size, -1))
            return jnp.moveaxis(o, -2, 0)

        out = jax.tree.map(unfold, out)
        return out, jax.tree.map(lambda _: True, out)

    return wrapped


class Kernels:
    """The batch-last kernels of one (grid shape, solver), built once.

    2D grids use the gather-free Q4 operators of this module (and the banded
    factorisation); any other dimension uses :mod:`sphyr_jax.fem.structured`
    (H8 elements in 3D) with the multigrid-preconditioned CG.

    Attributes:
        kind: the solver actually used (``"banded"`` on a 3D grid becomes
            ``"multigrid"``).
        factor: ``(moduli, free) -> data`` reusable solver data.
        apply: ``(data, rhs) -> (x, converged, iterations)``.
        factor_solve: ``(moduli, free, rhs) -> (x, converged, iterations)``,
            fused (no factor kept: cheapest when it is used once).
    """

    def __init__(self, shape: tuple[int, ...], solver: Solver):
        self.shape = shape = tuple(shape)
        self.solver = solver
        self.ndim = len(shape)
        kind = solver.kind
        if self.ndim != 2 and kind == "banded":
            kind = "multigrid"
        if self.ndim != 2 and kind == "dense":
            raise ValueError("the dense solver is for 2D grids; use 'multigrid' or 'cg' in 3D")
        self.kind = kind
        self.grid = st.get_grid(shape)
        self.mesh = get_mesh(*shape, block=solver.block) if self.ndim == 2 else None
        self.mg_options = mg.MGOptions(tol=solver.tol,
                                       max_iter=solver.max_iter or mg.MGOptions().max_iter)
        chunk = default_chunk(solver)

        def factor(moduli, free):
            return chunked(functools.partial(_factor_impl, self), chunk, moduli, free)

        def apply(fac, rhs):
            return chunked(functools.partial(_apply_impl, self), chunk, fac, rhs)

        def fused(moduli, free, rhs):
            return _apply_impl(self, _factor_impl(self, moduli, free), rhs)

        def factor_solve(moduli, free, rhs):
            return chunked(fused, chunk, moduli, free, rhs)

        self.factor = _batch_last_vmap(factor)
        self.apply = _batch_last_vmap(apply)
        self.factor_solve = _batch_last_vmap(factor_solve)

    def matvec(self, moduli, free, x):
        """$\\tilde K x$ (batch-last)."""
        if self.mesh is not None:
            return matvec(self.mesh, moduli, free, x)
        return st.matvec(self.grid, moduli, free, x)

    def diagonal(self, moduli, free):
        """Diagonal of $\\tilde K$ (n, B)."""
        if self.mesh is not None:
            return diagonal(self.mesh, moduli, free)
        return st.diagonal(self.grid, moduli, free)

    def energy(self, a, b):
        """Unit-modulus element energies $a_e^T K_e b_e$, (*cells, B)."""
        if self.mesh is not None:
            return element_energy(self.mesh, a, b)
        return st.element_energy(self.grid, a, b)


@functools.lru_cache(maxsize=64)
def kernels(shape: tuple[int, ...], solver: Solver) -> Kernels:
    """Cached :class:`Kernels` (one set per grid shape and solver per process)."""
    return Kernels(tuple(shape), solver)
