"""The banded Cholesky by LAPACK on the host (``Banded(lapack=True)``).

Independent truths: a dense assembly and dense solve (NumPy/SciPy), the XLA
banded factorisation and the dense Cholesky solver (second methods), finite
differences (``check_grads``), and the NumPy/SciPy re-implementation of the
published yardstick (``benchmarks/reference_method.py``) on a grid large
enough that the SIMP steps run on LAPACK.
"""

from __future__ import annotations

import pathlib
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from sphyr_jax.fem import _lapack, fea, structured
from sphyr_jax.fem.linear_solve import solve_system
from sphyr_jax.fem.solvers import LAPACK_MIN_DOFS, RESULTS, Banded, Dense, default_solver
from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
from sphyr_jax.topopt import yardstick

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import reference_method  # noqa: E402
from test_fea import random_problem  # noqa: E402

LAPACK = Banded(lapack=True)
XLA = Banded(lapack=False)


def _dense(shape, moduli, free):
    """Masked dense stiffness from a plain element loop (NumPy)."""
    grid = structured.get_grid(shape)
    n = grid.n_dofs
    k = np.zeros((n, n))
    edofs = structured.element_dofs(grid)
    for e, m in enumerate(moduli.ravel()):
        k[np.ix_(edofs[e], edofs[e])] += m * grid.element.ke
    d = np.diag(free)
    return d @ k @ d + np.eye(n) - d


@pytest.mark.parametrize("shape", [(1, 5), (6, 9), (9, 6), (12, 12), (2, 3, 4), (4, 3, 2)])
def test_host_band_is_the_dense_matrix_and_solves_it(shape):
    """2D and voxel grids: the band is the dense matrix's, and solves it."""
    rng = np.random.default_rng(sum(shape))
    n = structured.get_grid(shape).n_dofs
    moduli = 1e-9 + rng.random((3,) + shape) ** 3
    free = (rng.random((3, n)) > 0.15).astype(float)
    free[2] = 0.0  # nothing free: the identity, no factorisation
    rhs = rng.standard_normal((3, 2, n)) * free[:, None]
    width = _lapack.band_width(shape)
    for i in range(3):
        band = np.empty((n, width))
        _lapack._assemble(moduli[i], free[i], _lapack._layout(shape), band)
        dense = _dense(shape, moduli[i], free[i])
        for d in range(width):
            np.testing.assert_allclose(band[: n - d, d], np.diagonal(dense, -d), rtol=0,
                                       atol=1e-15)
        assert np.all(dense[np.abs(np.subtract.outer(np.arange(n), np.arange(n))) >= width]
                      == 0.0)
    x = _lapack.factor_solve(moduli, free, rhs)
    fac = _lapack.factor(moduli, free)
    np.testing.assert_array_equal(_lapack.solve(fac, rhs), x)
    for i in range(3):
        dense = _dense(shape, moduli[i], free[i])
        expected = np.linalg.solve(dense, rhs[i].T).T
        # Two backward-stable solves agree to about eps times the condition number.
        tol = max(1e-9, 1e-14 * np.linalg.cond(dense))
        np.testing.assert_allclose(x[i], expected, rtol=0, atol=tol * np.abs(expected).max()
                                   + 1e-300)
        # L^{-1} b: the forward half of the solve (L L^T = K).
        chol = np.linalg.cholesky(dense)
        y = np.linalg.solve(chol, rhs[i].T).T
        np.testing.assert_allclose(_lapack.forward(fac, rhs)[i], y, rtol=0,
                                   atol=tol * max(1.0, np.abs(y).max()))
    np.testing.assert_array_equal(x[2], rhs[2])  # identity: the (zero) right-hand side


def test_not_positive_definite_is_a_breakdown_never_a_number():
    shape = (6, 9)
    n = structured.get_grid(shape).n_dofs
    moduli = np.ones(shape + (2,))
    moduli[2, 3, 1] = -50.0  # an indefinite stiffness in sample 1
    free = np.ones((n, 2))
    free[:2] = 0.0
    rhs = np.zeros((n, 2))
    rhs[-1] = 1.0
    u, result, _ = solve_system(jnp.asarray(moduli), jnp.asarray(free), jnp.asarray(rhs),
                                solver=LAPACK)
    assert int(result[0]) == RESULTS.successful and np.all(np.isfinite(u[:, 0]))
    assert int(result[1]) == RESULTS.breakdown and np.all(np.isnan(u[:, 1]))


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(7)
    problems = [random_problem(rng, (12, 12), binary=i % 2 == 1, min_density=0.05)
                for i in range(6)]
    cases = stack_load_cases([load_case_from_grid(t, gravity_dir=g) for t, _, g in problems])
    return cases, np.stack([d for _, d, _ in problems])


