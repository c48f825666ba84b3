"""What a person touches first: first-call latency, compile budget, eager calls.

Prints one table with the reference method measured in the same run
(``benchmarks/reference_method.py``: the reference implementation's recipe in
NumPy/SciPy, one sparse assembly and ``spsolve`` per solve) and the SciPy
baseline of ``benchmarks/fea_throughput.py``:

* ``get_structural_metrics`` on one record in a fresh process, with an empty
  and with a warm compilation cache (import included; compilations counted);
* ``get_structural_metrics`` on new samples in a warm process (median over
  mixed subjects: full masks, random cells, rows, columns; easy and hard);
* one eager ``sj.compliance`` call against an assemble + ``spsolve``;
* resident memory growth over 1,000 eager calls on different samples;
* ``python -m sphyr_jax validate`` (full_easy/20) with an empty and a warm
  compilation cache, against the reference method scoring the same probes;
* ``jax.jit(jax.vmap(sj.compliance))`` at batch 1024 against SciPy one by one;
* the compile budget: XLA compilations and seconds per public entry point.

Every sphyr_jax figure comes from a fresh process.  Timings on a shared
machine are noisy: read the ratios, which are measured in the same run.

Usage::

    python benchmarks/latency.py [--samples 16] [--skip validate,vmap] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SETS = REPO / "sphyr_jax" / "data" / "sets"  # the embedded sets (sphyr_jax.data.embedded)
DATA = SETS / "dataset"
MIXED = ("full_easy", "full_hard", "5_random_cell_easy", "10_random_cell_hard",
         "1_random_column_hard", "3_random_column_easy", "1_random_row_easy",
         "3_random_row_hard")

PRELUDE = textwrap.dedent(f"""
    import json, pathlib, resource, statistics, sys, time
    T0 = time.perf_counter()
    sys.path.insert(0, {str(REPO)!r})
    sys.path.insert(0, {str(REPO / "benchmarks")!r})
    DATA = pathlib.Path({str(DATA)!r})
    MIXED = {MIXED!r}

    def records(subject, lo=0, hi=20):
        lines = (DATA / f"{{subject}}.jsonl").read_text().splitlines()[lo:hi]
        return [json.loads(line) for line in lines]

    def mixed(count, offset):
        out = []
        for k in range(count):
            out.append(records(MIXED[k % len(MIXED)], offset + k // len(MIXED),
                               offset + k // len(MIXED) + 1)[0])
        return out
""")


def _run(code: str, env: dict | None = None, timeout: float = 1800) -> dict:
    """Run ``code`` in a fresh Python; its last line of output is one JSON object."""
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                          capture_output=True, text=True, cwd=REPO, env=full_env,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else {}


FIRST_CALL = """
    import sphyr_jax as sj
    from sphyr_jax.runtime import CompileCounter
    sj.enable_x64()
    sj.enable_compilation_cache()
    rec = records("full_easy", 0, 1)[0]
    with CompileCounter() as cc:
        t = time.perf_counter()
        m = sj.get_structural_metrics(rec["ground_truth"], rec["ground_truth"], rec["input_grid"])
        first = time.perf_counter() - t
    print(json.dumps({"total_s": time.perf_counter() - T0, "call_s": first,
                      "compiles": cc.count, "compile_s": cc.seconds,
                      "cache_hits": cc.cache_hits, "topology_score": m.topology_score}))
"""

REFERENCE_FIRST_CALL = """
    import numpy as np
    import reference_method as ref
    from sphyr_jax.problem.loadcase import load_case_from_grid
    from sphyr_jax.problem.grids import densities_from_grid
    rec = records("full_easy", 0, 1)[0]
    t = time.perf_counter()
    case = load_case_from_grid(rec["ground_truth"], rec["input_grid"])
    rho, _ = densities_from_grid(rec["ground_truth"])
    out = ref.score_record(rho, case)
    print(json.dumps({"total_s": time.perf_counter() - T0, "call_s": time.perf_counter() - t,
                      "topology_score": out["topology_score"]}))
"""

WARM = """
    import numpy as np
    import sphyr_jax as sj
    import reference_method as ref
    from fea_throughput import SparseBaseline
    from sphyr_jax.runtime import CompileCounter
    sj.enable_x64()
    sj.enable_compilation_cache()
    n = {samples}
    warm = mixed(len(MIXED), 0)
    for rec in warm:  # one warm-up per subject
        sj.get_structural_metrics(rec["ground_truth"], rec["ground_truth"], rec["input_grid"])
    new = mixed(n, 1)
    ours, theirs, agree = [], [], []
    with CompileCounter() as cc:
        for rec in new:
            t = time.perf_counter()
            m = sj.get_structural_metrics(rec["ground_truth"], rec["ground_truth"],
                                          rec["input_grid"])
            ours.append(time.perf_counter() - t)
            case = sj.load_case_from_grid(rec["ground_truth"], rec["input_grid"])
            rho, _ = sj.densities_from_grid(rec["ground_truth"])
            t = time.perf_counter()
            r = ref.score_record(rho, case)
            theirs.append(time.perf_counter() - t)
            agree.append(abs(m.optimal_compliance - r["optimal_compliance"])
                         / r["optimal_compliance"])
    compiles_scoring = cc.count
    # Eager compliance, one sample per call, against assemble + spsolve.
    cases = [sj.load_case_from_grid(r["ground_truth"], r["input_grid"]) for r in new]
    rhos = [sj.densities_from_grid(r["ground_truth"])[0] for r in new]
    base = SparseBaseline(rhos[0].shape)
    eager, scipy_t = [], []
    with CompileCounter() as cc:
        for _ in range(5):
            for case, rho in zip(cases, rhos):
                t = time.perf_counter(); float(sj.compliance(case, rho))
                eager.append(time.perf_counter() - t)
                f, fr = np.asarray(case.force), np.asarray(case.free_dofs)
                t = time.perf_counter(); base.compliance(rho, f, fr)
                scipy_t.append(time.perf_counter() - t)
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    before = rss()
    rng = np.random.default_rng(0)
    for k in range(1000):
        float(sj.compliance(cases[k % len(cases)],
                            np.clip(rhos[k % len(rhos)] + 0.1 * rng.standard_normal(
                                rhos[0].shape), 0, 1)))
    print(json.dumps({{
        "ours_median_s": statistics.median(ours), "reference_median_s": statistics.median(theirs),
        "compiles_on_new_samples": compiles_scoring, "eager_compiles": cc.count,
        "optimum_max_rel_diff": max(agree),
        "eager_median_ms": 1e3 * statistics.median(eager),
        "scipy_median_ms": 1e3 * statistics.median(scipy_t),
        "rss_growth_mb_1000_calls": rss() - before}}))
"""

REFERENCE_VALIDATE = """
    import random
    import numpy as np
    import reference_method as ref
    from sphyr_jax.problem.grids import densities_from_grid
    from sphyr_jax.problem.loadcase import load_case_from_grid
    from sphyr_jax.scoring.validation import probe_completions
    recs = [json.loads(l) for l in pathlib.Path({path!r}).read_text().splitlines()[:20]]
    t = time.perf_counter()
    cache = {{}}
    for i, rec in enumerate(recs):
        case = load_case_from_grid(rec["ground_truth"], rec["input_grid"])
        for probe in probe_completions(rec["ground_truth"], random.Random(i), False).values():
            rho, _ = densities_from_grid(probe)
            rho[np.asarray(case.load_mask | case.support_mask)] = 1.0
            ref.score_record(rho, case, cache)
    print(json.dumps({{"wall_s": time.perf_counter() - t}}))
"""


def first_call(cache_dir: str) -> dict:
    return _run(FIRST_CALL, {"SPHYR_JAX_COMPILATION_CACHE": cache_dir})


def validate(cache_dir: str, dataset_dir: pathlib.Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sphyr_jax", "validate", "--subject=full_easy",
                    "--samples=20", f"--dataset_dir={dataset_dir}",
                    f"--compilation_cache_dir={cache_dir}"],
                   check=True, capture_output=True, text=True, cwd=REPO, timeout=1800)
    return time.perf_counter() - t0


COMPILE_BUDGET = """
    import numpy as np
    import jax
    import sphyr_jax as sj
    from sphyr_jax.runtime import CompileCounter
    sj.enable_x64()
    rec = records("full_easy", 0, 1)[0]
    case = sj.load_case_from_grid(rec["ground_truth"], rec["input_grid"])
    rho, _ = sj.densities_from_grid(rec["ground_truth"])
    batch = sj.stack_load_cases([case] * 3)
    steps = [
        ("compliance", lambda: sj.compliance(case, rho)),
        ("solve", lambda: sj.solve(case, rho)),
        ("analyze", lambda: sj.analyze(case, rho)),
        ("grad of compliance", lambda: jax.grad(sj.compliance, argnums=1)(case, rho)),
        ("optimize (SIMP, 3 runs)", lambda: sj.optimize(batch, penal=3.0)),
        ("reference yardstick", lambda: sj.optimum(case)),
        ("get_structural_metrics (rest)",
         lambda: sj.get_structural_metrics(rec["ground_truth"], rec["ground_truth"],
                                           rec["input_grid"])),
        ("strong yardstick", lambda: sj.get_structural_metrics(
            rec["ground_truth"], rec["ground_truth"], rec["input_grid"], optimum="strong")),
    ]
    out = {}
    for name, fn in steps:
        with CompileCounter() as cc:
            t = time.perf_counter(); jax.block_until_ready(fn()); wall = time.perf_counter() - t
        out[name] = {"compiles": cc.count, "compile_s": cc.seconds, "wall_s": wall}
    print(json.dumps(out))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=16, help="new samples in a warm process")
    parser.add_argument("--skip", default="", help="comma list of: first,warm,validate,vmap,"
                                                   "budget")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    shared = REPO.parent / "shared" / "sphyr_reference" / "datasets"
    dataset_dir = shared if (shared / "full_easy.jsonl").exists() else DATA
    rows, report = [], {}

    def row(what, ours, reference, ratio=None):
        rows.append((what, ours, reference, "" if ratio is None else f"{ratio:.2f}x"))

    if "first" not in skip:
        with tempfile.TemporaryDirectory() as cache:
            cold, warm = first_call(cache), first_call(cache)
        ref = _run(REFERENCE_FIRST_CALL)
        report.update(first_cold=cold, first_warm=warm, reference_first=ref)
        row("get_structural_metrics, fresh process, empty compilation cache",
            f"{cold['total_s']:.1f} s ({cold['compiles']} compilations, "
            f"{cold['compile_s']:.1f} s)", f"{ref['total_s']:.1f} s",
            cold["total_s"] / ref["total_s"])
        row("get_structural_metrics, fresh process, warm compilation cache",
            f"{warm['total_s']:.1f} s", f"{ref['total_s']:.1f} s",
            warm["total_s"] / ref["total_s"])
    if "warm" not in skip:
        w = _run(WARM.format(samples=args.samples))
        report["warm"] = w
        row(f"get_structural_metrics, new sample, warm process (median of {args.samples})",
            f"{1e3 * w['ours_median_s']:.0f} ms ({w['compiles_on_new_samples']} compilations)",
            f"{1e3 * w['reference_median_s']:.0f} ms",
            w["ours_median_s"] / w["reference_median_s"])
        row("eager sj.compliance, one sample, after the first call",
            f"{w['eager_median_ms']:.2f} ms ({w['eager_compiles']} compilations)",
            f"{w['scipy_median_ms']:.2f} ms (assemble + spsolve)",
            w["eager_median_ms"] / w["scipy_median_ms"])
        row("RSS growth over 1,000 eager calls", f"{w['rss_growth_mb_1000_calls']:.1f} MB", "")
    if "validate" not in skip:
        with tempfile.TemporaryDirectory() as cache:
            cold_v = validate(cache, dataset_dir)
            warm_v = validate(cache, dataset_dir)
        ref_v = _run(REFERENCE_VALIDATE.format(path=str(dataset_dir / "full_easy.jsonl")))
        report.update(validate_cold_s=cold_v, validate_warm_s=warm_v, validate_reference=ref_v)
        row("validate full_easy/20, empty compilation cache", f"{cold_v:.1f} s",
            f"{ref_v['wall_s']:.1f} s", cold_v / ref_v["wall_s"])
        row("validate full_easy/20, warm compilation cache", f"{warm_v:.1f} s",
            f"{ref_v['wall_s']:.1f} s", warm_v / ref_v["wall_s"])
    if "vmap" not in skip:
        sys.path.insert(0, str(REPO / "benchmarks"))
        v = _run("""
            import fea_throughput
            r = fea_throughput.run(batches=(1024,), repeats=5)
            print(json.dumps(r))
        """)
        report["vmap"] = v
        b = v["batches"][0]
        row("jax.jit(jax.vmap(sj.compliance)), batch 1024",
            f"{b['vmap_solves_per_s']:,.0f} solves/s (native {b['solves_per_s']:,.0f}/s)",
            f"{v['baseline']['solves_per_s']:,.0f} solves/s (scipy one by one)",
            b["vmap_ratio_to_baseline"])
    if "budget" not in skip:
        with tempfile.TemporaryDirectory() as cache:
            budget = _run(COMPILE_BUDGET, {"SPHYR_JAX_COMPILATION_CACHE": cache})
        report["compile_budget"] = budget

    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"{'measure':<{width}}  {'sphyr_jax':<40}  {'reference':<34}  ratio")
    for what, ours, ref_s, ratio in rows:
        print(f"{what:<{width}}  {ours:<40}  {ref_s:<34}  {ratio}")
    if "compile_budget" in report:
        print("\ncompile budget per entry point (fresh process, empty compilation cache):")
        for name, b in report["compile_budget"].items():
            print(f"  {name:<32} {b['compiles']:>3} compilations  {b['compile_s']:>6.1f} s "
                  f"compiling  {b['wall_s']:>6.1f} s wall")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
