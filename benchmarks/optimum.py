"""Strong-yardstick optima per second on the stored reference samples.

(The default ``reference`` yardstick is timed side by side with the published
method by ``benchmarks/yardstick.py``.)  Runs the strong search,
:func:`sphyr_jax.topopt.strong.strong_optimum_batch`, on the 100 samples of
the stored GPT-4o ``full_easy`` results: once cold (compilation included) and
then warm (median of ``--repeats``), in a fresh process with one XLA CPU
device per core unless ``XLA_FLAGS`` says otherwise.  Checks the optima
against the reference implementation's stored ``optimal_compliance`` (ours
must be at least as stiff on every sample) and prints the mean ratio.  The
reference implementation needs about 1.1-1.3 s per sample on a 2-core CPU.

Usage::

    python benchmarks/optimum.py [--samples 100] [--repeats 2] [--num_devices N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sphyr_jax.sharding import configure_host_devices  # noqa: E402

DEFAULT_DATA = (REPO.parent / "shared" / "sphyr_reference" / "results" / "gpt-4o-2024-08-06"
                / "full_easy_results.json")
REFERENCE_SECONDS_PER_SAMPLE = (1.1, 1.3)


def run(samples: int = 100, repeats: int = 2, num_devices: int | None = None,
        data: pathlib.Path = DEFAULT_DATA) -> dict:
    """Time the reference optimum of ``samples`` stored samples (cold and warm)."""
    import jax
    import numpy as np

    from sphyr_jax import enable_x64
    from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
    from sphyr_jax.topopt.options import DEFAULT_STRONG
    from sphyr_jax.topopt.strong import strong_optimum_batch

    enable_x64()
    records = json.loads(pathlib.Path(data).read_text())[:samples]
    cases = [load_case_from_grid(r["ground_truth"], r["prompt"]) for r in records]
    batch = stack_load_cases(cases)
    stored = np.array([r["optimal_compliance"] for r in records], np.float64)
    options = dataclasses.replace(DEFAULT_STRONG, num_devices=num_devices)

    def once():
        stages = {}
        t0 = time.perf_counter()

        def progress(stage, done, total):
            if done >= total:
                stages[stage] = time.perf_counter() - t0

        res = strong_optimum_batch(batch, options=options, progress=progress)
        return time.perf_counter() - t0, res, stages

    cold, res, _ = once()
    warm_runs = [once() for _ in range(repeats)]
    warm = statistics.median(t for t, _, _ in warm_runs)
    ratio = res.compliance / stored
    out = {
        "device": f"{jax.devices()[0].device_kind} x{jax.local_device_count()}",
        "samples": len(records),
        "cold_s": cold,
        "warm_s": warm,
        "warm_runs_s": [t for t, _, _ in warm_runs],
        "stages_s": warm_runs[-1][2],
        "optima_per_s": len(records) / warm,
        "mean_ratio_to_reference": float(ratio.mean()),
        "max_ratio_to_reference": float(ratio.max()),
        "weaker_than_reference": int(np.sum(res.compliance > stored * (1 + 1e-6))),
        "speedup_vs_reference": REFERENCE_SECONDS_PER_SAMPLE[0] * len(records) / warm,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num_devices", type=int, default=None)
    parser.add_argument("--cpu_devices", type=int, default=None)
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    args = parser.parse_args()
    if not args.data.exists():
        raise SystemExit(f"reference results not found: {args.data}")
    configure_host_devices(args.cpu_devices)
    out = run(args.samples, args.repeats, args.num_devices, args.data)
    print(json.dumps(out, indent=2))
    if args.json:
        return
    print(f"\n{out['samples']} reference optima on {out['device']}: cold {out['cold_s']:.1f} s, "
          f"warm {out['warm_s']:.1f} s ({out['optima_per_s']:.1f} optima/s, "
          f"{out['speedup_vs_reference']:.0f}x the reference's 1.1 s/sample); "
          f"mean ratio to the stored optimum {out['mean_ratio_to_reference']:.4f}, "
          f"weaker on {out['weaker_than_reference']} samples")


if __name__ == "__main__":
    main()