def test_default_is_lapack_on_this_cpu_from_the_crossover():
    assert jax.default_backend() == "cpu"
    small, large = structured.get_grid((10, 10)), structured.get_grid((12, 12))
    assert small.n_dofs < LAPACK_MIN_DOFS <= large.n_dofs
    solver = default_solver((12, 12))
    assert not solver.uses_lapack(small) and solver.uses_lapack(large)
    assert not XLA.uses_lapack(large) and LAPACK.uses_lapack(small)


def test_the_host_factorisation_runs_on_one_thread_of_scipys_openblas():
    """The thread limit reaches the OpenBLAS behind SciPy's LAPACK (not NumPy's
    own copy): its thread count reads 1 inside the limit and is restored after.
    (With the limit on the wrong library, two processes factoring at once on
    two cores were 30-40x slower per factorisation.)"""
    import ctypes
    import os

    import scipy

    _lapack._routines()
    path = _lapack.scipy_openblas()
    if path is None:
        pytest.skip("SciPy's LAPACK is not a separately loaded OpenBLAS here")
    own = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    if os.path.isdir(own):
        assert path.startswith(own + os.sep)
    assert "numpy" not in os.path.basename(os.path.dirname(path))
    lib = ctypes.CDLL(path)
    count = next(getattr(lib, name) for name in ("scipy_openblas_get_num_threads",
                                                 "openblas_get_num_threads")
                 if hasattr(lib, name))
    outside = count()
    with _lapack._single_thread():
        assert count() == 1
    assert count() == outside


def test_lapack_xla_and_dense_agree_values_and_derivatives(batch):
    cases, designs = batch
    out = {}
    for name, solver in (("lapack", LAPACK), ("xla", XLA), ("dense", Dense())):
        sol = fea.solve(cases, designs, solver=solver)
        c = fea.compliance(cases, designs, solver=solver)
        grad = jax.grad(lambda r, s=solver: jnp.sum(fea.compliance(cases, r, solver=s)))(
            jnp.asarray(designs))
        # Reverse mode through solve() (adjoint solves with the kept factor).
        grad_u = jax.grad(lambda r, s=solver: jnp.sum(
            fea.solve(cases, r, solver=s).displacements ** 2))(jnp.asarray(designs))
        out[name] = [np.asarray(v) for v in (sol.compliance, c, grad, grad_u,
                                             sol.displacements)]
        assert np.all(np.asarray(sol.result) == RESULTS.successful)
    continuous = slice(0, None, 2)  # 0/1 designs (odd samples) have E_min voids: cond ~ 1e10
    for other in ("xla", "dense"):
        for got, want in zip(out["lapack"], out[other], strict=True):
            np.testing.assert_allclose(got[continuous], want[continuous], rtol=1e-9,
                                       atol=1e-11 * np.abs(want[continuous]).max())
        # Every sample's compliance; a 0/1 design's to the reference tolerance.
        np.testing.assert_allclose(out["lapack"][1], out[other][1], rtol=1e-6)
    np.testing.assert_allclose(out["lapack"][0], out["lapack"][1], rtol=1e-12)


def test_lapack_under_vmap_jit_and_finite_differences(batch):
    cases, designs = batch
    native = np.asarray(fea.compliance(cases, designs, solver=LAPACK))
    vmapped = jax.jit(jax.vmap(lambda c, r: fea.compliance(c, r, solver=LAPACK)))(
        cases, jnp.asarray(designs))
    np.testing.assert_allclose(np.asarray(vmapped), native, rtol=1e-12)
    # Without keeping the factor (each derivative solve factors again): same values.
    free = jax.tree.map(lambda a: a[0], cases)
    fused = fea.solve(free, designs[0], solver=LAPACK, keep_factor=False)
    kept = fea.solve(free, designs[0], solver=LAPACK)
    np.testing.assert_allclose(np.asarray(fused.displacements),
                               np.asarray(kept.displacements), rtol=1e-12, atol=1e-300)
    # First and second derivatives against finite differences, both modes.
    rho = jnp.asarray(0.3 + 0.6 * np.random.default_rng(3).random((12, 12)))
    f = jax.jit(lambda r: fea.compliance(free, r, solver=LAPACK))
    check_grads(f, (rho,), order=2, modes=["fwd", "rev"], eps=1e-5, rtol=1e-4, atol=1e-7)
    g = jax.jit(lambda r: jnp.sum(fea.solve(free, r, solver=LAPACK,
                                            keep_factor=False).displacements ** 2))
    check_grads(g, (rho,), order=1, modes=["fwd", "rev"], eps=1e-5, rtol=1e-4, atol=1e-7)


