"""Cost of the voxel yardstick (the optimum of SPhyR-3D samples): seconds per sample, peak memory.

Builds ``full_hard_3d`` problems (every voxel of the interior layers a design
cell, the hard answer pinned elsewhere and as the budget) from the shared
SPhyR-3D CSVs (``../shared/sphyr_reference/raw_data_3d``), else from the
embedded ``sphyr_jax/data/sets/dataset_3d/raw``, and computes their optima with
:func:`sphyr_jax.topopt.optimum.optimum_batch` (the reference recipe with the voxel
settings: six SIMP runs of up to 100 iterations in a pool of two slots per
sample, every candidate and rounding scored, no polish) on the local default
device:

* the first call of one sample in this process (compilation included; run
  with an empty compilation cache for a cold figure);
* warm calls of one sample (median over samples) and of the whole batch
  (seconds per sample);
* the process's peak resident memory after each stage;
* the SIMP iterations per sample, and what the same number of solves would
  cost at the per-solve time of an assembly + SciPy ``spsolve`` of those
  systems measured in this run (a lower bound for a NumPy/SciPy SIMP; no
  3D reference implementation exists).

Every optimum is checked to be at least as stiff as its answer.

Usage::

    python benchmarks/optimum3d.py [--samples 16] [--single 3]
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import statistics
import sys
import time

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
SETS = REPO / "sphyr_jax" / "data" / "sets"  # the embedded sets (sphyr_jax.data.embedded)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from record import write_record  # noqa: E402  (benchmarks/, the script's folder)

import sphyr_jax  # noqa: E402
from benchmarks.fea3d_throughput import scipy_compliance  # noqa: E402
from sphyr_jax.data.convert import list_raw_files, mask_grid_3d, read_raw_csv_3d  # noqa: E402
from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases  # noqa: E402
from sphyr_jax.topopt.optimum import optimum_batch  # noqa: E402

SHARED_RAW = REPO.parent / "shared" / "sphyr_reference" / "raw_data_3d"
EMBEDDED_RAW = SETS / "dataset_3d" / "raw"


def peak_mb() -> float:
    """Peak resident memory of this process so far, MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load_cases(limit: int):
    folder = SHARED_RAW if SHARED_RAW.is_dir() and any(SHARED_RAW.glob("*_SPhyR_3D.csv")) \
        else EMBEDDED_RAW
    files = list_raw_files(folder, dim=3)[:limit]
    cases = []
    for path in files:
        gt = read_raw_csv_3d(path).grid("hard")
        cases.append(load_case_from_grid(gt, mask_grid_3d(gt, "full", None), ndim=3))
    return cases, f"{len(files)} samples of {folder.name}/"


def scipy_seconds_per_solve(case, rho) -> float:
    """Median seconds of an assembly + spsolve of one of these systems."""
    e = 1e-9 + rho ** 3 * (1 - 1e-9)
    force = np.asarray(case.force)
    free = np.asarray(case.free_dofs, np.float64)
    return statistics.median(scipy_compliance(e, force, free)[1] for _ in range(3))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16, help="samples in the batch")
    parser.add_argument("--single", type=int, default=3, help="warm one-sample calls")
    parser.add_argument("--json", default=None, help="also write the run's results file here")
    args = parser.parse_args()
    sphyr_jax.enable_x64()
    sphyr_jax.enable_compilation_cache()
    cases, source = load_cases(args.samples)
    batch = stack_load_cases(cases)
    n = len(cases)
    print(f"voxel yardstick on {source}, device {jax.devices()[0].platform}")
    print(f"peak RSS after loading: {peak_mb():.0f} MB")

    one = jax.tree.map(lambda a: a[:1], batch)
    t = time.perf_counter()
    optimum_batch(one)
    first = time.perf_counter() - t
    print(f"first call, one sample (compilation included): {first:.1f} s; "
          f"peak RSS {peak_mb():.0f} MB")

    singles = []
    for i in range(min(args.single, n)):
        case = jax.tree.map(lambda a, i=i: a[i:i + 1], batch)
        t = time.perf_counter()
        optimum_batch(case)
        singles.append(time.perf_counter() - t)
    print(f"warm, one sample: median {statistics.median(singles):.1f} s "
          f"({', '.join(f'{s:.1f}' for s in singles)}); peak RSS {peak_mb():.0f} MB")

    t = time.perf_counter()
    res = optimum_batch(batch)  # a new bucket compiles inside this call
    total = time.perf_counter() - t
    t = time.perf_counter()
    res = optimum_batch(batch)
    warm = time.perf_counter() - t
    print(f"batch of {n}: first {total:.1f} s, warm {warm:.1f} s = {warm / n:.2f} s/sample; "
          f"peak RSS {peak_mb():.0f} MB")

    answers = np.asarray(sphyr_jax.compliance(batch, np.asarray(batch.pinned)))
    opt = np.asarray(res.compliance)
    assert np.all(opt <= answers * (1 + 1e-9)), "an optimum is weaker than its answer"
    its = np.asarray(res.iterations)
    print(f"optimum / answer compliance: mean {np.mean(opt / answers):.4f}, "
          f"min {np.min(opt / answers):.4f}; SIMP iterations per sample: median "
          f"{int(np.median(its))} (min {its.min()}, max {its.max()})")
    per_solve = scipy_seconds_per_solve(cases[0], np.asarray(res.densities[0]))
    print(f"SciPy assembly + spsolve: {1e3 * per_solve:.0f} ms per solve; the median "
          f"sample's {int(np.median(its))} SIMP solves would take "
          f"{per_solve * np.median(its):.1f} s with SciPy alone "
          f"({per_solve * np.median(its) / (warm / n):.1f}x the batched yardstick)")
    figures = {"samples": n, "first_call_s": first,
               "warm_single_median_s": statistics.median(singles),
               "batch_first_s": total, "batch_warm_s_per_sample": warm / n,
               "peak_rss_mb": peak_mb(), "optimum_over_answer_mean": float(np.mean(opt / answers)),
               "optimum_over_answer_min": float(np.min(opt / answers)),
               "simp_iterations_median": int(np.median(its)), "scipy_s_per_solve": per_solve}
    write_record(args.json, "optimum3d", title="The voxel yardstick", anchor="optimum3d",
                 figures=figures, notes=[f"Voxel yardstick on {source}."])


if __name__ == "__main__":
    main()
