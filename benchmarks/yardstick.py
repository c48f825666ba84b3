"""Rescore speed, side by side: the reference yardstick vs the published method.

Rescores a fresh copy of the stored GPT-4o ``full_easy`` results (metric
fields stripped) with :func:`sphyr_jax.scoring.results.rescore_tree` and the default
``reference`` yardstick, after a warm-up run that compiles (the timed run
starts from an empty optimum cache, so every sample is optimised again), and
scores the same records one at a time with the NumPy/SciPy re-implementation
of the published method (``reference_method.py``: sparse assembly and
``spsolve`` per solve, the optimum cached per sample as the reference does).
Prints seconds per record for both, their ratio, and the agreement of the
figures.  ``--strong`` also times the strong yardstick; ``--first_call``
measures a first :func:`sphyr_jax.get_structural_metrics` call in a fresh
process with an empty compilation cache (compilations and seconds), then a
second call on another sample.

Usage::

    python benchmarks/yardstick.py [--records 100] [--baseline_records 20]
        [--strong] [--first_call] [--num_devices N]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from sphyr_jax.sharding import configure_host_devices  # noqa: E402

DEFAULT_DATA = (REPO.parent / "shared" / "sphyr_reference" / "results" / "gpt-4o-2024-08-06"
                / "full_easy_results.json")

FIRST_CALL = """
import json, sys, time
t0 = time.perf_counter()
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", sys.argv[2])
events = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, secs, **kw: events.append(secs)
    if name == "/jax/core/compile/backend_compile_duration" else None)
import sphyr_jax as sj
records = json.load(open(sys.argv[1]))
r = records[0]
t1 = time.perf_counter()
sj.get_structural_metrics(r["ground_truth"], r["ground_truth"], r["prompt"])
t2 = time.perf_counter()
first = len(events)
r = records[1]
sj.get_structural_metrics(r["ground_truth"], r["ground_truth"], r["prompt"])
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t2 - t1, "first_compilations": first,
                  "first_compile_s": sum(events[:first]), "second_call_s": t3 - t2,
                  "second_compilations": len(events) - first}))
"""


def _tree(records, root: pathlib.Path) -> pathlib.Path:
    from sphyr_jax.scoring.metrics import METRIC_FIELDS  # after configure_host_devices

    path = root / "gpt-4o-2024-08-06" / "full_easy_results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{k: v for k, v in r.items() if k not in METRIC_FIELDS}
                                for r in records]))
    return path


def _ours(records, optimum: str, num_devices, work: pathlib.Path) -> tuple[float, float, list]:
    """(cold seconds, warm seconds, rescored records) of rescore_tree."""
    from sphyr_jax.scoring.results import rescore_tree
    from sphyr_jax.topopt.optimum import OptimumCache

    times = []
    for run in ("cold", "warm"):
        root = work / f"{optimum}-{run}"
        path = _tree(records, root)
        t0 = time.perf_counter()
        rescore_tree(root, cache=OptimumCache(yardstick=optimum, num_devices=num_devices),
                     num_devices=num_devices)
        times.append(time.perf_counter() - t0)
    return times[0], times[1], json.loads(path.read_text())


def _baseline(records) -> tuple[float, list]:
    """Seconds and figures of the NumPy/SciPy method, one record at a time."""
    import numpy as np
    import reference_method

    from sphyr_jax.problem.grids import densities_from_grid, extract_grid
    from sphyr_jax.problem.loadcase import load_case_from_grid

    cache: dict = {}
    out = []
    t0 = time.perf_counter()
    for r in records:
        case = load_case_from_grid(r["ground_truth"], r["prompt"])
        grid = extract_grid(r["completion"])
        if grid is None or len(grid) != case.shape[0] or any(len(g) != case.shape[1]
                                                              for g in grid):
            out.append(None)
            continue
        rho, _ = densities_from_grid(grid)
        rho[np.asarray(case.load_mask | case.support_mask)] = 1.0
        out.append(reference_method.score_record(rho, case, cache))
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--baseline_records", type=int, default=20)
    parser.add_argument("--strong", action="store_true")
    parser.add_argument("--first_call", action="store_true")
    parser.add_argument("--num_devices", type=int, default=None)
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    args = parser.parse_args()

    if args.first_call:  # a fresh process, an empty compilation cache
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run([sys.executable, "-c", FIRST_CALL, str(args.data), tmp],
                                 capture_output=True, text=True, check=True, cwd=REPO)
        print("first get_structural_metrics call:", out.stdout.strip())

    configure_host_devices(None)
    import jax

    from sphyr_jax import enable_x64

    enable_x64()
    cache_dir = pathlib.Path.home() / ".cache" / "sphyr_jax" / "jax"
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    records = json.loads(args.data.read_text())[: args.records]
    work = pathlib.Path(tempfile.mkdtemp())
    try:
        cold, warm, ours = _ours(records, "reference", args.num_devices, work)
        per = warm / len(records)
        print(f"reference yardstick: {len(records)} records, cold {cold:.1f} s, "
              f"warm {warm:.1f} s = {per * 1e3:.0f} ms/record "
              f"({jax.local_device_count()} devices)")
        same = sum(abs(a["optimal_compliance"] - b["optimal_compliance"])
                   <= 1e-6 * b["optimal_compliance"] for a, b in zip(ours, records, strict=True))
        print(f"  optimal_compliance equal to the stored figure (1e-6): {same}/{len(records)}")
        if args.strong:
            s_cold, s_warm, strong = _ours(records, "strong", args.num_devices, work)
            ratio = [a["optimal_compliance"] / b["optimal_compliance"]
                     for a, b in zip(strong, records, strict=True)]
            topo = sum(a["topology_score"] for a in strong) / len(strong)
            print(f"strong yardstick: cold {s_cold:.1f} s, warm {s_warm:.1f} s = "
                  f"{s_warm / len(records) * 1e3:.0f} ms/record; optimum / published "
                  f"{sum(ratio) / len(ratio):.4f} (mean), topology score {topo:.4f} vs "
                  f"{sum(r['topology_score'] for r in records) / len(records):.4f} published")
        n = min(args.baseline_records, len(records))
        if n:
            base_s, base = _baseline(records[:n])
            base_per = base_s / n
            print(f"published method (NumPy/SciPy re-implementation): {n} records, "
                  f"{base_s:.1f} s = {base_per * 1e3:.0f} ms/record")
            print(f"speed-up per record: {base_per / per:.1f}x")
            agree = sum(b is not None and abs(b["topology_score"] - a["topology_score"]) <= 1e-6
                        for a, b in zip(ours[:n], base, strict=True))
            print(f"  topology_score equal to the NumPy method's: {agree}/{n}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
