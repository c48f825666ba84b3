"""The share of scoring time spent on the static (grid-only) metrics.

Builds N records (default 10,000) from the stored completions (GPT-4o
``full_easy`` and Claude 3.7 Sonnet ``10_random_cell_hard``, 200 records),
each copy with a few of its completion's cells redrawn so no two completions
are the same text, then times, in one process and on the same records:

* the static metrics alone: :func:`sphyr_jax.static_metrics_batch`;
* the whole scoring a results file gets: :func:`sphyr_jax.score_records`
  (physics with the reference optima cached, plus the static metrics);
* the physics alone: :func:`sphyr_jax.score_batch` (``static=False``).

The optima are computed once before the timed runs (an optimum cache in
``--cache_dir``, a temporary folder by default).  Prints the medians over
``--repeats`` runs and the static share, static / whole scoring.

Usage::

    python benchmarks/static_metrics.py [--records 10000] [--repeats 3] [--cache_dir DIR]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from record import table, write_record  # noqa: E402  (benchmarks/, the script's folder)

from sphyr_jax.sharding import configure_host_devices  # noqa: E402

RESULTS = REPO.parent / "shared" / "sphyr_reference" / "results"
STORED = (RESULTS / "gpt-4o-2024-08-06" / "full_easy_results.json",
          RESULTS / "claude-3-7-sonnet-20250219" / "10_random_cell_hard_results.json")


def _records(count: int, seed: int) -> list[dict]:
    from sphyr_jax.scoring.static import read_grid

    stored = []
    for path in STORED:
        stored += [{k: r[k] for k in ("prompt", "completion", "ground_truth")}
                   for r in json.loads(path.read_text())]
    rng = random.Random(seed)
    out = []
    for k in range(count):
        record = dict(stored[k % len(stored)])
        grid = read_grid(record["completion"])
        if k >= len(stored) and grid:
            hard = "." in record["ground_truth"]
            for _ in range(rng.randint(1, 3)):
                row = rng.randrange(len(grid))
                col = rng.randrange(len(grid[row]))
                grid[row][col] = f"{rng.randint(0, 10) / 10:.1f}" if hard else rng.choice("01")
            record["completion"] = "\n".join(" ".join(row) for row in grid)
        out.append(record)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache_dir", type=pathlib.Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the run's results file here")
    args = parser.parse_args()
    configure_host_devices(None)

    import sphyr_jax as sj
    from sphyr_jax.scoring.metrics import ScoreItem

    sj.enable_x64()
    sj.enable_compilation_cache()
    records = _records(args.records, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        cache = sj.OptimumCache(args.cache_dir or tmp)
        start = time.perf_counter()
        sj.score_records(records[:400], cache=cache)  # compiles; every optimum is computed
        warm = time.perf_counter() - start
        items = [ScoreItem(r["completion"], r["ground_truth"], r["prompt"]) for r in records]
        static, whole, physics = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sj.static_metrics_batch(output_grids=[r["completion"] for r in records],
                                    gt_grids=[r["ground_truth"] for r in records],
                                    input_grids=[r["prompt"] for r in records])
            t1 = time.perf_counter()
            fields = sj.score_records(records, cache=cache)
            t2 = time.perf_counter()
            sj.score_batch(items, cache=cache)
            t3 = time.perf_counter()
            static.append(t1 - t0)
            whole.append(t2 - t1)
            physics.append(t3 - t2)
    med = {name: statistics.median(values) for name, values in
           (("static_s", static), ("score_records_s", whole), ("physics_only_s", physics))}
    figures = {
        "records": len(records), "repeats": args.repeats, "devices": sj.sharding.device_count(),
        "warm_up_s": round(warm, 2), **{k: round(v, 3) for k, v in med.items()},
        "static_share_of_scoring": round(med["static_s"] / med["score_records_s"], 4),
        "static_us_per_record": round(1e6 * med["static_s"] / len(records), 1),
        "valid_output_grids": sum(f["valid_output_grid"] for f in fields),
        "all_static_s": [round(v, 3) for v in static],
        "all_score_records_s": [round(v, 3) for v in whole]}
    print(json.dumps(figures, indent=1))
    write_record(args.json, "static_metrics", title="Static metrics", anchor="static-metrics",
                 figures=figures, tables=[table(
                     ("what", "seconds (median)", "per record"),
                     [("the twelve static metrics", f"{med['static_s']:.2f}",
                       f"{figures['static_us_per_record']:.0f} µs"),
                      ("a whole score_records call", f"{med['score_records_s']:.1f}", ""),
                      ("the physics alone (score_batch)", f"{med['physics_only_s']:.1f}", "")])])


if __name__ == "__main__":
    main()