def test_yardstick_on_lapack_agrees_with_the_second_method():
    """A 14x14 sample (450 DOFs): the SIMP steps and the polish's factor run on
    LAPACK; the optimum equals the NumPy/SciPy re-implementation's."""
    n = 14
    answer = [["L" if 5 <= c <= 7 and r == 0 else
               "S" if r == n - 1 and (c < 2 or c >= n - 2) else
               "1" if r == 0 or c in (1, n - 2) or (r == 6 and 1 < c < n - 2) else "0"
               for c in range(n)] for r in range(n)]
    masked = [["V" if 0 < r < n - 1 and t not in ("L", "S") else t for t in row]
              for r, row in enumerate(answer)]
    case = load_case_from_grid(answer, masked)
    solver, iterative = yardstick.simp_solver(case.shape)
    assert solver.uses_lapack(structured.get_grid(case.shape)) and not iterative
    ours = yardstick.reference_optimum_batch(stack_load_cases([case]))
    theirs = reference_method.reference_optimum(jax.tree.map(np.asarray, case))
    assert float(ours.compliance[0]) == pytest.approx(theirs.compliance, rel=1e-9)
    np.testing.assert_array_equal(ours.densities[0], theirs.densities)


def test_a_batch_spread_over_the_cores_equals_one_thread_bit_for_bit(monkeypatch):
    """Every routine of a large batch, spread over threads (each sample on one
    thread), gives exactly what the calling thread alone gives; the work did
    run on more than one thread where the process has two cores."""
    shape = (20, 20)
    rng = np.random.default_rng(7)
    n = structured.get_grid(shape).n_dofs
    nb = 9
    moduli = 1e-9 + rng.random((nb,) + shape) ** 3
    free = (rng.random((nb, n)) > 0.1).astype(float)
    free[4] = 0.0  # the identity among the live samples
    rhs = rng.standard_normal((nb, 2, n))
    dofs = rng.integers(0, n, (nb, 3, 2))
    combos = rng.standard_normal((2, 2))

    def everything():
        fac = _lapack.factor(moduli, free)
        return [fac, _lapack.solve(fac, rhs), _lapack.forward(fac, rhs),
                _lapack.factor_solve(moduli, free, rhs),
                _lapack.inverse_quadratic(fac, dofs, free, combos)]

    threads = set()
    spread = _lapack._spread

    def recording(live, work, flops_each):
        def one(i):
            threads.add(threading.get_ident())
            work(i)
        spread(live, one, flops_each)

    monkeypatch.setattr(_lapack, "_spread", recording)
    monkeypatch.setattr(_lapack, "_SPREAD_FLOPS", 0.0)
    monkeypatch.setattr(_lapack, "_SPREAD_FLOPS_EACH", 0.0)
    many = everything()
    used = len(threads)
    monkeypatch.setattr(_lapack, "_SPREAD_FLOPS", np.inf)
    threads.clear()
    alone = everything()
    assert threads == {threading.get_ident()}
    for got, want in zip(many, alone, strict=True):
        np.testing.assert_array_equal(got, want)
    assert used >= 2 if _lapack.host_cores() >= 2 else used == 1
    # The identity sample: its right-hand side back, a zero quadratic form.
    np.testing.assert_array_equal(many[3][4], rhs[4])
    np.testing.assert_array_equal(many[4][4], 0.0)
    # A failure in a worker thread reaches the caller.
    monkeypatch.setattr(_lapack, "_SPREAD_FLOPS", 0.0)

    def broken(i):
        if i == 3:
            raise ValueError("sample 3 is broken")

    with pytest.raises(ValueError, match="sample 3 is broken"):
        spread(list(range(nb)), broken, 1.0)
