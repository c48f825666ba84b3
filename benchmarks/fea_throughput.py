"""Batched compliance throughput of sphyr_jax against a plain SciPy baseline.

Solves the 100 ground truths of the stored GPT-4o ``full_easy`` results (random
designs if the reference data is absent), tiled to each batch size, with one
compiled ``sphyr_jax.compliance`` call per batch on the local default device.
Reports the median of several warm repetitions (compile time separately) next
to the reference implementation's method: prebuilt assembly indices, COO -> CSC
assembly and ``scipy.sparse.linalg.spsolve`` on the free DOFs, one sample at a
time.  Both give the same compliances (the maximum relative difference is
printed and checked).

Usage::

    python benchmarks/fea_throughput.py [--batches 1,64,1024] [--solver banded] [--repeats 7]

Other entry points can ``from benchmarks.fea_throughput import run``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(REPO))

import sphyr_jax  # noqa: E402
from sphyr_jax.fem import elements, fea, structured  # noqa: E402
from sphyr_jax.problem.grids import densities_from_grid  # noqa: E402
from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases  # noqa: E402

DEFAULT_DATA = (REPO.parent / "shared" / "sphyr_reference" / "results" / "gpt-4o-2024-08-06"
                / "full_easy_results.json")
DEFAULT_BATCHES = (1, 64, 1024)
AGREEMENT_RTOL = 1e-6  # DESIGN.md: agreement with the reference implementation


# ----------------------------------------------------------------------------
# Problems.


def _random_grids(n: int, seed: int, shape=(10, 10)) -> list[list[list[str]]]:
    """Random hard-style designs (densities 0.1..1.0) loaded on top, supported below.

    Densities stay above 0.1 so every design is well posed for every solver
    (CG included); the stored ground truths are used whenever available.
    """
    rng = np.random.default_rng(seed)
    nely, nelx = shape
    grids = []
    for _ in range(n):
        grid = [[f"{rng.integers(1, 11) / 10:.1f}" for _ in range(nelx)] for _ in range(nely)]
        a, b = sorted(rng.choice(nelx + 1, size=2, replace=False))
        for c in range(a, b):
            grid[0][c] = "L"
        a, b = sorted(rng.choice(nelx + 1, size=2, replace=False))
        for c in range(a, b):
            grid[-1][c] = "S"
        grids.append(grid)
    return grids


def load_problems(data_path=None, n_random: int = 100, seed: int = 0):
    """Load cases and densities of the benchmark samples.

    Args:
        data_path: a results file with ``ground_truth`` records; defaults to the
            stored GPT-4o ``full_easy`` results, falling back to random designs.
        n_random: number of random designs when no data is available.
        seed: seed of the random designs.

    Returns:
        (stacked LoadCase, densities (N, nely, nelx), description of the source).
    """
    path = pathlib.Path(data_path) if data_path else DEFAULT_DATA
    if path.exists():
        grids = [rec["ground_truth"] for rec in json.loads(path.read_text())]
        source = f"{len(grids)} ground truths of {path.parent.name}/{path.name}"
    else:
        grids = _random_grids(n_random, seed)
        source = f"{len(grids)} random designs (no data at {path})"
    cases, designs = [], []
    for grid in grids:
        case = load_case_from_grid(grid)
        dens, _ = densities_from_grid(grid)
        dens[np.asarray(case.load_mask | case.support_mask)] = 1.0
        cases.append(case)
        designs.append(dens)
    return stack_load_cases(cases), np.stack(designs), source


# ----------------------------------------------------------------------------
# SciPy baseline (the reference implementation's method).


class SparseBaseline:
    """COO -> CSC assembly and ``spsolve`` on the free DOFs, one sample at a time."""

    def __init__(self, shape, penal: float = 3.0):
        grid = structured.get_grid(tuple(shape))
        self.n = grid.n_dofs
        self.ke = elements.element_stiffness(2).ravel()
        edofs = structured.element_dofs(grid)
        self.i_k = np.kron(edofs, np.ones((8, 1), dtype=np.int64)).ravel()
        self.j_k = np.kron(edofs, np.ones((1, 8), dtype=np.int64)).ravel()
        self.penal = penal

    def compliance(self, densities: np.ndarray, force: np.ndarray, free: np.ndarray) -> float:
        rho = np.clip(densities.ravel(), 0.0, 1.0)
        moduli = elements.EMIN + rho**self.penal * (elements.E0 - elements.EMIN)
        values = (self.ke[None, :] * moduli[:, None]).ravel()
        k = scipy.sparse.coo_matrix((values, (self.i_k, self.j_k)),
                                    shape=(self.n, self.n)).tocsc()
        k_free = k[free][:, free]
        u = scipy.sparse.linalg.spsolve(k_free, force[free])
        c = float(force[free] @ u)
        return c if np.isfinite(c) and c >= 0 else float("inf")


def _time_baseline(baseline, designs, forces, frees, repeats):
    times, values = [], None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = [baseline.compliance(d, f, fr) for d, f, fr in zip(designs, forces, frees,
                                                                  strict=True)]
        times.append(time.perf_counter() - t0)
        values = np.array(out)
    return values, statistics.median(times)


# ----------------------------------------------------------------------------
# Benchmark.


def _max_rel_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    diff = np.where(both_inf, 0.0, np.abs(a - b) / np.maximum(np.abs(b), 1e-300))
    return float(np.max(diff)) if diff.size else 0.0


def run(batches=DEFAULT_BATCHES, solver: str = "banded", repeats: int = 7,
        data_path=None, baseline_repeats: int = 3, seed: int = 0) -> dict:
    """Measure batched compliance throughput and compare with the SciPy baseline.

    Args:
        batches: batch sizes to time (samples are tiled cyclically to each size).
        solver: ``"banded"``, ``"dense"`` or ``"cg"``.
        repeats: warm repetitions per batch size (the median is reported).
        data_path: results file with ``ground_truth`` records (default: stored
            GPT-4o full_easy results, else random designs).
        baseline_repeats: passes over the samples for the SciPy baseline.
        seed: seed of the random fallback designs.

    Returns:
        A JSON-serialisable dict: device, solver, source, baseline figures and
        one entry per batch size (compile seconds, median seconds per call,
        solves per second, ratio to the baseline, max relative difference).
    """
    sphyr_jax.enable_x64()
    cases, designs, source = load_problems(data_path, seed=seed)
    n = designs.shape[0]
    forces = np.asarray(cases.force)
    frees = np.asarray(cases.free_dofs)

    baseline = SparseBaseline(designs.shape[1:])
    base_c, base_s = _time_baseline(baseline, designs, forces, frees, baseline_repeats)
    base_rate = n / base_s

    fn = jax.jit(fea.compliance, static_argnames=("solver",))
    vmapped = jax.jit(jax.vmap(lambda c, d: fea.compliance(c, d, solver=solver)))
    results = []
    for batch in batches:
        idx = np.arange(batch) % n
        case_b = jax.device_put(jax.tree.map(lambda x, i=idx: np.asarray(x)[i], cases))
        dens_b = jax.device_put(designs[idx])
        t0 = time.perf_counter()
        compiled = fn.lower(case_b, dens_b, solver=solver).compile()
        compile_s = time.perf_counter() - t0
        out = jax.block_until_ready(compiled(case_b, dens_b))  # warm-up
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            out = jax.block_until_ready(compiled(case_b, dens_b))
            times.append(time.perf_counter() - t0)
        median_s = statistics.median(times)
        rate = batch / median_s
        # The same batch through a user's jax.jit(jax.vmap(sj.compliance)).
        v_compiled = vmapped.lower(case_b, dens_b).compile()
        v_out = jax.block_until_ready(v_compiled(case_b, dens_b))
        v_times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            jax.block_until_ready(v_compiled(case_b, dens_b))
            v_times.append(time.perf_counter() - t0)
        v_rate = batch / statistics.median(v_times)
        results.append({
            "batch": int(batch),
            "compile_s": compile_s,
            "median_s": median_s,
            "solves_per_s": rate,
            "ratio_to_baseline": rate / base_rate,
            "max_rel_diff": max(_max_rel_diff(np.asarray(out), base_c[idx]),
                                _max_rel_diff(np.asarray(v_out), base_c[idx])),
            "vmap_solves_per_s": v_rate,
            "vmap_ratio_to_baseline": v_rate / base_rate,
        })
    return {
        "device": str(jax.devices()[0]),
        "backend": jax.default_backend(),
        "solver": solver,
        "repeats": int(repeats),
        "source": source,
        "n_samples": int(n),
        "baseline": {
            "method": "scipy.sparse coo->csc + spsolve on free DOFs, one sample at a time",
            "seconds_per_pass": base_s,
            "solves_per_s": base_rate,
        },
        "batches": results,
        "derivatives": derivative_costs(cases, designs, solver, repeats),
        "max_rel_diff": max(r["max_rel_diff"] for r in results) if results else 0.0,
    }


def derivative_costs(cases, designs, solver: str = "banded", repeats: int = 7,
                     batch: int = 64) -> dict:
    """Seconds of a JVP, a gradient and a Hessian-vector product of compliance,
    relative to the compliance itself, on one batch (each jitted, warm)."""
    idx = np.arange(batch) % designs.shape[0]
    case_b = jax.device_put(jax.tree.map(lambda x: np.asarray(x)[idx], cases))
    x = jax.device_put(0.1 + 0.8 * designs[idx])
    v = jax.device_put(np.random.default_rng(0).standard_normal(x.shape))
    total = lambda z: jax.numpy.sum(fea.compliance(case_b, z, solver=solver))  # noqa: E731
    programs = {
        "compliance": jax.jit(lambda z, t: fea.compliance(case_b, z, solver=solver)),
        "jvp": jax.jit(lambda z, t: jax.jvp(total, (z,), (t,))),
        "grad": jax.jit(lambda z, t: jax.value_and_grad(total)(z)),
        "hvp": jax.jit(lambda z, t: jax.jvp(jax.grad(total), (z,), (t,))),
        "solve jvp": jax.jit(lambda z, t: jax.jvp(
            lambda y: fea.solve(case_b, y, solver=solver).displacements, (z,), (t,))),
    }
    seconds = {}
    for name, prog in programs.items():
        jax.block_until_ready(prog(x, v))
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            jax.block_until_ready(prog(x, v))
            times.append(time.perf_counter() - t0)
        seconds[name] = statistics.median(times)
    base = seconds["compliance"]
    return {"batch": batch, "seconds": seconds,
            "relative": {k: s / base for k, s in seconds.items()}}


def format_report(report: dict) -> str:
    """A human-readable table of a :func:`run` report."""
    lines = [
        f"device: {report['device']} ({report['backend']}), solver: {report['solver']}, "
        f"median of {report['repeats']} warm repetitions",
        f"samples: {report['source']}",
        f"baseline ({report['baseline']['method']}): "
        f"{report['baseline']['solves_per_s']:,.0f} solves/s",
        "",
        f"{'batch':>6} {'compile s':>10} {'call ms':>10} {'solves/s':>12} "
        f"{'x baseline':>11} {'vmap solves/s':>14} {'x baseline':>11} {'max rel diff':>13}",
    ]
    for r in report["batches"]:
        lines.append(
            f"{r['batch']:>6} {r['compile_s']:>10.2f} {1e3 * r['median_s']:>10.3f} "
            f"{r['solves_per_s']:>12,.0f} {r['ratio_to_baseline']:>11.2f} "
            f"{r['vmap_solves_per_s']:>14,.0f} {r['vmap_ratio_to_baseline']:>11.2f} "
            f"{r['max_rel_diff']:>13.2e}"
        )
    der = report.get("derivatives")
    if der:
        lines.append("")
        lines.append(f"derivatives at batch {der['batch']} (time relative to compliance): "
                     + ", ".join(f"{k} {v:.2f}x" for k, v in der["relative"].items()))
    ok = report["max_rel_diff"] <= AGREEMENT_RTOL
    lines.append("")
    lines.append(f"results agree with the baseline: {'yes' if ok else 'NO'} "
                 f"(max relative difference {report['max_rel_diff']:.2e}, "
                 f"tolerance {AGREEMENT_RTOL:g})")
    return "\n".join(lines)


def _parse_batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"batches must be integers, got {text!r}") from exc
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError("batches must be positive integers")
    return batches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=_parse_batches, default=DEFAULT_BATCHES,
                        help="comma-separated batch sizes (default: 1,64,1024)")
    parser.add_argument("--solver", choices=("banded", "dense", "cg"), default="banded")
    parser.add_argument("--repeats", type=int, default=7,
                        help="warm repetitions per batch size (median reported)")
    parser.add_argument("--data", default=None, help="results file with ground truths")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = run(args.batches, solver=args.solver, repeats=args.repeats, data_path=args.data)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["max_rel_diff"] <= AGREEMENT_RTOL else 1


if __name__ == "__main__":
    sys.exit(main())
