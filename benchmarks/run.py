"""One entry point for every benchmark: ``python benchmarks/run.py``.

Prints one table, with the device named:

* FEA compliance solves/s at batch 1/64/1024/8192 (``fea_throughput.py``),
* strong-search optima per second on 100 stored samples (``optimum.py``),
* rescore records/s: a first run (cold compile, optima computed) and a second
  run of the same tree (persistent compilation cache and optimum cache warm),
* validate full_easy/20 wall time: cold compile, then warm compilation cache
  with optima recomputed,
* peak resident memory of the child processes;

beside the published method (``reference_method.py``, NumPy/SciPy) measured in
the same run: its seconds per scored record (optimum included) give the
reference column of the optimum, rescore and validate rows, and SciPy's
assembly + ``spsolve`` the one of the FEA rows.  No figure comes from another day.

Each piece runs in a fresh process (JAX fixes its devices at start-up; the
app uses one XLA CPU device per core).  The stored reference data is used
when present, the embedded ``data/`` otherwise.  Nothing is installed and no
network is used, so the same command runs on a lent GPU machine
(``benchmarks/gpu.sh``).

Usage::

    python benchmarks/run.py [--batches 1,64,1024,8192] [--skip optimum,validate] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SETS = REPO / "sphyr_jax" / "data" / "sets"  # the embedded sets (sphyr_jax.data.embedded)
SHARED = REPO.parent / "shared" / "sphyr_reference"
REFERENCE_RECORDS = 8  # records the published method scores in this run (about 1-2 s each)


def _py(*args, timeout=1800) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def _last_json(text: str) -> dict:
    start = text.index("{")
    return json.loads(text[start: text.rindex("}") + 1])


def _peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return kb / 1024.0


def bench_fea(batches: str) -> dict:
    _, out = _py("benchmarks/fea_throughput.py", "--batches", batches, "--json")
    return _last_json(out)


def bench_optimum() -> dict | None:
    if not (SHARED / "results").is_dir():
        return None
    _, out = _py("benchmarks/optimum.py", "--samples", "100", "--repeats", "1", "--json")
    return _last_json(out)


def _results_tree(work: pathlib.Path) -> tuple[pathlib.Path, int]:
    src = SHARED / "results" if (SHARED / "results").is_dir() else REPO / "data" / "results"
    dst = work / "results"
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst)
    n = sum(len(json.loads(p.read_text())) for p in dst.glob("*/*_results.json"))
    return dst, n


def bench_rescore(work: pathlib.Path) -> dict:
    tree, n = _results_tree(work)
    common = ["-m", "sphyr_jax", "rescore", f"--results_root={tree}",
              f"--cache_dir={work / 'optima'}", f"--compilation_cache_dir={work / 'xla'}",
              "--progress=false"]
    first, _ = _py(*common)
    second, out = _py(*common)
    # Warm compilation cache, optima recomputed: the per-record cost of a new tree.
    fresh, _ = _results_tree(work / "fresh")
    warm, _ = _py("-m", "sphyr_jax", "rescore", f"--results_root={fresh}",
                  f"--compilation_cache_dir={work / 'xla'}", "--progress=false")
    return {"records": n, "first_s": first, "second_s": second, "warm_compile_s": warm,
            "first_s_per_record": first / n, "second_s_per_record": second / n,
            "warm_compile_s_per_record": warm / n,
            "second_speedup": first / second, "summary": out.strip().splitlines()[-1]}


def bench_validate(work: pathlib.Path) -> dict:
    if (SHARED / "datasets" / "full_easy.jsonl").exists():
        dataset = SHARED / "datasets"
    else:
        dataset = SETS / "dataset"
    base = ["-m", "sphyr_jax", "validate", "--subject=full_easy", "--samples=20",
            f"--dataset_dir={dataset}", f"--compilation_cache_dir={work / 'xla-validate'}",
            "--progress=false"]
    cold, _ = _py(*base)
    warm, out = _py(*base)  # compilation cached; optima recomputed (no --cache_dir)
    return {"dataset": str(dataset.name), "cold_s": cold, "warm_s": warm,
            "summary": out.strip().splitlines()[-1]}


def bench_reference(records: int = REFERENCE_RECORDS) -> dict:
    """The published method (``reference_method.py``, NumPy/SciPy) timed in this run.

    Scores ``records`` stored completions one by one, each computing its own
    optimum as the reference implementation does for a new sample; a validate
    of one subject is one optimum plus four probe solves per sample.
    """
    code = f"""
