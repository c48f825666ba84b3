"""Training-corpus throughput: in-process against a local Ray cluster, the checks, capacity.

One table, rows of four kinds:

* ``throughput``: samples per second per core of :func:`sphyr_jax.data.corpus.build_corpus`
  (default settings: the v2 optimiser and the reference optimum of all 16 subjects'
  records) at 10x10 and 20x20, with the in-process engine (``--cores`` threads) and
  with a local two-node Ray cluster on loopback (``--cores`` CPUs in all, one task per
  CPU), the same seed, so the same bytes (checked).  Each engine first makes a small
  warm-up corpus (other seed) so compilation is not timed; the Ray workers load the
  programs from the persistent compilation cache.
* ``checks``: the acceptance and exclusion checks alone with 100,000 accepted samples
  (``--check_samples``): random v2 layouts and easy answers in a packed index, the
  per-candidate cost of the layout screen against them and the benchmark sets and of
  the structure check, and their share of a run at the measured per-core rate.
* ``thousand``: ``--thousand`` makes 1,000 samples at 10x10 in-process, every
  optimum included (the 20-minute target on the 2-core machine), with layouts
  ``--thousand_min_layout`` (5) cells apart: the v2 distance of 6 leaves room for
  fewer than 1,000 samples on 10x10 beside the benchmark sets (``capacity``).
* ``capacity``: how many samples the v2 distances leave room for: accepted layouts
  after ``--capacity_draws`` keyed draws (layout screen only, an upper bound).

Usage::

    python benchmarks/corpus.py [--samples 16] [--cores 2] [--grids 10,20] [--thousand]
        [--check_samples 100000] [--capacity_draws 200000] [--skip ray,throughput,...]
        [--json benchmarks/results/corpus.json]

Smoke (seconds, not figures): ``--samples 4 --grids 6 --quick --check_samples 2000
--capacity_draws 2000``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import sphyr_jax  # noqa: E402
from sphyr_jax.data import corpus as cp  # noqa: E402
from sphyr_jax.data.engines import LocalEngine, RayEngine  # noqa: E402
from sphyr_jax.data.exclusion import (  # noqa: E402
    SampleIndex,
    layout_bits,
    load_exclusion_index,
    pack_cells,
)
from sphyr_jax.data.generate_v2 import QUICK_V2_OPTIONS, V2Rules  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from record import table as record_table  # noqa: E402  (benchmarks/, the script's folder)
from record import write_record  # noqa: E402


def _digest(folder: pathlib.Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != cp.MANIFEST:
            h.update(str(path.relative_to(folder)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _spec(samples: int, grid: int, seed: int, quick: bool) -> cp.CorpusSpec:
    extra = {"options": QUICK_V2_OPTIONS} if quick else {}
    return cp.CorpusSpec(samples, grid_size=grid, seed=seed, format="parquet", **extra)


def _build(engine, samples: int, grid: int, quick: bool) -> dict:
    """A warm-up corpus, then the timed one; the timed run's figures and digest."""
    with tempfile.TemporaryDirectory(prefix="sphyr_bench_corpus_") as tmp:
        cp.build_corpus(_spec(max(2, samples // 4), grid, 1, quick), pathlib.Path(tmp, "warm"),
                        engine=engine)
        start = time.perf_counter()
        summary = cp.build_corpus(_spec(samples, grid, 0, quick), pathlib.Path(tmp, "timed"),
                                  engine=engine)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "samples_per_second": samples / seconds,
                "drawn": summary["drawn"], "solved": summary["solved"],
                "digest": _digest(pathlib.Path(tmp, "timed"))}


def _cluster_engine(cores: int):
    """A local two-node cluster of ``cores`` CPUs in all, and an engine connected to it."""
    from tests.ray_cluster import HEAD_IP, LocalCluster

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    nodes = LocalCluster(env, cpus_per_node=max(1, cores // 2)).start()
    try:
        module = nodes.connect()
        engine = RayEngine(nodes.address, node_ip_address=HEAD_IP)
        nodes.wait_for_nodes(module)
    except BaseException:
        nodes.stop()
        raise
    return nodes, engine


def throughput(samples: int, grids, cores: int, quick: bool, ray: bool) -> list[dict]:
    rows = []
    for grid in grids:
        with LocalEngine(cores) as engine:
            local = _build(engine, samples, grid, quick)
        rows.append({"kind": "throughput", "engine": f"in-process, {cores} threads",
                     "grid": grid, "samples": samples, **local,
                     "per_core": local["samples_per_second"] / cores})
    if not ray:
        return rows
    nodes, engine = _cluster_engine(cores)
    used = 2 * max(1, cores // 2)
    try:
        for grid, local in zip(grids, list(rows), strict=True):
            remote = _build(engine, samples, grid, quick)
            rows.append({"kind": "throughput", "engine": f"Ray, 2 nodes, {used} CPUs",
                         "grid": grid, "samples": samples, **remote,
                         "per_core": remote["samples_per_second"] / used,
                         "same_bytes": remote["digest"] == local["digest"],
                         "ray_vs_in_process": (remote["samples_per_second"] / used)
                         / local["per_core"]})
    finally:
        engine.close()
        nodes.stop()
    return rows


def _random_index(count: int, grid: int, seed: int) -> SampleIndex:
    """``count`` v2 layouts (keyed draws, no distance) and random 0.3-full easy answers."""
    rules = V2Rules(grid_size=grid)
    rng = np.random.default_rng(seed)
    index = SampleIndex((grid, grid))
    cells = grid * grid
    loads, supports = [], []
    i = 0
    while len(loads) < count:
        c = rules.draw(np.random.default_rng([seed, i]))
        i += 1
        if not isinstance(c, str):
            loads.append(c.load_mask)
            supports.append(c.support_mask)
    solid = np.zeros((count, cells), bool)
    picks = np.argsort(rng.random((count, cells)), axis=1)[:, : round(0.3 * cells)]
    np.put_along_axis(solid, picks, True, axis=1)
    index.add(np.stack(loads), np.stack(supports), solid.reshape(count, grid, grid))
    return index


def checks(count: int, grids, per_core: dict, candidates: int = 2000) -> list[dict]:
    """The screens of ``candidates`` new candidates against ``count`` accepted samples."""
    rows = []
    for grid in grids:
        index = _random_index(count, grid, 0)
        probe = _random_index(candidates, grid, 1)
        exclusion = load_exclusion_index(grid)
        layouts, structures = probe.layouts, probe.structures
        start = time.perf_counter()
        for k in range(candidates):  # as the driver screens: one candidate at a time
            index.layout_too_close(layouts[k: k + 1])
            exclusion.layout_too_close(layouts[k: k + 1])
            index.structure_too_close(structures[k: k + 1])
            exclusion.structure_too_close(structures[k: k + 1])
        each = (time.perf_counter() - start) / candidates
        rate = per_core.get(grid)
        rows.append({"kind": "checks", "grid": grid, "accepted": count,
                     "seconds_per_candidate": each,
                     # a sample costs 1/rate core-seconds; each needs ~1-3 screened candidates
                     "share_of_a_run_per_core": None if not rate else each * 3 * rate})
    return rows


def capacity(draws: int, grids) -> list[dict]:
    rows = []
    for grid in grids:
        rules = V2Rules(grid_size=grid)
        index = SampleIndex((grid, grid))
        exclusion = load_exclusion_index(grid)
        start = time.perf_counter()
        for i in range(draws):
            c = rules.draw(np.random.default_rng([0, i]))
            if isinstance(c, str):
                continue
            bits = layout_bits(c.load_mask, c.support_mask)[None]
            if not exclusion.layout_too_close(bits)[0] and not index.layout_too_close(bits)[0]:
                index.add_packed(layouts=bits, structures=pack_cells(c.load_mask)[None])
        rows.append({"kind": "capacity", "grid": grid, "draws": draws,
                     "layouts_6_apart": len(index), "seconds": time.perf_counter() - start})
    return rows


def thousand(quick: bool, cores: int, min_layout: int) -> dict:
    """1,000 samples at 10x10 in-process (``min_layout`` between them: at the v2 distance of
    6 a 10x10 corpus runs out of room before 1,000)."""
    spec = dataclasses.replace(_spec(1000, 10, 0, quick), min_layout=min_layout)
    with tempfile.TemporaryDirectory(prefix="sphyr_bench_corpus_") as tmp, \
            LocalEngine(cores) as engine:
        start = time.perf_counter()
        summary = cp.build_corpus(spec, pathlib.Path(tmp, "k"), engine=engine)
        seconds = time.perf_counter() - start
    return {"kind": "thousand", "grid": 10, "samples": 1000, "seconds": seconds,
            "min_layout": min_layout,
            "drawn": summary["drawn"], "rejected": summary["rejected"]}


COLUMNS = ("kind", "grid", "engine / what", "samples/s", "per core", "notes")


def _cells(r: dict) -> list[str]:
    """One row of the table, as strings."""
    if r["kind"] == "throughput":
        note = f"{r['samples']} samples in {r['seconds']:.1f} s"
        if "same_bytes" in r:
            note += (f"; same bytes: {r['same_bytes']}; Ray/in-process per core "
                     f"{r['ray_vs_in_process']:.2f}")
        return ["throughput", str(r["grid"]), r["engine"], f"{r['samples_per_second']:.3g}",
                f"{r['per_core']:.3g}", note]
    if r["kind"] == "checks":
        share = r["share_of_a_run_per_core"]
        return ["checks", str(r["grid"]), f"{r['accepted']:,} accepted samples", "", "",
                f"{r['seconds_per_candidate'] * 1e3:.2f} ms per candidate"
                + (f", {100 * share:.2g}% of a run" if share else "")]
    if r["kind"] == "thousand":
        return ["1,000 samples", "10", "in-process", f"{1000 / r['seconds']:.3g}", "",
                f"{r['seconds'] / 60:.1f} min, {r['drawn']} drawn, layouts "
                f"{r['min_layout']} cells apart"]
    return ["capacity", str(r["grid"]), f"{r['draws']:,} draws", "", "",
            f"{r['layouts_6_apart']:,} layouts 6 cells apart"]


def _table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---:|---|---:|---:|---|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--grids", default="10,20")
    parser.add_argument("--quick", action="store_true", help="QUICK_V2_OPTIONS (smoke runs)")
    parser.add_argument("--thousand", action="store_true")
    parser.add_argument("--thousand_min_layout", type=int, default=5,
                        help="layout distance between the 1,000 samples (6 leaves too little "
                             "room on 10x10)")
    parser.add_argument("--check_samples", type=int, default=100_000)
    parser.add_argument("--capacity_draws", type=int, default=200_000)
    parser.add_argument("--skip", default="", help="comma list: throughput,ray,checks,capacity")
    parser.add_argument("--json", default=None, help="also write the run's results file here")
    args = parser.parse_args()
    sphyr_jax.enable_x64()
    sphyr_jax.enable_compilation_cache()
    grids = [int(g) for g in args.grids.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    rows: list[dict] = []
    if "throughput" not in skip:
        rows += throughput(args.samples, grids, args.cores, args.quick, "ray" not in skip)
    rates = {r["grid"]: r["per_core"] for r in rows
             if r["kind"] == "throughput" and r["engine"].startswith("in-process")}
    if "checks" not in skip:
        rows += checks(args.check_samples, grids, rates)
    if "capacity" not in skip:
        rows += capacity(args.capacity_draws, grids)
    if args.thousand:
        rows.append(thousand(args.quick, args.cores, args.thousand_min_layout))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"cores {args.cores}, load average {load}")
    print(_table(rows))
    write_record(args.json, "corpus", title="Training corpora",
                 tables=[record_table(COLUMNS, [_cells(r) for r in rows])],
                 figures=json.loads(json.dumps(rows, default=str)))


if __name__ == "__main__":
    main()
