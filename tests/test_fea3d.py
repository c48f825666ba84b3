"""Dimension-generic elements, structured operators and the multigrid-preconditioned CG.

Every figure is checked against an independent truth: a separate H8 element
and sparse assembly written here (physical x/y/z coordinates, its own node
numbering, Lame constants) solved with SciPy, continuum mechanics in closed
form, or beam theory.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl
from conftest import SETS, SHARED, report, require_shared

import sphyr_jax as sj
from sphyr_jax.data.convert import read_raw_csv_3d
from sphyr_jax.fem import elements, multigrid_levels, structured
from sphyr_jax.fem.fea import dense_stiffness, simp_moduli
from sphyr_jax.fem.linear_solve import solve_system, system_compliance
from sphyr_jax.fem.solvers import RESULTS, Multigrid
from sphyr_jax.problem.grids import densities_from_grid
from sphyr_jax.problem.loadcase import index_load_case, load_case_from_grid, stack_load_cases

RAW_3D = SHARED / "raw_data_3d"
NU = 0.3
EMIN = 1e-9
TIGHT = Multigrid(tol=1e-12, max_iter=300)


# ----------------------------------------------------------------------------
# Independent reference: H8 in physical coordinates, SciPy sparse assembly.


def _lame(nu=NU):
    return nu / ((1 + nu) * (1 - 2 * nu)), 1 / (2 * (1 + nu))


def _h8_physical():
    """Unit-cube H8 stiffness, nodes in lexicographic (x, y, z) order, DOFs (x, y, z)."""
    lam, mu = _lame()
    corners = list(itertools.product((0, 1), repeat=3))
    g = (0.5 - 0.5 / math.sqrt(3), 0.5 + 0.5 / math.sqrt(3))
    ke = np.zeros((24, 24))
    for p in itertools.product(g, repeat=3):
        grads = np.zeros((8, 3))
        for a, c in enumerate(corners):
            f = [p[i] if c[i] else 1 - p[i] for i in range(3)]
            df = [1.0 if c[i] else -1.0 for i in range(3)]
            grads[a] = [df[0] * f[1] * f[2], f[0] * df[1] * f[2], f[0] * f[1] * df[2]]
        # energy density 1/2 (lam tr(e)^2 + 2 mu e:e) -> bilinear form per DOF pair
        for a in range(8):
            for b in range(8):
                for i in range(3):
                    for j in range(3):
                        v = lam * grads[a, i] * grads[b, j] + mu * grads[a, j] * grads[b, i]
                        if i == j:
                            v += mu * grads[a] @ grads[b]
                        ke[3 * a + i, 3 * b + j] += v / 8.0
    return ke, corners


KE_PHYS, CORNERS = _h8_physical()


def read_csv_independently(path):
    """Voxels of a raw 3D CSV keyed by physical (x, y, z): (density, is_static)."""
    cells = {}
    for line in path.read_text().splitlines():
        if line.strip():
            parts = line.split(",", 6)
            x, y, z = (int(math.floor(float(v))) for v in parts[1:4])
            cells[(x, y, z)] = (float(parts[4]), parts[5].strip() == "True")
    return cells


def reference_compliance(rho, load, support):
    """Compliance by an independent sparse H8 assembly.

    Args:
        rho, load, support: dicts or arrays indexed physically [x, y, z].

    Returns:
        (compliance, displacement dict {(X, Y, Z): (ux, uy, uz)}).
    """
    nx, ny, nz = rho.shape
    nid = lambda x, y, z: (x * (ny + 1) + y) * (nz + 1) + z  # noqa: E731
    n = 3 * (nx + 1) * (ny + 1) * (nz + 1)
    rows, cols, vals = [], [], []
    f = np.zeros(n)
    fixed = np.zeros(n, bool)
    n_load = load.sum()
    for x, y, z in itertools.product(range(nx), range(ny), range(nz)):
        dofs = np.array([3 * nid(x + c[0], y + c[1], z + c[2]) + i for c in CORNERS
                         for i in range(3)])
        e = EMIN + rho[x, y, z] ** 3 * (1 - EMIN)
        rows.append(np.repeat(dofs, 24))
        cols.append(np.tile(dofs, 24))
        vals.append((e * KE_PHYS).ravel())
        if load[x, y, z]:
            f[dofs[2::3]] -= 1.0 / (8 * n_load)  # down = -z
        if support[x, y, z]:
            fixed[dofs] = True
    k = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(n, n))
    free = np.flatnonzero(~fixed)
    u = np.zeros(n)
    u[free] = spl.spsolve(k[free][:, free].tocsc(), f[free])
    return float(f @ u), u


def physical_arrays(cells, level):
    nx = max(k[0] for k in cells) + 1
    ny = max(k[1] for k in cells) + 1
    nz = max(k[2] for k in cells) + 1
    rho = np.zeros((nx, ny, nz))
    load = np.zeros((nx, ny, nz), bool)
    support = np.zeros((nx, ny, nz), bool)
    for (x, y, z), (d, static) in cells.items():
        r = round(d, 1)
        rho[x, y, z] = 1.0 if static else (float(r > 0) if level == "easy" else r)
        support[x, y, z] = static and z == 0
        load[x, y, z] = static and z != 0
    return rho, load, support


def physical_to_printed(a):
    """[x, y, z] (y, z up) -> printed [layer, row, col]."""
    return np.transpose(a, (2, 1, 0))[::-1, ::-1, :]


# ----------------------------------------------------------------------------
# Elements and structured grids.


def _q4_element_dofs(nely, nelx):
    """2D element DOFs written from the conventions: nodes row-major, element nodes
    top-left, top-right, bottom-right, bottom-left, DOFs (x, y) per node."""
    out = []
    for r in range(nely):
        for c in range(nelx):
            tl = r * (nelx + 1) + c
            nodes = (tl, tl + 1, tl + nelx + 2, tl + nelx + 1)
            out.append([2 * n + k for n in nodes for k in (0, 1)])
    return np.array(out)


def test_q4_element_follows_the_2d_conventions():
    assert elements.get_element(2).node_offsets == ((0, 0), (0, 1), (1, 1), (1, 0))
    assert np.array_equal(elements.get_element(2).ke, elements.element_stiffness(2))
    for shape in ((3, 5), (10, 10)):
        grid = structured.get_grid(shape)
        assert np.array_equal(structured.element_dofs(grid), _q4_element_dofs(*shape))


def test_h8_element_equals_independent_physical_element():
    # Library node a at (layer, row, col) offset o <-> physical corner (x, y, z) = (o_c, o_r, o_l)
    # with DOF components (col, row, layer) = (x, y, z): same element up to a permutation.
    h8 = elements.get_element(3)
    perm = [CORNERS.index((o[2], o[1], o[0])) for o in h8.node_offsets]
    dof_perm = np.array([3 * p + i for p in perm for i in range(3)])
    np.testing.assert_allclose(h8.ke, KE_PHYS[np.ix_(dof_perm, dof_perm)], atol=1e-14)


def test_structured_2d_matvec_equals_dense_q4_assembly(rng):
    gt = [["0", "L", "L", "0", "1"], ["1", "1", "0", "1", "1"], ["1", "0", "V", "1", "0"],
          ["S", "S", "0", "0", "S"]]
    case = load_case_from_grid(gt)
    rho = rng.random((4, 5))
    kd = dense_stiffness(case, rho)
    grid = structured.get_grid((4, 5))
    x = rng.standard_normal((grid.n_dofs, 2))
    moduli = simp_moduli(jnp.asarray(rho))[..., None] * jnp.ones(2)
    free = jnp.asarray(case.free_dofs, jnp.float64)[:, None] * jnp.ones(2)
    y = structured.matvec(grid, moduli, free, jnp.asarray(x))
    np.testing.assert_allclose(y, kd @ x, rtol=1e-12, atol=1e-12)
    # The fused nodal stencil (the 2D multigrid's operator) is the same matrix.
    lattice = structured.matvec_lattice(grid, moduli, structured.to_lattice(grid, free),
                                        structured.to_lattice(grid, jnp.asarray(x)), stencil=True)
    np.testing.assert_allclose(structured.from_lattice(grid, lattice), kd @ x, rtol=1e-12,
                               atol=1e-12)
    diag = structured.diagonal(grid, moduli, free)
    np.testing.assert_allclose(diag[:, 0], np.diag(kd), rtol=1e-13)


def _node_coordinates(grid):
    """Physical-like coordinates per DOF component: component k along grid axis d-1-k."""
    idx = np.indices(grid.node_shape).astype(float)  # (d, *nodes)
    return np.stack([idx[grid.dim - 1 - k] for k in range(grid.dim)])  # (d comps, *nodes)


@pytest.mark.parametrize("cells", [(3, 4), (2, 3, 4)])
def test_patch_rigid_body_modes_give_zero_force(cells, rng):
    grid = structured.get_grid(cells)
    d = grid.dim
    coords = _node_coordinates(grid)
    modes = [np.stack([np.full(grid.node_shape, float(i == k)) for i in range(d)])
             for k in range(d)]  # translations
    for i, j in itertools.combinations(range(d), 2):  # infinitesimal rotations
        m = np.zeros((d,) + grid.node_shape)
        m[i], m[j] = -coords[j], coords[i]
        modes.append(m)
    lattice = jnp.asarray(np.stack(modes, -1))  # (d, *nodes, modes)
    nb = lattice.shape[-1]
    moduli = jnp.asarray(rng.random(cells + (nb,)) + 0.1)
    free = jnp.ones_like(lattice)
    out = structured.matvec_lattice(grid, moduli, free, lattice)
    assert len(modes) == (3 if d == 2 else 6)
    assert float(jnp.max(jnp.abs(out))) < 1e-12


@pytest.mark.parametrize("cells", [(3, 4), (2, 3, 4)])
def test_patch_uniform_strain_exact_energy_and_interior_equilibrium(cells, rng):
    grid = structured.get_grid(cells)
    d = grid.dim
    coords = _node_coordinates(grid)
    eps = rng.standard_normal((d, d))
    eps = 0.5 * (eps + eps.T)  # symmetric strain; u_k = sum_j eps_kj x_j
    u = np.einsum("kj,j...->k...", eps, coords)
    moduli = jnp.full(cells + (1,), 2.5)
    free = jnp.ones((d,) + grid.node_shape + (1,))
    x = jnp.asarray(u[..., None])
    ku = np.asarray(structured.matvec_lattice(grid, moduli, free, x))[..., 0]
    volume = math.prod(cells)
    e = 2.5
    if d == 3:
        lam, mu = (e * v for v in _lame())
        expected = volume * (lam * np.trace(eps) ** 2 + 2 * mu * np.sum(eps * eps))
    else:  # plane stress
        c = e / (1 - NU**2)
        exx, eyy, gxy = eps[0, 0], eps[1, 1], 2 * eps[0, 1]
        expected = volume * c * (exx**2 + eyy**2 + 2 * NU * exx * eyy + (1 - NU) / 2 * gxy**2)
    np.testing.assert_allclose(float(np.sum(u * ku)), expected, rtol=1e-12)
    interior = (slice(None),) + tuple(slice(1, -1) for _ in cells)
    assert np.max(np.abs(ku[interior])) < 1e-12 * np.max(np.abs(ku))
    energies = structured.element_energy_lattice(grid, x, x)[..., 0]
    np.testing.assert_allclose(np.asarray(energies), expected / volume / e, rtol=1e-12)


def _cantilever_compliance(r, slenderness=8):
    """Voxel cantilever of r x r cross-section and length slenderness * r, tip load 1 (-layer).

    Clamped at column 0; the unit load is spread over the end face with bilinear
    (trapezoid) weights, so compliance = weighted mean tip deflection.
    """
    cells = (r, r, slenderness * r)
    grid = structured.get_grid(cells)
    k = np.zeros(grid.node_shape + (3,))
    w1 = np.ones(r + 1)
    w1[[0, -1]] = 0.5
    k[:, :, -1, 2] = np.outer(w1, w1) / np.outer(w1, w1).sum()
    f = k.reshape(-1)
    fixed = np.zeros(grid.node_shape + (3,), bool)
    fixed[:, :, 0, :] = True
    edofs = structured.element_dofs(grid)
    ke = elements.get_element(3).ke
    kmat = sp.csc_matrix((np.tile(ke.ravel(), grid.n_cells),
                          (np.repeat(edofs, 24, axis=1).ravel(), np.tile(edofs, 24).ravel())),
                         shape=(grid.n_dofs,) * 2)
    free = np.flatnonzero(~fixed.reshape(-1))
    u = spl.spsolve(kmat[free][:, free].tocsc(), f[free])
    return float(f[free] @ u), slenderness * r, r


def test_slender_voxel_cantilever_approaches_beam_theory():
    ratios = []
    for r in (1, 2, 3, 4):
        c, length, h = _cantilever_compliance(r)
        euler_bernoulli = length**3 / (3 * 1.0 * h**4 / 12)
        ratios.append(c / euler_bernoulli)
    report("voxel cantilever (L/h = 8) FE / Euler-Bernoulli tip deflection, h = 1..4 voxels: "
           + ", ".join(f"{x:.4f}" for x in ratios))
    # Trilinear bricks lock in bending: the ratio rises monotonically towards 1
    # (plus about 1% Timoshenko shear at L/h = 8) as the section is refined.
    assert all(a < b for a, b in zip(ratios, ratios[1:], strict=False))
    assert 0.90 < ratios[-1] < 1.03
    assert ratios[0] < 0.85


# ----------------------------------------------------------------------------
# Multigrid-preconditioned CG.


def _random_problem(rng, cells, batch, solid=0.5):
    """Random 0/1 designs (voids at E_min) with a random support and load patch."""
    grid = structured.get_grid(cells)
    d = grid.dim
    rho = (rng.random(cells + (batch,)) < solid).astype(float)
    fixed = np.zeros((d,) + grid.node_shape + (batch,), bool)
    force = np.zeros((d,) + grid.node_shape + (batch,))
    for b in range(batch):
        c0 = rng.integers(0, cells[-1] - 1)
        fixed[(slice(None), -1) + (slice(None),) * (d - 2) + (slice(c0, c0 + 2), b)] = True
        rho[(-1,) + (slice(None),) * (d - 2) + (slice(c0, c0 + 2), b)] = 1.0
        idx = (0,) + tuple(rng.integers(0, n) for n in cells[1:])
        force[(d - 1,) + idx + (b,)] = 1.0
        rho[idx + (b,)] = 1.0
    moduli = EMIN + rho * (1 - EMIN)
    free_lat = (~fixed).astype(float)
    return grid, moduli, free_lat, force * free_lat


def _direct(grid, moduli, free_flat, force_flat):
    """Direct sparse solves of the masked systems (library element, SciPy assembly).

    Returns:
        (u (n_dofs, B), energy-norm function err(v, b) = sqrt(v^T K_b v)).
    """
    edofs = structured.element_dofs(grid)
    ke = grid.element.ke
    m = ke.shape[0]
    out, mats = [], []
    for b in range(moduli.shape[-1]):
        e = np.asarray(moduli[..., b]).reshape(-1)
        k = sp.csc_matrix(((e[:, None, None] * ke).ravel(),
                           (np.repeat(edofs, m, axis=1).ravel(), np.tile(edofs, m).ravel())),
                          shape=(grid.n_dofs,) * 2)
        fr = np.flatnonzero(free_flat[:, b] > 0)
        u = np.zeros(grid.n_dofs)
        u[fr] = spl.spsolve(k[fr][:, fr].tocsc(), force_flat[fr, b])
        out.append(u)
        mats.append(k)
    return np.stack(out, -1), lambda v, b: math.sqrt(max(float(v @ (mats[b] @ v)), 0.0))


def _assert_matches_direct(u, ref, energy, force):
    """Compliance to 1e-8 and displacement error to 1e-8 in the energy norm.

    Pieces of material that hang in E_min voids (islands, hinges) have
    displacements that only the 1e-9 void stiffness pins down; both solvers
    resolve them to a relative ~1e-3 at best, so displacements are compared in
    the energy norm, where those modes carry (rightly) no weight.
    """
    c, c_ref = np.sum(force * u, axis=0), np.sum(force * ref, axis=0)
    np.testing.assert_allclose(c, c_ref, rtol=1e-8)
    for b in range(u.shape[-1]):
        assert energy(u[:, b] - ref[:, b], b) <= 1e-8 * energy(ref[:, b], b)


@pytest.mark.parametrize("cells", [(24, 30), (5, 6, 7)])
def test_mgcg_equals_direct_solve_on_random_designs_any_size(cells, rng):
    solid = 0.75 if len(cells) == 2 else 0.5
    grid, moduli, free_lat, force_lat = _random_problem(rng, cells, batch=3, solid=solid)
    free = np.asarray(structured.from_lattice(grid, jnp.asarray(free_lat)))
    force = np.asarray(structured.from_lattice(grid, jnp.asarray(force_lat)))
    options = Multigrid(tol=1e-12, max_iter=600, max_coarse_dofs=60)
    levels = multigrid_levels.plan(cells, max_coarse_dofs=options.max_coarse_dofs)
    assert len(levels) >= 3  # odd sizes are padded while coarsening
    u, result, its = solve_system(jnp.asarray(moduli), jnp.asarray(free), jnp.asarray(force),
                                  solver=options)
    conv = np.asarray(result) == RESULTS.successful
    ref, energy = _direct(grid, moduli, free, force)
    assert bool(np.all(conv))
    _assert_matches_direct(np.asarray(u), ref, energy, force)
    report(f"MG-CG random 0/1 designs {cells} ({solid:.0%} solid, tol 1e-12): iterations "
           f"{np.asarray(its).tolist()}")


def test_mgcg_batch_vmap_and_gradients(rng):
    cells = (3, 4, 5)
    grid, moduli, free_lat, force_lat = _random_problem(rng, cells, batch=3, solid=0.7)
    moduli = moduli + rng.random(moduli.shape) * 0.3  # grey designs
    free = jnp.asarray(structured.from_lattice(grid, jnp.asarray(free_lat)))
    force = jnp.asarray(structured.from_lattice(grid, jnp.asarray(force_lat)))
    opts = Multigrid(tol=1e-13, max_iter=300, max_coarse_dofs=60)
    e = jnp.asarray(moduli)
    c_batch = system_compliance(e, force, free, solver=opts)
    assert bool(jnp.all(solve_system(e, free, force, solver=opts)[1] == RESULTS.successful))

    def single(e1, f1, fr1):
        return system_compliance(e1[..., None], f1[:, None], fr1[:, None], solver=opts)[0]

    c_vmap = jax.vmap(single, in_axes=(-1, -1, -1))(e, force, free)
    np.testing.assert_allclose(c_vmap, c_batch, rtol=1e-10)

    # Gradient of compliance: -u_e^T K_e u_e, checked by central differences.
    grad = jax.grad(lambda m: jnp.sum(system_compliance(m, force, free, solver=opts)))(e)
    cell = (1, 2, 3, 1)
    h = 1e-4  # 4th-order central difference: the CG tolerance, not h, sets the error

    def c_at(t):
        return jnp.sum(system_compliance(e.at[cell].add(t * h), force, free, solver=opts))

    fd = (8 * (c_at(1) - c_at(-1)) - (c_at(2) - c_at(-2))) / (12 * h)
    np.testing.assert_allclose(grad[cell], fd, rtol=1e-6)

    # Gradient through the displacement solve (adjoint = one more MG-CG solve).
    w = jnp.asarray(rng.standard_normal(force.shape))

    def functional(m, f):
        return jnp.sum(w * solve_system(m, free, f, solver=opts)[0])

    gm, gf = jax.grad(functional, argnums=(0, 1))(e, force)
    def f_at(t):
        return functional(e.at[cell].add(t * h), force)

    fd = (8 * (f_at(1) - f_at(-1)) - (f_at(2) - f_at(-2))) / (12 * h)
    np.testing.assert_allclose(gm[cell], fd, rtol=1e-6)
    dof = int(jnp.argmax(free[:, 0]))
    bump_f = jnp.zeros_like(force).at[dof, 0].set(1.0)
    lin = functional(e, force + bump_f) - functional(e, force)  # linear in f
    np.testing.assert_allclose(gf[dof, 0], lin, rtol=1e-8)


# ----------------------------------------------------------------------------
# Real SPhyR-3D samples.


@pytest.fixture(scope="module")
def real_3d():
    files = sorted(require_shared(RAW_3D).glob("*_SPhyR_3D.csv"))
    if not files:
        require_shared(RAW_3D / "0_SPhyR_3D.csv")
    samples = [read_raw_csv_3d(p) for p in files]
    grids = [s.grid(level) for level in ("easy", "hard") for s in samples]
    cases = [load_case_from_grid(g) for g in grids]
    rho = np.stack([densities_from_grid(g)[0] for g in grids], -1)
    n = len(grids)
    moduli = np.concatenate([np.asarray(simp_moduli(jnp.asarray(rho))),
                             np.ones(rho.shape)], -1)  # answers, then solid designs
    force = np.stack([c.force for c in cases] * 2, -1)
    free = np.stack([c.free_dofs for c in cases] * 2, -1).astype(float)
    u, result, its = solve_system(jnp.asarray(moduli), jnp.asarray(free), jnp.asarray(force),
                                  solver=TIGHT)
    conv = np.asarray(result) == RESULTS.successful
    c = np.sum(force * np.asarray(u), axis=0)
    return {"files": files, "n": n, "u": np.asarray(u), "c": c, "conv": np.asarray(conv),
            "its": np.asarray(its), "moduli": moduli, "force": force, "free": free}


def test_real_3d_answers_match_independent_sparse_assembly(real_3d):
    files, n = real_3d["files"], real_3d["n"]
    assert bool(np.all(real_3d["conv"]))
    picks = [0, 5, len(files) - 1]
    for k, level in enumerate(("easy", "hard")):
        for i in picks:
            rho, load, support = physical_arrays(read_csv_independently(files[i]), level)
            ref, _ = reference_compliance(rho, load, support)
            got = real_3d["c"][k * len(files) + i]
            np.testing.assert_allclose(got, ref, rtol=1e-8, err_msg=f"{files[i].name} {level}")
    its = real_3d["its"]
    report(f"MG-CG on {n} converted SPhyR-3D answers (tol 1e-12): iterations "
           f"min {its[:n].min()} median {int(np.median(its[:n]))} max {its[:n].max()}; "
           f"solid designs max {its[n:].max()}")


def test_real_3d_mgcg_equals_direct_solve(real_3d):
    grid = structured.get_grid((10, 10, 10))
    sel = [0, real_3d["n"] - 1, real_3d["n"] + 1]
    force = real_3d["force"][:, sel]
    ref, energy = _direct(grid, real_3d["moduli"][..., sel], real_3d["free"][:, sel], force)
    _assert_matches_direct(real_3d["u"][:, sel], ref, energy, force)


def test_every_converted_3d_answer_is_load_carrying(real_3d):
    n = real_3d["n"]
    c, solid = real_3d["c"][:n], real_3d["c"][n:]
    assert np.all(np.isfinite(c)) and np.all(c > 0)
    assert np.all(c <= 1e3 * solid), (c / solid).max()
    assert np.all(c >= solid * (1 - 1e-9))  # removing material never stiffens


# ----------------------------------------------------------------------------
# The public API in 3D: the same functions as in 2D.

EMBEDDED_3D = SETS / "dataset_3d"


@pytest.fixture(scope="module")
def embedded_3d():
    """Load cases and answers of the embedded 3D raw samples (always present)."""
    files = sorted((EMBEDDED_3D / "raw").glob("*_SPhyR_3D.csv"))
    grids = [read_raw_csv_3d(p).grid("hard") for p in files]
    cases = [load_case_from_grid(g) for g in grids]
    rho = np.stack([densities_from_grid(g)[0] for g in grids])
    return files, stack_load_cases(cases), rho


def test_public_compliance_in_3d_equals_independent_sparse_assembly(embedded_3d):
    files, cases, rho = embedded_3d
    c = np.asarray(sj.compliance(cases, rho))  # one batched call, multigrid CG
    ana = sj.analyze(cases, rho)
    for i, path in enumerate(files):
        phys_rho, load, support = physical_arrays(read_csv_independently(path), "hard")
        ref, u_ref = reference_compliance(phys_rho, load, support)
        np.testing.assert_allclose(c[i], ref, rtol=1e-8, err_msg=path.name)
    np.testing.assert_allclose(np.asarray(ana.compliance), c, rtol=1e-9)
    assert np.all(np.asarray(ana.load_carrying))
    assert np.all(np.asarray(ana.solid_compliance) <= c)
    np.testing.assert_allclose(np.asarray(ana.volume_fraction), rho.mean(axis=(1, 2, 3)))


def test_a_warm_start_changes_the_iterations_not_the_answer(embedded_3d):
    """``sj.solve(..., x0=)``: from a guess near the answer the multigrid CG needs
    fewer iterations and reaches the same displacements; a direct solver ignores
    the guess.  The guess is broadcast over the batch like the densities."""
    _, cases, rho = embedded_3d
    sub, designs = jax.tree.map(lambda a: a[:3], cases), rho[:3]
    cold = sj.solve(sub, designs)
    u = np.asarray(cold.displacements)
    near = u * (1.0 + 1e-4 * np.cos(np.arange(u.shape[-1])))
    warm = sj.solve(sub, designs, x0=near)
    # Both stop at a relative residual of 1e-10; with 1e-9 voids the
    # displacements are determined to about 1e-6 of their scale, the energy far better.
    np.testing.assert_allclose(np.asarray(warm.displacements), u, rtol=0,
                               atol=1e-5 * np.abs(u).max())
    assert np.all(np.asarray(warm.iterations) < np.asarray(cold.iterations))
    np.testing.assert_allclose(np.asarray(warm.compliance), np.asarray(cold.compliance),
                               rtol=1e-9)
    # One guess for every sample (broadcast) also converges to the same answer.
    shared = sj.solve(sub, designs, x0=near[0])
    np.testing.assert_allclose(np.asarray(shared.compliance), np.asarray(cold.compliance),
                               rtol=1e-9)
    # The banded factorisation of a 2D problem ignores the guess: bit for bit.
    case2d = sj.load_case_from_grid(*[[list(r) for r in ("L000", "0000", "S00S")]] * 2)
    exact = sj.solve(case2d, np.ones((3, 4)), solver="banded")
    guessed = sj.solve(case2d, np.ones((3, 4)), solver="banded",
                       x0=np.ones_like(np.asarray(exact.displacements)))
    np.testing.assert_array_equal(np.asarray(guessed.displacements),
                                  np.asarray(exact.displacements))


def test_scattered_islands_fall_back_to_a_direct_solve(embedded_3d, key):
    """Cells of material floating in void (a model scattering values over a hard
    completion) stall the multigrid CG: each island has rigid-body modes the
    hierarchy cannot see.  Such samples are re-solved directly and still equal
    the independent sparse assembly."""
    files, cases, rho = embedded_3d
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    scattered = rho[:2].copy()
    for b in range(2):
        idx = rng.choice(scattered[b].size, 30, replace=False)
        scattered[b].flat[idx] = rng.integers(1, 11, 30) / 10
    sub = jax.tree.map(lambda a: a[:2], cases)
    grid = structured.get_grid((10, 10, 10))
    moduli = np.moveaxis(np.asarray(simp_moduli(jnp.asarray(scattered))), 0, -1)
    force = np.asarray(sub.force).reshape(2, -1).T
    free = np.asarray(sub.free_dofs).reshape(2, -1).T.astype(float)
    plain = Multigrid(direct_fallback_dofs=0)
    _, result, its = solve_system(moduli, free, force, solver=plain)
    # CG alone stalls, and says so.
    assert np.all(np.asarray(result) == RESULTS.max_iterations_reached), np.asarray(its)
    u, result, _ = solve_system(moduli, free, force, solver=Multigrid())
    c = np.sum(force * free * np.asarray(u), axis=0)
    public = np.asarray(sj.compliance(sub, scattered))
    assert np.all(np.asarray(result) == RESULTS.successful)
    for i, path in enumerate(files[:2]):
        _, load, support = physical_arrays(read_csv_independently(path), "hard")
        phys = np.transpose(scattered[i][::-1, ::-1, :], (2, 1, 0))  # printed -> [x, y, z]
        ref, _ = reference_compliance(phys, load, support)
        np.testing.assert_allclose([float(c[i]), public[i]], ref, rtol=1e-8, err_msg=path.name)
    assert grid.n_dofs <= Multigrid().direct_fallback_dofs


def test_public_derivatives_in_3d_both_modes(embedded_3d, key):
    _, cases, rho = embedded_3d
    case = index_load_case(cases, 0)
    x = jnp.asarray(0.1 + 0.8 * rho[0])
    f = lambda z: sj.compliance(case, z)  # noqa: E731
    v = jax.random.normal(key, x.shape, jnp.float64)
    h = 1e-4
    fd = (8 * (f(x + h * v) - f(x - h * v)) - (f(x + 2 * h * v) - f(x - 2 * h * v))) / (12 * h)
    jvp = jax.jvp(f, (x,), (v,))[1]
    g = jax.grad(f)(x)
    # The multigrid CG stops at a relative residual of 1e-10.
    np.testing.assert_allclose(float(jvp), float(fd), rtol=1e-6)
    np.testing.assert_allclose(float(jnp.vdot(g, v)), float(fd), rtol=1e-6)
    # vmap over samples runs the same kernels as the native batch.
    both = jax.jit(jax.vmap(sj.compliance))(cases, jnp.asarray(rho))
    np.testing.assert_allclose(np.asarray(both), np.asarray(sj.compliance(cases, rho)),
                               rtol=1e-12)


def test_simp_optimize_in_3d(embedded_3d):
    """The public SIMP entry point on voxels: on budget, stiffer than its start."""
    from sphyr_jax.topopt import simp

    _, cases, _ = embedded_3d
    case = jax.tree.map(lambda a: a[:1], cases)
    res = sj.optimize(case, penal=3.0, options=simp.SimpOptions(max_iterations=40))
    start = simp.initial_design(case)
    np.testing.assert_allclose(np.asarray(res.volume_fraction),
                               np.asarray(case.volume_fraction), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(res.compliance),
                               np.asarray(sj.compliance(case, res.densities)), rtol=1e-9)
    assert float(res.compliance[0]) < 0.9 * float(sj.compliance(case, start)[0])


def test_scoring_voxel_completions(optimum_cache):
    """The whole scoring path on a voxel sample: the optimum is at least as stiff as
    the answer within its budget, an empty completion scores 0, a solid one its
    material efficiency."""
    import json

    rec = json.loads((EMBEDDED_3D / "full_easy_3d.jsonl").read_text().splitlines()[1])
    gt = rec["ground_truth"]

    def filled(token):
        return [[[t if t in ("L", "S") else token for t in row] for row in layer]
                for layer in gt]

    answer, empty, solid = sj.score_batch(
        [sj.ScoreItem(c, gt, rec["input_grid"]) for c in (gt, filled("0"), filled("1"))],
        cache=optimum_cache)
    assert answer.physically_valid and answer.load_carrying
    assert answer.optimal_compliance <= answer.ground_truth_compliance * (1 + 1e-12)
    assert 0.0 < answer.topology_score <= 1.0
    assert empty.physically_valid and not empty.load_carrying and empty.topology_score == 0.0
    assert solid.load_carrying and solid.structural_efficiency == 1.0
    np.testing.assert_allclose(solid.topology_score, solid.material_efficiency, rtol=1e-12)
    np.testing.assert_allclose(solid.material_efficiency, answer.ground_truth_volume_fraction,
                               rtol=1e-12)
    # A completion of the wrong shape (a 2D grid) is invalid, not an exception.
    flat = sj.get_structural_metrics(gt[0], gt, rec["input_grid"])
    assert not flat.physically_valid and flat.topology_score == 0.0


def test_rescore_tree_with_voxel_and_2d_results(tmp_path, optimum_cache):
    """A results tree holding 3D and 2D files rescores in one pass: voxel completions
    are read out of raw text (layers split by blank lines, prose around them), the
    answer scores as the answer, hostile text is invalid, aggregates sum the records."""
    import json

    from sphyr_jax.problem.grids import grid_to_text
    from sphyr_jax.scoring.results import rescore_tree

    rec3 = json.loads((EMBEDDED_3D / "full_easy_3d.jsonl").read_text().splitlines()[1])
    rec2 = json.loads((SETS / "dataset" / "full_easy.jsonl").read_text()
                      .splitlines()[0])
    empty3 = [[["0" if t == "V" else t for t in row] for row in layer]
              for layer in rec3["input_grid"]]
    prompt3 = "Fill the V voxels.\n\n" + grid_to_text(rec3["input_grid"])
    records3 = [
        {"prompt": prompt3, "ground_truth": rec3["ground_truth"], "model_note": "kept",
         "completion": "Here is the design:\n```\n" + grid_to_text(rec3["ground_truth"])
         + "\n```\nDone."},
        {"prompt": prompt3, "ground_truth": rec3["ground_truth"],
         "completion": grid_to_text(empty3)},
        {"prompt": prompt3, "ground_truth": rec3["ground_truth"],
         "completion": "I cannot do that in three dimensions."},
    ]
    records2 = [{"prompt": "Fill:\n" + grid_to_text(rec2["input_grid"]),
                 "ground_truth": rec2["ground_truth"],
                 "completion": grid_to_text(rec2["ground_truth"])}]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "full_easy_3d_results.json").write_text(json.dumps(records3))
    (tmp_path / "model" / "full_easy_results.json").write_text(json.dumps(records2))
    summary = rescore_tree(tmp_path, cache=optimum_cache)
    assert summary.files == 2 and summary.records == 4 and summary.invalid_records == 1
    out3 = json.loads((tmp_path / "model" / "full_easy_3d_results.json").read_text())
    answer, empty, hostile = out3
    assert answer["model_note"] == "kept"
    assert answer["physically_valid"] and answer["load_carrying"]
    np.testing.assert_allclose(answer["compliance"], answer["ground_truth_compliance"],
                               rtol=1e-9)
    direct = sj.score_batch([sj.ScoreItem(rec3["ground_truth"], rec3["ground_truth"],
                                          rec3["input_grid"])], cache=optimum_cache)[0]
    np.testing.assert_allclose(answer["topology_score"], direct.topology_score, rtol=1e-12)
    assert empty["physically_valid"] and not empty["load_carrying"]
    assert empty["topology_score"] == 0.0
    assert not hostile["physically_valid"] and hostile["topology_score"] == 0.0
    agg = json.loads((tmp_path / "model" / "full_easy_3d_aggregated_results.json").read_text())
    assert agg["evaluated_samples"] == 3 and agg["optimum"] == "reference"
    np.testing.assert_allclose(agg["total_topology_score"],
                               sum(r["topology_score"] for r in out3), rtol=1e-12)
    out2 = json.loads((tmp_path / "model" / "full_easy_results.json").read_text())
    assert out2[0]["load_carrying"] and out2[0]["topology_score"] > 0.0


@pytest.mark.parametrize("cells,depth", [((3, 4, 5), 1), ((5, 6), 1), ((5, 7, 6), 2),
                                         ((9, 6), 2)])
def test_galerkin_coarse_operator_equals_the_global_product(rng, cells, depth):
    """The coarse element matrices formed as one product of constant tables with
    the fine moduli equal $P^T K P$ formed globally: the fine operator from
    matrix-free products on unit vectors, $P$ from prolonging unit coarse
    vectors level by level (odd sizes padded), with grey moduli."""
    grid = structured.get_grid(cells)
    levels = multigrid_levels.plan(cells, max_coarse_dofs=10**6, levels=depth)
    coarse = structured.get_grid(levels[depth].cells)
    moduli = EMIN + rng.random(cells + (1,))
    ones = jnp.ones((grid.n_dofs, 1))
    apply = jax.vmap(lambda v: structured.matvec(grid, jnp.asarray(moduli), ones,
                                                 v[:, None])[:, 0])
    fine = np.asarray(apply(jnp.asarray(np.eye(grid.n_dofs)))).T  # K

    def prolong(v):
        x = structured.to_lattice(coarse, v)
        for li in reversed(range(depth)):
            x = multigrid_levels.prolong(levels[li], x)
        return structured.from_lattice(grid, x)

    p = np.asarray(jax.vmap(prolong)(jnp.asarray(np.eye(coarse.n_dofs)))).T
    truth = p.T @ fine @ p
    kes = multigrid_levels.galerkin_from_fine(levels, depth, jnp.asarray(moduli))
    got = np.asarray(structured.assemble_dense(coarse, kes))[0]
    np.testing.assert_allclose(got, truth, rtol=1e-12, atol=1e-12 * np.abs(truth).max())
    if depth == 2:  # the level above's matrices, coarsened once more, give the same
        kes1 = multigrid_levels.galerkin_from_fine(levels, 1, jnp.asarray(moduli))
        again = multigrid_levels.coarse_element_matrices(levels[1], kes1)
        np.testing.assert_allclose(np.asarray(again), np.asarray(kes), rtol=1e-12,
                                   atol=1e-12 * np.abs(np.asarray(kes)).max())
