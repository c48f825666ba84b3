"""One table of every solver, through every transformation, against independent truths.

As lineax's tests run one table of solvers through each test, every solver
here (both implementations of the banded Cholesky, the dense Cholesky,
conjugate gradients and the multigrid CG; the iterative ones on voxel grids
too) must

* implement the abstract interface (:class:`sphyr_jax.fem.solvers.AbstractSolver`,
  and :class:`~sphyr_jax.fem.solvers.AbstractFactorSolver` exactly when it
  keeps a factorisation);
* give the compliance of the assembled matrix solved by NumPy, eagerly, under
  ``jit`` and under ``vmap``;
* give derivatives equal to central finite differences of the primal: ``grad``
  of compliance (its self-adjoint rule), ``jvp`` and ``vjp`` of the
  displacements (the ``custom_linear_solve`` rule in both modes);
* compile one program per solver value: equal solvers (and a solver's name)
  share it.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close_scaled
from scipy.linalg import solve_triangular

import sphyr_jax as sj
from sphyr_jax.fem import solvers, structured
from sphyr_jax.fem.solvers import (
    CG,
    SOLVERS,
    AbstractFactorSolver,
    AbstractSolver,
    Banded,
    Dense,
    Multigrid,
    as_factor_solver,
    as_solver,
)
from sphyr_jax.runtime import CompileCounter

GRID_2D = [list(r) for r in ("0LL00", "1V011", "10V11", "S000S")]
GRID_3D = [[list("L00"), list("0V0")], [list("0V0"), list("000")], [list("S0S"), list("S00")]]
TABLE = [
    ("banded-xla", Banded(lapack=False), 2),
    ("banded-lapack", Banded(lapack=True), 2),
    ("dense", Dense(), 2),
    ("cg", CG(tol=1e-13), 2),
    ("multigrid", Multigrid(tol=1e-13), 2),
    ("cg-3d", CG(tol=1e-13), 3),
    ("multigrid-3d", Multigrid(tol=1e-13), 3),
]
IDS = [name for name, _, _ in TABLE]
STEP = 1e-4  # fourth-order central differences: error ~ 1e-8 relative here
RTOL_FD = 1e-6


def _problem(dim: int, batch: int = 3):
    """(load case, densities (batch, *cells) inside (0.2, 1))."""
    case = sj.load_case_from_grid(GRID_2D if dim == 2 else GRID_3D)
    rng = np.random.default_rng(dim)
    return case, 0.2 + 0.8 * rng.random((batch,) + case.shape)


def _truth(case, rho):
    """Compliance and displacements of one design by a dense NumPy solve."""
    k = sj.dense_stiffness(case, rho)
    f = np.asarray(case.force) * np.asarray(case.free_dofs)
    u = np.linalg.solve(k, f)
    return float(f @ u), u


@pytest.mark.parametrize("cls", list(SOLVERS.values()))
def test_every_solver_class_implements_the_interface(cls):
    assert issubclass(cls, AbstractSolver) and not inspect.isabstract(cls)
    assert SOLVERS[cls.name] is cls and as_solver(cls.name, (4, 5)) == cls()
    solver = cls()
    assert hash(solver) == hash(cls()) and solver == cls()  # a static argument
    assert solver.chunk is None and solver.batch_chunk(structured.get_grid((4, 5))) >= 0
    for method in ("check", "init", "compute", "init_compute", "batch_chunk", "label"):
        assert callable(getattr(solver, method))
    factored = issubclass(cls, AbstractFactorSolver)
    assert factored == (cls in (Banded, Dense))
    if factored:
        assert as_factor_solver(cls.name, (4, 5)) == solver
    else:
        with pytest.raises(TypeError, match=f"{cls.name} solver keeps no factorisation"):
            as_factor_solver(solver, (4, 5))


def test_the_abstract_bases_are_not_solvers():
    with pytest.raises(TypeError):
        AbstractSolver()
    with pytest.raises(TypeError):
        AbstractFactorSolver()
    with pytest.raises(TypeError, match="solver object or a name"):
        as_solver(object(), (4, 5))
    with pytest.raises(ValueError, match="unknown solver"):
        as_solver("lu", (4, 5))
    with pytest.raises(ValueError, match="2D grids; use Multigrid or CG in 3D"):
        as_solver("dense", (2, 3, 3))


def test_results_are_an_enumeration_usable_in_compiled_code():
    assert [r.name for r in sj.RESULTS] == ["successful", "max_iterations_reached",
                                            "nonfinite_input", "no_load_path", "breakdown"]
    assert sj.RESULTS.successful == 0 and sj.RESULTS.successful.message == ""
    assert "iteration bound" in sj.RESULTS.max_iterations_reached.message
    assert solvers.RESULT_MESSAGES[sj.RESULTS.no_load_path] == sj.RESULTS.no_load_path.message

    @jax.jit
    def codes(x):
        return jnp.where(x > 0, sj.RESULTS.successful, sj.RESULTS.breakdown).astype(jnp.int32)

    out = codes(jnp.array([1.0, -1.0]))
    assert out.dtype == jnp.int32 and [sj.result_name(c) for c in out] == ["successful",
                                                                          "breakdown"]


@pytest.mark.parametrize("name, solver, dim", TABLE, ids=IDS)
def test_values_eager_jit_and_vmap_equal_a_dense_solve(name, solver, dim):
    case, rho = _problem(dim)
    truth = np.array([_truth(case, r)[0] for r in rho])

    def native(x):
        return sj.compliance(case, x, solver=solver)

    eager = np.asarray(native(rho))
    jitted = np.asarray(jax.jit(native)(rho))
    mapped = np.asarray(jax.jit(jax.vmap(native))(rho))
    np.testing.assert_allclose(eager, truth, rtol=1e-9)
    np.testing.assert_allclose(jitted, truth, rtol=1e-9)
    np.testing.assert_allclose(mapped, truth, rtol=1e-9)


@pytest.mark.parametrize("name, solver, dim", TABLE, ids=IDS)
def test_derivatives_equal_finite_differences(name, solver, dim):
    case, rho = _problem(dim, batch=1)
    x = jnp.asarray(rho[0])
    v = jax.random.normal(jax.random.PRNGKey(dim), x.shape, jnp.float64)
    n = np.asarray(case.force).shape[-1]
    w = jax.random.normal(jax.random.PRNGKey(7), (n,), jnp.float64)

    def comp(z):
        return sj.compliance(case, z, solver=solver)

    def disp(z):
        return sj.solve(case, z, solver=solver).displacements

    @jax.jit
    def derivatives(z):
        grad_c = jax.grad(comp)(z)
        _, tangent_u = jax.jvp(disp, (z,), (v,))
        grad_wu = jax.grad(lambda y: jnp.dot(w, disp(y)))(z)
        return jnp.vdot(grad_c, v), tangent_u, jnp.vdot(grad_wu, v)

    @jax.jit
    def primal(zs):  # the finite-difference stencil's designs, one batched solve
        sol = sj.solve(case, zs, solver=solver)
        return sol.compliance, sol.displacements, sol.result

    dc, du, dwu = derivatives(x)
    stencil = jnp.stack([x + s * STEP * v for s in (1.0, -1.0, 2.0, -2.0)])
    c, u, result = primal(stencil)
    assert np.all(np.asarray(result) == sj.RESULTS.successful)
    c0, u0 = _truth(case, np.asarray(stencil[0]))
    np.testing.assert_allclose(float(c[0]), c0, rtol=1e-9)
    assert_close_scaled(u[0], u0, 1e-8)

    def fd(a):
        return (8.0 * (a[0] - a[1]) - (a[2] - a[3])) / (12.0 * STEP)

    np.testing.assert_allclose(float(dc), float(fd(c)), rtol=RTOL_FD)
    assert_close_scaled(du, fd(u), RTOL_FD)
    np.testing.assert_allclose(float(dwu), float(fd(u @ w)), rtol=RTOL_FD)


@pytest.mark.parametrize("solver", [Banded(lapack=False), Banded(lapack=True), Dense()],
                         ids=["banded-xla", "banded-lapack", "dense"])
def test_factor_solvers_apply_the_inverse_cholesky_factor(solver):
    case, rho = _problem(2, batch=2)
    grid = structured.get_grid(case.shape)
    moduli = jnp.moveaxis(sj.simp_moduli(jnp.asarray(rho)), 0, -1)  # (*cells, B)
    free = jnp.asarray(np.broadcast_to(case.free_dofs, (2, grid.n_dofs)).T, jnp.float64)
    rng = np.random.default_rng(3)
    rhs = jnp.asarray(rng.standard_normal((grid.n_dofs, 3, 2)))
    dofs = jnp.asarray(rng.integers(0, grid.n_dofs, (2, 3, 4)))
    combos = jnp.asarray(rng.standard_normal((4, 2)))

    @jax.jit
    def run(moduli, free, rhs, dofs, combos):
        state = solver.init(grid, moduli, free)
        return (solver.forward(grid, state, rhs)[: grid.n_dofs],
                solver.inverse_quadratic(grid, state, dofs, free, combos))

    y, quad = run(moduli, free, rhs, dofs, combos)
    for b in range(2):
        k = sj.dense_stiffness(case, rho[b])
        low = np.linalg.cholesky(k)
        np.testing.assert_allclose(np.asarray(y[..., b]),
                                   solve_triangular(low, np.asarray(rhs[..., b]), lower=True),
                                   rtol=1e-9, atol=1e-9)
        mask = np.asarray(case.free_dofs, float)
        cols = np.zeros((grid.n_dofs, 3, 2))
        for c in range(3):
            for a in range(4):
                cols[int(dofs[b, c, a]), c] += np.asarray(combos[a]) * mask[int(dofs[b, c, a])]
        cols = cols.reshape(grid.n_dofs, 6)
        expected = cols.T @ np.linalg.solve(k, cols)
        assert_close_scaled(quad[b], expected, 1e-9)


def test_equal_solvers_share_one_compiled_program():
    case, rho = _problem(2, batch=2)
    sj.compliance(case, rho, solver=Multigrid(tol=1e-11))
    with CompileCounter() as cc:
        for solver in (Multigrid(tol=1e-11), Multigrid(tol=1e-11, max_iter=100)):
            sj.compliance(case, rho, solver=solver)  # a new object, the same value
    assert cc.count == 0
    sj.compliance(case, rho, solver="dense")
    with CompileCounter() as cc:
        sj.compliance(case, rho, solver=Dense())
        sj.compliance(case, rho[::-1], solver="dense")
    assert cc.count == 0
