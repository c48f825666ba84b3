r"""Linear solvers of the masked stiffness system, one small class per method.

Every solver solves $\tilde K(E) x = b$ with $\tilde K = D K D + (I - D)$,
$D = \mathrm{diag}(\text{free})$ (right-hand sides vanish on fixed DOFs), for a
batch of designs at once; arrays are batch-*last*: element moduli (*cells, B),
vectors (n_dofs, ..., B).  As in lineax, a solver is a small immutable object
with only its own options, and every solver answers the questions of one
abstract base, :class:`AbstractSolver`:

* ``check(grid)``: raise if the method does not serve the grid;
* ``init(grid, moduli, free) -> state``: the reusable part (a factorisation,
  or the operator itself for the iterative methods);
* ``compute(grid, state, rhs, x0=None) -> (x, result, iterations)``: one
  solve with that state; ``result`` is a :class:`RESULTS` code per sample;
* ``init_compute(grid, moduli, free, rhs)``: both, keeping no state;
* ``batch_chunk(grid)``: samples per chunk of a large batch.

Solvers that keep a factorisation $\tilde K = L L^T$ also implement
:class:`AbstractFactorSolver` (``forward``: $L^{-1} b$; ``inverse_quadratic``:
$W^T \tilde K^{-1} W$), which the swap polishes need; :func:`as_factor_solver`
refuses, with a clear message, a solver that keeps none.  Callers never ask
which kind of solver they hold.

Methods:

* :class:`Banded`: exact banded Cholesky (2D grids; $O(n b^2)$ with the
  half-bandwidth $b \approx 2 n_{elx}$): LAPACK's on the host in CPU
  programs from :data:`LAPACK_MIN_DOFS` DOFs, XLA loops elsewhere.
* :class:`Dense`: dense Cholesky, the simplest exact method (small 2D grids).
* :class:`CG`: Jacobi-preconditioned conjugate gradients, any dimension.
* :class:`Multigrid`: conjugate gradients preconditioned by one geometric
  multigrid V-cycle per iteration (:mod:`sphyr_jax.fem.multigrid`), any
  dimension, with a direct fallback for systems it cannot resolve.

Solver objects are frozen dataclasses, hashable and compared by value (static
arguments of compiled programs: equal solvers share one program); a name
(:data:`SolverName`: ``"banded"``, ``"dense"``, ``"cg"``, ``"multigrid"``)
stands for the solver with its default options.  :func:`default_solver` picks
the method for a grid.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import Any, ClassVar, Literal, TypeAlias

import jax
import jax.numpy as jnp

from sphyr_jax.fem import _banded, _lapack, cg, multigrid
from sphyr_jax.fem import structured as st
from sphyr_jax.fem.array_types import Codes, FreeMask, Moduli, Vectors

FACTOR_BYTES = 64 << 20  # banded factor memory per chunk on CPU
LAPACK_MIN_DOFS = 300  # 2D systems from this many DOFs (12x12) are factored by LAPACK on a CPU
CPU_CHUNK = 64  # samples per chunk on CPU unless a solver says otherwise

SolverName = Literal["banded", "dense", "cg", "multigrid"]


class RESULTS(enum.IntEnum):
    """Result codes of a solve (an int32 per sample), as in lineax.

    Members are ints, so they serve as constants inside compiled code
    (``jnp.where(ok, RESULTS.successful, RESULTS.breakdown)``) and compare
    with the int32 codes a solve returns; each has a ``message``.

    ``successful`` (0): solved (a direct factorisation, or CG to its
    tolerance); ``max_iterations_reached``: an iterative solver stopped at its
    iteration bound; ``nonfinite_input``: the densities (or penalty) were not
    finite; ``no_load_path``: the load case has no load or no support, so
    nothing carries a load; ``breakdown``: the method produced a non-finite
    result from finite input.
    """

    successful = 0
    max_iterations_reached = 1
    nonfinite_input = 2
    no_load_path = 3
    breakdown = 4

    @property
    def message(self) -> str:
        """What the code means, for error messages (empty for ``successful``)."""
        return _MESSAGES[self]


_MESSAGES = {
    RESULTS.successful: "",
    RESULTS.max_iterations_reached:
        "the iterative solver reached its iteration bound before its tolerance",
    RESULTS.nonfinite_input: "non-finite densities or penalty",
    RESULTS.no_load_path: "no load path: the load case has no load or no support",
    RESULTS.breakdown: "the solver produced a non-finite result",
}
RESULT_MESSAGES = tuple(code.message for code in RESULTS)  # indexed by code


def result_name(code) -> str:
    """The name of a result code (``"successful"``, ``"max_iterations_reached"``, ...)."""
    return RESULTS(int(code)).name


def _direct_result(x):
    ok = jnp.all(jnp.isfinite(x), axis=0)
    return jnp.where(ok, RESULTS.successful, RESULTS.breakdown).astype(jnp.int32)


def _iterative_result(x, converged):
    finite = jnp.all(jnp.isfinite(x), axis=0)
    code = jnp.where(converged, RESULTS.successful, RESULTS.max_iterations_reached)
    return jnp.where(finite, code, RESULTS.breakdown).astype(jnp.int32)


def _no_iterations(rhs):
    return jnp.zeros(rhs.shape[-1:], jnp.int32)


Computed = tuple[Vectors, Codes, Codes]  # (x, result, iterations) of one solve


class AbstractSolver(abc.ABC):
    """The interface every solver implements (the types of ``solver=`` arguments).

    Concrete solvers are frozen dataclasses (hashable, compared by value) that
    define ``init`` and ``compute``, a class-level ``name`` and ``dims`` and a
    field ``chunk`` (samples per chunk of a large batch; None: the solver's
    choice, see :meth:`batch_chunk`; 0: never chunk).  Every method is called
    while a program is traced, so choosing among them costs nothing at run
    time.
    """

    name: ClassVar[str]
    dims: ClassVar[tuple[int, ...]] = (2, 3)  # grid dimensions served
    chunk: int | None

    def check(self, grid: st.StructuredGrid) -> None:
        """Raise ``ValueError`` unless this method serves ``grid``."""
        if grid.dim not in self.dims:
            served = " and ".join(f"{d}D" for d in self.dims)
            raise ValueError(f"the {self.name} solver is for {served} grids; use Multigrid "
                             f"or CG in {grid.dim}D")

    @abc.abstractmethod
    def init(self, grid: st.StructuredGrid, moduli: Moduli, free: FreeMask) -> Any:
        r"""The reusable state of the systems $\tilde K(E)$ (a PyTree, batch-last)."""

    @abc.abstractmethod
    def compute(self, grid: st.StructuredGrid, state: Any, rhs: Vectors,
                x0: Vectors | None = None) -> Computed:
        """Solve with the state of :meth:`init`: ``(x, result, iterations)``.

        ``rhs`` and ``x`` are (n_dofs, ..., B); ``x0`` is an initial guess of
        the iterative methods (the direct ones ignore it); ``result`` and
        ``iterations`` are (B,) int32.
        """

    def init_compute(self, grid: st.StructuredGrid, moduli: Moduli, free: FreeMask,
                     rhs: Vectors) -> Computed:
        """:meth:`init` then :meth:`compute`, keeping no state (cheapest for one use)."""
        return self.compute(grid, self.init(grid, moduli, free), rhs)

    def batch_chunk(self, grid: st.StructuredGrid) -> int:
        """Samples per chunk of a large batch: ``chunk`` if given, else on CPU
        :meth:`cpu_chunk` (cache-sized windows), no chunking elsewhere."""
        if self.chunk is not None:
            return self.chunk
        if jax.default_backend() != "cpu":
            return 0
        return self.cpu_chunk(grid)

    def cpu_chunk(self, grid: st.StructuredGrid) -> int:
        """Samples per chunk on CPU when ``chunk`` is None."""
        return CPU_CHUNK

    def label(self, grid: st.StructuredGrid) -> str:
        """The method that runs on ``grid``, in words (for reports)."""
        return self.name


class AbstractFactorSolver(AbstractSolver):
    r"""A solver whose state is a factorisation $\tilde K = L L^T$.

    Besides solves it applies $L^{-1}$, which the swap polishes use to score
    low-rank changes of $\tilde K$ (:mod:`sphyr_jax.topopt.swaps`).
    """

    @abc.abstractmethod
    def forward(self, grid: st.StructuredGrid, state: Any, rhs: Vectors) -> Vectors:
        """$L^{-1}$ rhs with the factor of :meth:`init` (rhs (n, ..., B); rows
        past ``n_dofs`` of the result, if any, are padding)."""

    def inverse_quadratic(self, grid: st.StructuredGrid, state: Any, dofs, free: FreeMask,
                          combos):
        r"""$W^T \tilde K^{-1} W$ with the factor of :meth:`init`, (B, C r, C r).

        Column $(c, k)$ of $W$ is $\sum_a$ ``combos[a, k]`` $D e_{\text{dofs}[c, a]}$
        (``dofs`` (B, C, m) ints, ``combos`` (m, r), ``free`` (n, B)): computed
        as $(V^T Y)^T (V^T Y)$ from one forward substitution $Y = L^{-1} E$ of
        the unit vectors (projecting before the products keeps the rigid-body
        parts of $\tilde K^{-1}$, huge near void cells, out of the sums).
        """
        nb, groups, per = dofs.shape
        unit = jax.nn.one_hot(dofs.reshape(nb, -1), grid.n_dofs, dtype=free.dtype)
        unit = unit * free.T[:, None, :]  # (B, C m, n)
        y = self.forward(grid, state, jnp.transpose(unit, (2, 1, 0)))  # (rows, C m, B)
        y = y.reshape(y.shape[0], groups, per, nb)
        m = jnp.einsum("ak,rcaB->Bckr", combos, y)  # (B, C, r, rows)
        m = m.reshape(nb, groups * combos.shape[1], -1)
        return jnp.einsum("Bir,Bjr->Bij", m, m)


Solver: TypeAlias = AbstractSolver  # the short public name (``sj.Solver``)
SolverLike: TypeAlias = AbstractSolver | SolverName | None  # what ``solver=`` accepts


@dataclasses.dataclass(frozen=True)
class Banded(AbstractFactorSolver):
    """Banded Cholesky factorisation, 2D grids.

    Two implementations of the same factorisation: LAPACK's blocked ``dpbtrf``
    on the host (:mod:`sphyr_jax.fem._lapack`, CPU programs only) and a
    batch-last XLA loop (:mod:`sphyr_jax.fem._banded`, any device).

    Attributes:
        block: columns eliminated per step of the XLA factorisation.
        chunk: samples per chunk of a large batch (None: on CPU as many as keep
            a chunk's factor within :data:`FACTOR_BYTES`, see
            :meth:`cpu_chunk`; no chunking elsewhere; 0: never chunk).
        lapack: use LAPACK on the host (None: in CPU programs from
            :data:`LAPACK_MIN_DOFS` DOFs, the measured crossover, on any number
            of CPU devices).
    """

    block: int = 4
    chunk: int | None = None
    lapack: bool | None = None
    name: ClassVar[str] = "banded"
    dims: ClassVar[tuple[int, ...]] = (2,)

    def plan(self, grid: st.StructuredGrid) -> _banded.BandPlan:
        """The XLA factorisation's static plan for ``grid``."""
        return _banded.get_plan(grid.cells, self.block)

    def uses_lapack(self, grid: st.StructuredGrid) -> bool:
        """Whether this grid's systems are factored by LAPACK on the host."""
        if self.lapack is not None:
            return self.lapack
        return jax.default_backend() == "cpu" and grid.n_dofs >= LAPACK_MIN_DOFS

    def label(self, grid: st.StructuredGrid) -> str:
        return "LAPACK banded" if self.uses_lapack(grid) else self.name

    def cpu_chunk(self, grid: st.StructuredGrid) -> int:
        """Samples per chunk on CPU: a power of two whose factors fit in
        :data:`FACTOR_BYTES`, at most 64 for LAPACK and 32 for the XLA loops
        (the XLA factorisation's working set grows with the chunk, and past
        the cache each solve slows down)."""
        plan = self.plan(grid)
        if self.uses_lapack(grid):
            per_sample, cap = 8 * plan.n_dofs * (plan.half_bandwidth + 1), 64
        else:
            per_sample, cap = 8 * plan.steps * plan.block * plan.window, 32
        fits = max(1, FACTOR_BYTES // per_sample)
        return min(cap, 1 << (fits.bit_length() - 1))

    def init(self, grid, moduli, free):
        if self.uses_lapack(grid):
            return jnp.moveaxis(_lapack.jax_factor(moduli, free), 0, -1)  # (n, k + 1, B)
        plan = self.plan(grid)
        return _banded.factor(plan, _banded.row_band(plan, moduli, free))

    def forward(self, grid, state, rhs):
        if self.uses_lapack(grid):
            return _by_rows(_lapack.jax_forward, jnp.moveaxis(state, -1, 0), rhs)
        return _banded.forward(self.plan(grid), state, rhs)

    def inverse_quadratic(self, grid, state, dofs, free, combos):
        """As :meth:`AbstractFactorSolver.inverse_quadratic`; with LAPACK the
        forward substitution $Y$ stays on the host."""
        if self.uses_lapack(grid):
            return _lapack.jax_inverse_quadratic(jnp.moveaxis(state, -1, 0), dofs, free.T,
                                                 combos)
        return super().inverse_quadratic(grid, state, dofs, free, combos)

    def compute(self, grid, state, rhs, x0=None):
        if self.uses_lapack(grid):
            x = _by_rows(_lapack.jax_solve, jnp.moveaxis(state, -1, 0), rhs)
        else:
            x = _banded.solve(self.plan(grid), state, rhs)
        return x, _direct_result(x), _no_iterations(rhs)

    def init_compute(self, grid, moduli, free, rhs):
        """:meth:`init` then :meth:`compute`, keeping no factor.  With LAPACK a
        sample without a free DOF (the identity) costs no factorisation."""
        if not self.uses_lapack(grid):
            return self.compute(grid, self.init(grid, moduli, free), rhs)
        x = _by_rows(lambda _, r: _lapack.jax_factor_solve(moduli, free, r), None, rhs)
        return x, _direct_result(x), _no_iterations(rhs)


def _by_rows(fn, first, rhs):
    """``fn(first, rows)`` on right-hand sides (n, ..., B) moved to the host
    layout (B, r, n), and the result moved back."""
    n, nb = rhs.shape[0], rhs.shape[-1]
    rows = jnp.transpose(rhs.reshape(n, -1, nb), (2, 1, 0))
    out = fn(first, rows)
    return jnp.transpose(out, (2, 1, 0)).reshape(rhs.shape)


@dataclasses.dataclass(frozen=True)
class Dense(AbstractFactorSolver):
    """Dense Cholesky factorisation (``jnp.linalg.cholesky``), small 2D grids.

    Attributes:
        chunk: samples per chunk of a large batch (see :class:`Banded`).
    """

    chunk: int | None = None
    name: ClassVar[str] = "dense"
    dims: ClassVar[tuple[int, ...]] = (2,)

    def init(self, grid, moduli, free):
        return jnp.moveaxis(jnp.linalg.cholesky(st.dense_matrix(grid, moduli, free)), 0, -1)

    def forward(self, grid, state, rhs):
        chol = jnp.moveaxis(state, -1, 0)  # (B, n, n)
        n, nb = rhs.shape[0], rhs.shape[-1]
        cols = jnp.moveaxis(rhs.reshape(n, -1, nb), -1, 0)  # (B, n, r)
        y = jax.scipy.linalg.solve_triangular(chol, cols, lower=True)
        return jnp.moveaxis(y, 0, -1).reshape(rhs.shape)

    def compute(self, grid, state, rhs, x0=None):
        chol = jnp.moveaxis(state, -1, 0)
        x = jax.scipy.linalg.cho_solve((chol, True), jnp.moveaxis(rhs, -1, 0)[..., None])
        x = jnp.moveaxis(x[..., 0], 0, -1)
        return x, _direct_result(x), _no_iterations(rhs)


@dataclasses.dataclass(frozen=True)
class CG(AbstractSolver):
    """Jacobi-preconditioned conjugate gradients (:mod:`sphyr_jax.fem.cg`).

    Attributes:
        tol: relative residual at which a system stops.
        max_iter: iteration bound (None: 4 x the number of DOFs).
        chunk: samples per chunk of a large batch (see :class:`Banded`).
    """

    tol: float = 1e-10
    max_iter: int | None = None
    chunk: int | None = None
    name: ClassVar[str] = "cg"

    def init(self, grid, moduli, free):
        return moduli, free

    def compute(self, grid, state, rhs, x0=None):
        moduli, free = state
        inv_d = 1.0 / st.diagonal(grid, moduli, free)
        x, conv, its = cg.pcg(lambda v: st.matvec(grid, moduli, free, v), lambda r: inv_d * r,
                              rhs, tol=self.tol, max_iter=self.max_iter or 4 * rhs.shape[0],
                              x0=x0)
        return x, _iterative_result(x, conv), its


@dataclasses.dataclass(frozen=True)
class Multigrid(AbstractSolver):
    """Conjugate gradients preconditioned by a geometric-multigrid V-cycle.

    See :mod:`sphyr_jax.fem.multigrid` for the method.

    Attributes:
        tol: CG stops once $\\|r\\|_2 \\le \\text{tol}\\, \\|b\\|_2$.
        max_iter: bound on CG iterations.
        smooth: damped-Jacobi sweeps before and after each coarse correction
            on the finest level.
        omega: Jacobi damping factor.
        max_coarse_dofs: coarsen until the coarsest system has at most this
            many DOFs (then solved densely).
        levels: number of coarsenings; None picks it from ``max_coarse_dofs``.
        coarse_smooth: sweeps on the coarse levels (None: ``smooth``); their
            Galerkin element matrices make a coarse sweep cost more memory
            traffic than a fine one.
        direct_fallback_dofs: samples whose CG did not converge are solved
            directly: 2D grids of any size (banded Cholesky), voxel grids of
            at most this many DOFs (dense Cholesky); 0: never.
        chunk: samples per chunk of a large batch (see :class:`Banded`).
    """

    tol: float = 1e-10
    max_iter: int = 100
    smooth: int = 3
    omega: float = 0.5
    max_coarse_dofs: int = 100
    levels: int | None = None
    coarse_smooth: int | None = 1
    direct_fallback_dofs: int = 6000
    chunk: int | None = None
    name: ClassVar[str] = "multigrid"

    def __post_init__(self):
        if (not self.tol > 0 or self.max_iter < 1 or self.smooth < 1
                or (self.coarse_smooth is not None and self.coarse_smooth < 1)):
            raise ValueError(f"invalid Multigrid options: {self}")
        if not 0.0 < self.omega <= 1.0:
            raise ValueError(f"omega must lie in (0, 1], got {self.omega}")

    def init(self, grid, moduli, free):
        return moduli, free

    def compute(self, grid, state, rhs, x0=None):
        moduli, free = state
        x, conv, its = multigrid.solve(self, moduli, free, rhs, x0=x0)
        return x, _iterative_result(x, conv), its


SOLVERS: dict[str, type[AbstractSolver]] = {
    cls.name: cls for cls in (Banded, Dense, CG, Multigrid)}


def default_solver(shape: tuple[int, ...]) -> AbstractSolver:
    """The solver used when none is given: banded Cholesky in 2D, multigrid CG in 3D."""
    return Banded() if len(shape) == 2 else Multigrid()


def as_solver(solver: SolverLike, shape: tuple[int, ...]) -> AbstractSolver:
    """A solver object from a solver, a name, or None (the default for ``shape``).

    Raises:
        ValueError: an unknown name, or a method that does not serve the grid's
            dimension.
        TypeError: anything else.
    """
    if solver is None:
        solver = default_solver(shape)
    elif isinstance(solver, str):
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}: use one of {tuple(SOLVERS)}")
        solver = SOLVERS[solver]()
    elif not isinstance(solver, AbstractSolver):
        raise TypeError(f"solver must be a solver object or a name, got {type(solver).__name__}")
    solver.check(st.get_grid(tuple(shape)))
    return solver


def as_factor_solver(solver: SolverLike, shape: tuple[int, ...]) -> AbstractFactorSolver:
    """:func:`as_solver` for a use that needs a factorisation to update.

    Raises:
        TypeError: the solver keeps no factorisation (the iterative methods).
        ValueError, TypeError: as :func:`as_solver`.
    """
    solver = as_solver(solver, shape)
    if not isinstance(solver, AbstractFactorSolver):
        factored = ", ".join(name for name, cls in SOLVERS.items()
                             if issubclass(cls, AbstractFactorSolver))
        raise TypeError(f"the {solver.name} solver keeps no factorisation to update; "
                        f"use a factorising solver ({factored})")
    return solver
