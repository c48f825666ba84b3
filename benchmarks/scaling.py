"""How the cost grows with the grid: sphyr_jax beside the reference method and SciPy.

For each side N (default 10, 20, 30, 40, 60), in a fresh process of its own (so
its peak resident memory is its own), on SPhyR-style full-mask samples of that
size (``benchmarks/scaling_problems.py``: a load run on the top row, supports
on the bottom row, a 0/1 answer, rows 1 .. N-2 masked), all in the same run:

* **metric per sample**: ``sj.get_structural_metrics`` of one completion (the
  answer with two cells flipped) on a new sample in a warm process (its
  optimum included, a fresh optimum cache), median over ``--samples``; beside
  the reference method, ``benchmarks/reference_method.py`` (the published
  recipe in NumPy/SciPy, a sparse assembly and ``spsolve`` per solve), median
  over ``--reference_samples``;
* **score_batch per sample**: the completions (made the same way) of
  ``--batch_samples`` new samples scored in one ``sj.score_batch`` call (warm:
  a batch of the same size on other samples ran first), divided by the count;
* **compliance, batch 64**: ``sj.compliance`` of 64 designs (the answers,
  tiled; the default solver for the size) in one call, warm median, beside an
  assembly + ``scipy.sparse.linalg.spsolve`` of the same systems one at a time,
  and every 2D method (the banded Cholesky by LAPACK on the host and as XLA
  loops, and the multigrid CG, each timed), which measures the crossovers the
  default solver follows;
* **peak RSS** of the process after the metric alone, and after the entry
  points a user calls (the metric, ``score_batch`` and ``sj.compliance``),
  before the other methods of the crossover columns compile.  The samples
  are drawn and cached by a process of their own first (each is a SIMP run),
  so the figure is the scorer's.

Usage::

    python benchmarks/scaling.py [--sizes 10,20,30,40,60] [--samples 4]
        [--reference_samples 2] [--batch_samples 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).resolve().parent
for path in (str(REPO), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)


def _flip(answer, input_grid, k: int = 2, seed: int = 0):
    """The answer with ``k`` masked cells flipped (a plausible completion)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cells = [(r, c) for r, row in enumerate(input_grid) for c, t in enumerate(row) if t == "V"]
    out = [list(row) for row in answer]
    for i in rng.choice(len(cells), size=min(k, len(cells)), replace=False):
        r, c = cells[i]
        out[r][c] = "0" if out[r][c] == "1" else "1"
    return out


def sample_count(samples: int, batch_samples: int) -> int:
    """Samples one size draws: the metric's and ``score_batch``'s, each with a warm-up."""
    return 2 * max(samples, batch_samples) + 1


