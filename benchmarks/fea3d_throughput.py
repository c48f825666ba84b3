"""Batched 3D (H8 voxel) compliance throughput: multigrid-preconditioned CG vs SciPy.

Solves the converted SPhyR-3D answers (easy and hard ground truths of
``../shared/sphyr_reference/raw_data_3d``, else of the embedded
``sphyr_jax/data/sets/dataset_3d/raw``, else random 0/1 voxel designs), tiled to each batch
size, with one :func:`sphyr_jax.compliance` call per batch (the multigrid CG
solver, :class:`sphyr_jax.Multigrid`) on the local default device; reports the
median of warm repetitions (compile time separately) next to an assembly +
``scipy.sparse.linalg.spsolve`` of the same systems (prebuilt COO indices ->
CSC, the free-DOF block, one sample at a time).  SciPy is timed on up to
``--scipy_samples`` distinct samples per run and its per-solve time applied to
the batch (it has no batching).  Both give the same compliances (maximum
relative difference printed and checked).

Usage::

    python benchmarks/fea3d_throughput.py [--batches 1,16,64] [--repeats 5] [--tol 1e-10]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

REPO = pathlib.Path(__file__).resolve().parents[1]
SETS = REPO / "sphyr_jax" / "data" / "sets"  # the embedded sets (sphyr_jax.data.embedded)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from record import table, write_record  # noqa: E402  (benchmarks/, the script's folder)

import sphyr_jax  # noqa: E402
from sphyr_jax.data.convert import list_raw_files, read_raw_csv_3d  # noqa: E402
from sphyr_jax.fem import structured  # noqa: E402
from sphyr_jax.fem.solvers import Multigrid  # noqa: E402
from sphyr_jax.problem.grids import densities_from_grid  # noqa: E402
from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases  # noqa: E402

SHARED_RAW = REPO.parent / "shared" / "sphyr_reference" / "raw_data_3d"
EMBEDDED_RAW = SETS / "dataset_3d" / "raw"
AGREEMENT_RTOL = 1e-8


def problems(seed: int = 0):
    """(load cases (N), densities (N,10,10,10), moduli (10,10,10,N), force (n,N),
    free (n,N), source description)."""
    for folder in (SHARED_RAW, EMBEDDED_RAW):
        if folder.is_dir() and any(folder.glob("*_SPhyR_3D.csv")):
            samples = [read_raw_csv_3d(p) for p in list_raw_files(folder, dim=3)]
            grids = [s.grid(level) for s in samples for level in ("easy", "hard")]
            source = f"{len(grids)} converted answers of {folder.name}/"
            break
    else:
        rng = np.random.default_rng(seed)
        grids = []
        for _ in range(16):
            g = np.where(rng.random((10, 10, 10)) < 0.6, "1", "0").astype(object)
            g[0, 3:7, 3:7] = "L"
            g[-1, 1:9, 1:9] = "S"
            grids.append(g.tolist())
        source = "16 random 0/1 voxel designs"
    cases = [load_case_from_grid(g) for g in grids]
    rho = np.stack([densities_from_grid(g)[0] for g in grids], -1)
    moduli = np.asarray(sphyr_jax.simp_moduli(jnp.asarray(rho)))
    force = np.stack([c.force for c in cases], -1)
    free = np.stack([c.free_dofs for c in cases], -1).astype(np.float64)
    return stack_load_cases(cases), np.moveaxis(rho, -1, 0), moduli, force, free, source


def scipy_compliance(moduli, force, free):
    """Assemble + spsolve one sample; returns (compliance, seconds)."""
    grid = structured.get_grid(moduli.shape)
    edofs = structured.element_dofs(grid)
    ke = grid.element.ke
    rows = np.repeat(edofs, 24, axis=1).ravel()
    cols = np.tile(edofs, 24).ravel()
    fr = np.flatnonzero(free > 0)
    t0 = time.perf_counter()
    vals = (moduli.reshape(-1)[:, None, None] * ke[None]).ravel()
    k = scipy.sparse.coo_matrix((vals, (rows, cols)), shape=(grid.n_dofs,) * 2).tocsc()
    u = scipy.sparse.linalg.spsolve(k[fr][:, fr], force[fr])
    c = float(force[fr] @ u)
    return c, time.perf_counter() - t0


def tile(a, batch):
    reps = -(-batch // a.shape[-1])
    return np.concatenate([a] * reps, axis=-1)[..., :batch]


def run(batches=(1, 16, 64), repeats=5, tol=1e-10, scipy_samples=8, **mg_options):
    """Print and return the table; ``mg_options`` go to :class:`sphyr_jax.Multigrid`."""
    sphyr_jax.enable_x64()
    cases, rho, moduli, force, free, source = problems()
    solver = Multigrid(tol=tol, **mg_options)
    n = moduli.shape[-1]
    ref, t_scipy = [], []
    for i in range(min(scipy_samples, n)):
        c, dt = scipy_compliance(moduli[..., i], force[:, i], free[:, i])
        ref.append(c)
        t_scipy.append(dt)
    per_scipy = statistics.median(t_scipy)
    print(f"device {jax.devices()[0].device_kind}, {source}; {solver}; SciPy "
          f"{per_scipy * 1e3:.0f} ms per assemble + spsolve (median of {len(t_scipy)})")
    print(f"{'batch':>6} {'compile s':>10} {'MG-CG solves/s':>15} {'iters (med/max)':>16} "
          f"{'SciPy solves/s':>15} {'speed-up':>9} {'max rel diff':>13}")
    rows = []
    for batch in batches:
        idx = np.arange(batch) % n
        case_b = jax.tree.map(lambda a, idx=idx: np.asarray(a)[idx], cases)
        rho_b = rho[idx]
        t0 = time.perf_counter()
        c = sphyr_jax.compliance(case_b, rho_b, solver=solver)
        c.block_until_ready()
        compile_s = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            c = sphyr_jax.compliance(case_b, rho_b, solver=solver)
            c.block_until_ready()
            times.append(time.perf_counter() - t0)
        rate = batch / statistics.median(times)
        sol = sphyr_jax.solve(case_b, rho_b, solver=solver)  # iterations (not timed)
        c = np.asarray(c)
        k = min(batch, len(ref))
        diff = float(np.max(np.abs(c[:k] / np.asarray(tile(np.array(ref), batch)[:k]) - 1)))
        if diff > AGREEMENT_RTOL or not bool(np.all(sol.converged)):
            raise SystemExit(f"disagreement with SciPy: {diff:.2e}, results {sol.result}")
        its = np.asarray(sol.iterations)
        row = (batch, compile_s, rate, int(np.median(its)), int(its.max()), 1 / per_scipy,
               rate * per_scipy, diff)
        rows.append(row)
        print(f"{row[0]:>6} {row[1]:>10.1f} {row[2]:>15.1f} {row[3]:>8}/{row[4]:<7} "
              f"{row[5]:>15.2f} {row[6]:>8.1f}x {row[7]:>13.1e}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tol", type=float, default=1e-10)
    parser.add_argument("--scipy_samples", type=int, default=8)
    parser.add_argument("--smooth", type=int, default=Multigrid.smooth)
    parser.add_argument("--omega", type=float, default=Multigrid.omega)
    parser.add_argument("--max_coarse_dofs", type=int, default=Multigrid.max_coarse_dofs)
    parser.add_argument("--json", default=None, help="also write the run's results file here")
    args = parser.parse_args()
    rows = run(tuple(int(b) for b in args.batches.split(",")), args.repeats, args.tol,
               args.scipy_samples, smooth=args.smooth, omega=args.omega,
               max_coarse_dofs=args.max_coarse_dofs)
    columns = ("batch", "compile s", "multigrid CG solves/s", "iterations (median)",
               "iterations (max)", "SciPy solves/s", "ratio", "max relative difference")
    write_record(args.json, "fea3d_throughput", title="SPhyR-3D compliance throughput",
                 anchor="fea3d", figures=[dict(zip(columns, row, strict=True)) for row in rows],
                 tables=[table(columns, [(r[0], f"{r[1]:.1f}", f"{r[2]:.1f}", r[3], r[4],
                                          f"{r[5]:.2f}", f"{r[6]:.1f}x", f"{r[7]:.1e}")
                                         for r in rows])])


if __name__ == "__main__":
    main()
