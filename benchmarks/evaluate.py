"""``python -m sphyr_jax evaluate`` against a local endpoint, the reference in the same run.

Prints one table:

* 100 samples (``full_easy``, published order) against an endpoint that
  answers at once, scoring included, optimum cache empty: the whole command
  (a fresh process: import, compilation cache warm, optima computed), median
  of ``--repeats`` runs, against the reference method scoring the same 100
  completions one by one (``benchmarks/reference_method.py``: the published
  recipe in NumPy/SciPy, a sparse assembly and ``spsolve`` per solve, the
  optimum cached per sample as the reference implementation does);
* 1,600 samples (16 subjects x 100) against an endpoint that answers after
  200 ms, ``--concurrency=32``, scoring included: a first model with an empty
  optimum cache (``--cache_dir`` filled by it), then other models on the same
  samples with the optima on disk (median of ``--repeats``), against the ideal
  1,600 x 0.2 s / 32 = 10 s.

The endpoint is ``tests/chat_server.py`` in its own process (a real HTTP
server on 127.0.0.1 speaking ``/v1/chat/completions`` on one asyncio loop; it
answers the prompt's grid with every masked cell solid).  The reference runs
in three parts, one after each of our runs, so both sides share the machine's
drifting load alike.  The samples: the 20 embedded samples of
each subject (``sphyr_jax/data/sets/dataset``) under the 8 turns and mirrors of the square
(load direction turned alike), 160 distinct records per subject, of which
the published order takes 100.

Usage::

    python benchmarks/evaluate.py [--repeats 3] [--reference_records 100] [--skip 1600]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SETS = REPO / "sphyr_jax" / "data" / "sets"  # the embedded sets (sphyr_jax.data.embedded)
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def write_dataset(folder: pathlib.Path) -> None:
    """Every embedded subject under the 8 symmetries of the square (160 records each)."""
    from sphyr_jax.data.datasets import list_subjects, load_subject
    from sphyr_jax.problem.symmetry import transform_record

    folder.mkdir(parents=True, exist_ok=True)
    for subject in list_subjects():
        out = []
        for base in load_subject(SETS / "dataset", subject):
            for variant, (k, mirror) in enumerate((k, m) for m in (None, 1) for k in range(4)):
                record = transform_record(base, k, mirror=mirror)
                record["index"] = variant * 1000 + base["index"]
                out.append(json.dumps(record))
        (folder / f"{subject}.jsonl").write_text("\n".join(out) + "\n")


class Endpoint:
    """``tests/chat_server.py`` in its own process (so its threads do not share our GIL)."""

    def __init__(self, delay: float):
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "chat_server.py"), "--delay", str(delay),
             "--lifetime", "3600"], stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


RUNS: list[dict] = []  # every command: wall seconds and the run's own seconds


def evaluate_cli(model: str, url: str, data: pathlib.Path, root: pathlib.Path, *, subjects,
                 concurrency: int, cache_dir: pathlib.Path) -> float:
    """Seconds of one ``python -m sphyr_jax evaluate`` (a fresh process, as a user runs it);
    the run's own seconds (after start-up: import, data, prompts) are kept in RUNS."""
    cmd = [sys.executable, "-m", "sphyr_jax", "evaluate", f"--model={model}",
           f"--base_url={url}", f"--dataset_dir={data}", f"--subjects={','.join(subjects)}",
           f"--results_root={root}", "--sample_count=100", f"--concurrency={concurrency}",
           "--timeout=60", f"--cache_dir={cache_dir}", "--progress=false"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OPENAI_API_KEY": "bench"})
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"evaluate failed ({done.returncode}):\n{done.stderr[-3000:]}")
    own = re.search(r"complete, ([0-9.]+) s, optimum=", done.stdout)
    RUNS.append({"model": model, "wall_s": seconds, "run_s": float(own.group(1)) if own else None,
                 "load": os.getloadavg()[0]})
    return seconds