def one_size(n: int, samples: int, reference_samples: int, batch_samples: int) -> dict:
    """All figures of one grid size (run in a fresh process)."""
    import jax
    import numpy as np
    import reference_method
    from fea_throughput import SparseBaseline
    from scaling_problems import samples as make_samples

    import sphyr_jax as sj
    from sphyr_jax.fem.solvers import Banded, Multigrid, default_solver
    from sphyr_jax.fem.structured import get_grid

    sj.enable_x64()
    records = make_samples(n, sample_count(samples, batch_samples))
    completions = [_flip(r["ground_truth"], r["input_grid"], seed=i)
                   for i, r in enumerate(records)]
    items = [sj.ScoreItem(c, r["ground_truth"], r["input_grid"])
             for c, r in zip(completions, records, strict=True)]
    solver = default_solver((n, n))
    out = {"n": n, "solver": solver.label(get_grid((n, n)))}

    # Metric per sample: a warm-up sample compiles, then new samples one at a time.
    t0 = time.perf_counter()
    sj.get_structural_metrics(items[0].completion, items[0].ground_truth, items[0].input_grid,
                              cache=sj.OptimumCache())
    out["metric_first_s"] = time.perf_counter() - t0
    times, ours = [], []
    for item in items[1: samples + 1]:
        t0 = time.perf_counter()
        m = sj.get_structural_metrics(item.completion, item.ground_truth, item.input_grid,
                                      cache=sj.OptimumCache())
        times.append(time.perf_counter() - t0)
        ours.append(m)
    out["metric_s"] = statistics.median(times)
    out["peak_rss_metric_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    # The reference method, same completions.
    ref_times, ref = [], []
    for item, m in zip(items[1: reference_samples + 1], ours, strict=False):
        case = sj.load_case_from_grid(item.ground_truth, item.input_grid)
        rho, _ = sj.densities_from_grid(item.completion)
        rho[np.asarray(case.load_mask | case.support_mask)] = 1.0
        t0 = time.perf_counter()
        ref.append(reference_method.score_record(rho, jax.tree.map(np.asarray, case)))
        ref_times.append(time.perf_counter() - t0)
        out.setdefault("topology_score_diff", 0.0)
        out["topology_score_diff"] = max(out["topology_score_diff"],
                                         abs(ref[-1]["topology_score"] - m.topology_score))
    out["reference_metric_s"] = statistics.median(ref_times) if ref_times else None

    # score_batch per sample: warm-up on other samples of the same batch size.
    batch = items[1: batch_samples + 1]
    sj.score_batch(items[batch_samples + 1: 2 * batch_samples + 1], cache=sj.OptimumCache())
    t0 = time.perf_counter()
    sj.score_batch(batch, cache=sj.OptimumCache())
    out["score_batch_s_per_sample"] = (time.perf_counter() - t0) / len(batch)
    out["batch_samples"] = len(batch)
    out["peak_rss_score_batch_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    # Batch-64 compliance beside SciPy.
    cases = [sj.load_case_from_grid(r["ground_truth"], r["input_grid"]) for r in records]
    rho = np.stack([sj.densities_from_grid(r["ground_truth"])[0] for r in records])
    idx = np.arange(64) % len(cases)
    batch = sj.stack_load_cases([cases[i] for i in idx])
    designs = rho[idx]
    t0 = time.perf_counter()
    c = np.asarray(sj.compliance(batch, designs))
    out["compliance_first_s"] = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(sj.compliance(batch, designs))
        times.append(time.perf_counter() - t0)
    out["compliance_ms_per_solve"] = statistics.median(times) / 64 * 1e3
    # Peak memory of what a user runs (before the other methods compile).
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    methods = {"lapack": Banded(lapack=True), "xla_banded": Banded(lapack=False),
               "multigrid": Multigrid()}
    for name, solver in methods.items():
        sj.compliance(batch, designs, solver=solver)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            jax.block_until_ready(sj.compliance(batch, designs, solver=solver))
            times.append(time.perf_counter() - t0)
        out[f"{name}_ms_per_solve"] = statistics.median(times) / 64 * 1e3
    baseline = SparseBaseline((n, n))
    times, diff = [], 0.0
    for i in range(min(8, len(cases))):
        free = np.asarray(cases[i].free_dofs, bool)
        force = np.asarray(cases[i].force)
        t0 = time.perf_counter()
        c_scipy = baseline.compliance(rho[i], force, free)
        times.append(time.perf_counter() - t0)
        diff = max(diff, abs(c_scipy / c[i] - 1))
    out["scipy_ms_per_solve"] = statistics.median(times) * 1e3
    out["compliance_max_rel_diff"] = diff
    return out


def _table(rows: list[dict]) -> str:
    lines = [
        "| N | metric / sample | reference | ratio | score_batch / sample | ratio | "
        "compliance b64, ms / solve | SciPy | ratio | LAPACK / XLA banded / multigrid | "
        "peak RSS: metric / all |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = r["reference_metric_s"]
        metric, batched = r["metric_s"], r["score_batch_s_per_sample"]
        ref_s = "" if ref is None else f"{ref:.1f} s"
        ratio = "" if ref is None else f"{ref / metric:.1f}x"
        ratio_batched = "" if ref is None else f"{ref / batched:.1f}x"
        lines.append(
            f"| {r['n']} | {metric:.2f} s | {ref_s} | {ratio} | {batched:.2f} s | "
            f"{ratio_batched} | "
            f"{r['compliance_ms_per_solve']:.2f} ({r['solver']}) | "
            f"{r['scipy_ms_per_solve']:.2f} | "
            f"{r['scipy_ms_per_solve'] / r['compliance_ms_per_solve']:.1f}x | "
            f"{r['lapack_ms_per_solve']:.2f} / {r['xla_banded_ms_per_solve']:.2f} / "
            f"{r['multigrid_ms_per_solve']:.2f} | "
            f"{r['peak_rss_metric_mb']:.0f} / {r['peak_rss_mb']:.0f} MB |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,20,30,40,60")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--reference_samples", type=int, default=2)
    parser.add_argument("--batch_samples", type=int, default=16)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None and args.prepare:
        from scaling_problems import samples as make_samples

        make_samples(args.one, sample_count(args.samples, args.batch_samples))
        return 0
    if args.one is not None:
        print(json.dumps(one_size(args.one, args.samples, args.reference_samples,
                                  args.batch_samples)))
        return 0
    rows = []
    for n in (int(v) for v in args.sizes.split(",")):
        common = [sys.executable, __file__, "--one", str(n), "--samples", str(args.samples),
                  "--batch_samples", str(args.batch_samples)]
        # The samples are drawn (a SIMP run each, gigabytes at 60x60) and cached
        # in a process of their own, so the measuring process's peak memory is
        # the scorer's.
        proc = subprocess.run(common + ["--prepare"], capture_output=True, text=True, cwd=REPO)
        if proc.returncode == 0:
            proc = subprocess.run(common + ["--reference_samples", str(args.reference_samples)],
                                  capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
