"""SPhyR-style 2D samples of any size for the scaling benchmarks.

A sample of side N mirrors the published generator's layout: a run of load
cells on the top row pushing down, two runs of support cells on the bottom row,
and a dataset answer that carries the load: a 0/1 design made by a short SIMP
run of our own (``sphyr_jax.optimize``, 60 iterations at p = 3) rounded to the
budget, with the load and support cells solid.  The input grid masks every
cell of rows 1 .. N-2 (SPhyR's ``full`` variant, the most design cells).
Answers are computed once per (N, count, seed) and kept under
``~/.cache/sphyr_jax/bench`` (``$SPHYR_JAX_BENCH_CACHE``), so timed runs never
include them.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

CACHE = pathlib.Path(os.environ.get("SPHYR_JAX_BENCH_CACHE",
                                    pathlib.Path.home() / ".cache" / "sphyr_jax" / "bench"))


def _layout(n: int, rng):
    """Token grid with L/S cells and a volume fraction."""
    grid = [["0"] * n for _ in range(n)]
    width = max(1, n // 5)
    c0 = int(rng.integers(0, n - width + 1))
    grid[0][c0:c0 + width] = ["L"] * width
    run = max(1, n // 5)
    grid[-1][:run] = ["S"] * run
    grid[-1][n - run:] = ["S"] * run
    return grid, float(rng.uniform(0.3, 0.5))


def _answers(n: int, count: int, seed: int) -> list[dict]:
    import sphyr_jax as sj
    from sphyr_jax.problem.loadcase import with_budget
    from sphyr_jax.topopt.budget import binarize, free_budget

    sj.enable_x64()
    rng = np.random.default_rng(seed)
    layouts = [_layout(n, rng) for _ in range(count)]
    cases = []
    for grid, vf in layouts:
        masked = [["V" if 0 < r < n - 1 and t == "0" else t for t in row]
                  for r, row in enumerate(grid)]
        cases.append(with_budget(sj.load_case_from_grid(grid, masked), vf))
    batch = sj.stack_load_cases(cases)
    res = sj.optimize(batch, penal=3.0, options=sj.SimpOptions(max_iterations=60))
    free, _ = free_budget(batch.design_mask, batch.pinned, batch.volume_fraction, ndim=2)
    design = np.asarray(binarize(res.densities, batch.design_mask, batch.pinned, free))
    out = []
    for (grid, _), rho in zip(layouts, design, strict=True):
        answer = [[t if t in ("L", "S") else str(int(v)) for t, v in zip(row, vals, strict=True)]
                  for row, vals in zip(grid, rho, strict=True)]
        masked = [["V" if 0 < r < n - 1 and t not in ("L", "S") else t for t in row]
                  for r, row in enumerate(answer)]
        out.append({"ground_truth": answer, "input_grid": masked})
    return out


def samples(n: int, count: int, seed: int = 0) -> list[dict]:
    """``count`` records ``{"ground_truth", "input_grid"}`` (token grids) of side ``n``."""
    path = CACHE / f"scaling_{n}_{count}_{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    records = _answers(n, count, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return records