def reference_one_by_one(records) -> tuple[float, list]:
    """Seconds and figures of the NumPy/SciPy method on stored records, one at a time."""
    import numpy as np
    import reference_method

    from sphyr_jax.problem.grids import densities_from_grid, extract_grid
    from sphyr_jax.problem.loadcase import load_case_from_grid

    cache: dict = {}
    out = []
    t0 = time.perf_counter()
    for r in records:
        case = load_case_from_grid(r["ground_truth"], r["prompt"], r.get("gravity_dir"))
        grid = extract_grid(r["completion"])
        rho, _ = densities_from_grid(grid)
        rho[np.asarray(case.load_mask | case.support_mask)] = 1.0
        out.append(reference_method.score_record(rho, case, cache))
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference_records", type=int, default=100)
    parser.add_argument("--skip", default="", help="comma list of: 100, 1600")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    from sphyr_jax import enable_x64
    from sphyr_jax.data.datasets import list_subjects

    enable_x64()
    rows, figures = [], {}
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_evaluate_"))
    data = work / "data"
    write_dataset(data)
    warm = Endpoint(0.0)
    try:  # compile once (persistent compilation cache), on other samples
        evaluate_cli("warmup", warm.url, SETS / "dataset", work / "warmup",
                     subjects=["full_easy"], concurrency=8, cache_dir=work / "warmup_optima")

        if "100" not in skip:
            # Ours and the reference alternate (a third of the reference after each of our
            # runs), so both see the same share of a machine whose load drifts.
            runs, ref_s, ref, records = [], 0.0, [], None
            for k in range(args.repeats):
                runs.append(evaluate_cli("instant", warm.url, data, work / f"r100_{k}",
                                         subjects=["full_easy"], concurrency=8,
                                         cache_dir=work / f"optima100_{k}"))
                if records is None:
                    records = json.loads((work / "r100_0" / "instant" / "full_easy_results.json")
                                         .read_text())
                    n = min(args.reference_records, len(records))
                lo, hi = n * k // args.repeats, n * (k + 1) // args.repeats
                seconds, figures_k = reference_one_by_one(records[lo:hi])
                ref_s += seconds
                ref += figures_k
            ours = statistics.median(runs)
            ref_100 = ref_s * len(records) / n
            agree = sum(abs(a["topology_score"] - b["topology_score"]) <= 1e-6
                        for a, b in zip(records[:n], ref, strict=True))
            figures["r100"] = {"runs_s": runs, "median_s": ours, "reference_s": ref_s,
                               "reference_records": n, "agree": agree}
            scaled = "" if n == len(records) else f" (x {len(records)}/{n})"
            rows.append((f"{len(records)} samples, instant endpoint, optimum cache empty",
                         f"{ours:.1f} s (median of {len(runs)}: "
                         + ", ".join(f"{r:.1f}" for r in runs) + ")",
                         f"{ref_100:.1f} s, one by one{scaled}", f"{ref_100 / ours:.1f}x faster"))
            print(f"topology_score equal to the reference method's on {agree}/{n} records",
                  flush=True)
    finally:
        warm.close()

    if "1600" not in skip:
        slow = Endpoint(0.2)
        try:
            subjects = list_subjects()
            ideal = len(subjects) * 100 * 0.2 / 32
            cold = evaluate_cli("first-model", slow.url, data, work / "r1600",
                                subjects=subjects, concurrency=32, cache_dir=work / "optima1600")
            runs = [evaluate_cli(f"model-{k}", slow.url, data, work / "r1600", subjects=subjects,
                                 concurrency=32, cache_dir=work / "optima1600")
                    for k in range(args.repeats)]
            own = statistics.median(r["run_s"] for r in RUNS[-args.repeats:])
            stored = sum(len(json.loads(p.read_text())) for p in
                         (work / "r1600" / "model-0").glob("*_results.json")
                         if not p.name.endswith("_aggregated_results.json"))
            figures["r1600"] = {"cold_s": cold, "runs_s": runs, "ideal_s": ideal,
                                "records": stored}
            warm = statistics.median(runs)
            rows.append((f"{stored} samples (16 x 100), 200 ms endpoint, --concurrency=32, "
                         "optima on disk",
                         f"{warm:.1f} s (median of {len(runs)}: "
                         + ", ".join(f"{r:.1f}" for r in runs) + ")",
                         f"ideal {ideal:.1f} s", f"{warm / ideal:.2f}x ideal"))
            rows.append(("the same, the run alone (the command's own figure: after import, "
                         "data and prompts)", f"{own:.1f} s (median)", f"ideal {ideal:.1f} s",
                         f"{own / ideal:.2f}x ideal"))
            rows.append(("the same, first model (optimum cache empty: every optimum computed)",
                         f"{cold:.1f} s", f"ideal {ideal:.1f} s", f"{cold / ideal:.2f}x ideal"))
        finally:
            slow.close()

    loads = [r["load"] for r in RUNS]
    print(f"\nload average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} cores")
    print("| what | `python -m sphyr_jax evaluate` | reference | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps({**figures, "runs": RUNS}, indent=2))


if __name__ == "__main__":
    main()