import json, pathlib, sys, time
sys.path.insert(0, "benchmarks")
import numpy as np
from reference_method import score_record
from sphyr_jax.problem.grids import densities_from_grid, extract_grid
from sphyr_jax.problem.loadcase import load_case_from_grid
src = pathlib.Path({str(SHARED / "results")!r})
if src.is_dir():
    records = [r for p in sorted(src.glob("*/*_results.json")) for r in json.loads(p.read_text())]
else:  # without the shared data: the random baseline on the embedded set
    from sphyr_jax.data import embedded, list_subjects, load_subject
    from sphyr_jax.evaluation.baselines import baseline_records
    records = [r for s in list_subjects()
               for r in baseline_records("random", s, load_subject(embedded("dataset"), s))]
records = records[:{records}]
times = []
for r in records:
    case = load_case_from_grid(r["ground_truth"], r.get("prompt") or r.get("input_grid"))
    grid = extract_grid(r["completion"])
    rho = np.asarray(case.pinned) if grid is None else densities_from_grid(grid)[0]
    t0 = time.perf_counter()
    score_record(rho, case)
    times.append(time.perf_counter() - t0)
print(json.dumps({{"records": len(times), "s_per_record": float(np.median(times))}}))
"""
    _, out = _py("-c", code)
    return _last_json(out)


def format_table(report: dict) -> str:
    lines = [f"device: {report.get('device', '?')}", "",
             f"{'measure':44s} {'sphyr_jax':>14s} {'reference':>14s}",
             "-" * 74]

    def row(name, ours, ref=""):
        lines.append(f"{name:44s} {ours:>14s} {ref:>14s}")

    fea = report.get("fea")
    if fea:
        for b in fea["batches"]:
            ref = f"{fea['baseline']['solves_per_s']:,.0f}" if b["batch"] == 1024 else ""
            row(f"FEA solves/s, batch {b['batch']}", f"{b['solves_per_s']:,.0f}", ref)
            row(f"  compile s, batch {b['batch']}", f"{b['compile_s']:.1f}")
    ref = report.get("reference") or {}
    ref_s = ref.get("s_per_record")
    per_record = f"{ref_s:.2f}" if ref_s else ""
    opt = report.get("optimum")
    if opt:
        row("strong-search optima/s (100 samples, warm)", f"{opt['optima_per_s']:.2f}",
            f"{1 / ref_s:.2f}" if ref_s else "")
        row("  cold (compile included), s", f"{opt['cold_s']:.1f}")
        row("  mean ratio to the stored optimum", f"{opt['mean_ratio_to_reference']:.4f}",
            "1.0000")
    res = report.get("rescore")
    if res:
        row(f"rescore s/record, first run ({res['records']} rec)",
            f"{res['first_s_per_record']:.3f}", per_record)
        row("rescore s/record, warm compile, new optima",
            f"{res['warm_compile_s_per_record']:.3f}", per_record)
        row("rescore s/record, second run (caches)", f"{res['second_s_per_record']:.3f}")
        row("  second run speed-up", f"{res['second_speedup']:.1f}x")
    val = report.get("validate")
    if val:
        validate_ref = f"{20 * ref_s:.0f}" if ref_s else ""  # one optimum per sample
        row("validate full_easy/20, cold s", f"{val['cold_s']:.1f}", validate_ref)
        row("validate full_easy/20, warm compile s", f"{val['warm_s']:.1f}", validate_ref)
    for stage, mb in report.get("peak_rss_mb_after", {}).items():
        row(f"peak RSS of any child so far, after {stage}, MB", f"{mb:.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64,1024,8192")
    parser.add_argument("--skip", default="",
                        help="comma-separated: fea,optimum,rescore,validate,reference")
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        peaks = {}
        if "reference" not in skip:
            report["reference"] = bench_reference()
        if "fea" not in skip:
            report["fea"] = bench_fea(args.batches)
            report["device"] = report["fea"]["device"]
            peaks["fea"] = _peak_rss_mb()
        if "optimum" not in skip:
            report["optimum"] = bench_optimum()
            if report["optimum"]:
                report.setdefault("device", report["optimum"]["device"])
            peaks["optimum"] = _peak_rss_mb()
        if "rescore" not in skip:
            report["rescore"] = bench_rescore(work)
            peaks["rescore"] = _peak_rss_mb()
        if "validate" not in skip:
            report["validate"] = bench_validate(work)
            peaks["validate"] = _peak_rss_mb()
    report["peak_rss_mb"] = _peak_rss_mb()
    report["peak_rss_mb_after"] = peaks  # running maximum over child processes
    print(format_table(report))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
