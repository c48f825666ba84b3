"""The sharded path: four XLA CPU devices give the same figures as one.

JAX fixes its device count when it starts, so these tests run a fresh Python
process with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import COMPILE_CACHE, GPT4O_RESULTS, REPO, store_optima

from sphyr_jax.scoring.results import rescore_tree


def _run(code: str, *args: str, devices: int = 4) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    if COMPILE_CACHE:  # share the suite's persistent compilation cache
        env["JAX_COMPILATION_CACHE_DIR"] = COMPILE_CACHE
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)


SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    from sphyr_jax.topopt import simp
    from sphyr_jax.problem.grids import densities_from_grid, extract_grid
    from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
    from sphyr_jax.scoring.metrics import analyze_batch
    from sphyr_jax.topopt.options import StrongOptions
    from sphyr_jax.topopt.strong import strong_optimum_batch

    records = json.load(open(sys.argv[1]))[:13]
    cases = stack_load_cases([load_case_from_grid(r["ground_truth"], r["prompt"])
                              for r in records])
    designs = np.stack([densities_from_grid(extract_grid(r["completion"]))[0]
                        for r in records])
    out = {"devices": jax.local_device_count()}
    for n in (4, 1):
        a = analyze_batch(cases, designs, num_devices=n)
        opts = StrongOptions(simp=simp.SimpOptions(max_iterations=30), polish_passes=5,
                             tabu_passes=1, num_devices=n)
        o = strong_optimum_batch(stack_load_cases(
            [load_case_from_grid(r["ground_truth"], r["prompt"]) for r in records[:5]]),
            options=opts)
        out[n] = {"compliance": a.compliance.tolist(),
                  "max_displacement": a.max_displacement.tolist(),
                  "optimum": o.compliance.tolist(),
                  "designs": o.densities.tolist()}
    print(json.dumps(out))
""")


def test_four_devices_equal_one(gpt4o_records):
    proc = _run(SCRIPT, str(GPT4O_RESULTS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    four, one = out["4"], out["1"]
    # Shards of another batch size may round differently in the last bit.
    np.testing.assert_allclose(four["compliance"], one["compliance"], rtol=1e-12)
    np.testing.assert_allclose(four["max_displacement"], one["max_displacement"], rtol=1e-12)
    np.testing.assert_allclose(four["optimum"], one["optimum"], rtol=1e-9)
    np.testing.assert_array_equal(four["designs"], one["designs"])
    # And both equal the stored reference figures (13 is not a multiple of 4:
    # the padding inside must not leak into the results).
    for rec, c in zip(gpt4o_records[:13], four["compliance"], strict=True):
        if rec["load_carrying"]:
            assert c == pytest.approx(rec["compliance"], rel=1e-6)


def test_app_summary_says_four_devices(tmp_path, gpt4o_records, optimum_cache):
    records = gpt4o_records[:3]
    root = tmp_path / "results" / "gpt-4o-2024-08-06"
    root.mkdir(parents=True)
    stripped = [{k: r[k] for k in ("subject", "prompt", "ground_truth", "completion")}
                for r in records]
    (root / "full_easy_results.json").write_text(json.dumps(stripped))
    store_optima(tmp_path / "optima", records, optimum_cache)  # the subprocess only scores
    proc = _run("", "-m", "sphyr_jax", "rescore", f"--results_root={tmp_path / 'results'}",
                f"--cache_dir={tmp_path / 'optima'}", "--compilation_cache_dir=",
                "--progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "devices=4" in proc.stdout
    assert "optimisations=0" in proc.stdout
    sharded = json.loads((root / "full_easy_results.json").read_text())
    copy = tmp_path / "again" / "gpt-4o-2024-08-06"
    copy.mkdir(parents=True)
    (copy / "full_easy_results.json").write_text(json.dumps(stripped))
    rescore_tree(tmp_path / "again", cache=optimum_cache, num_devices=1)
    single = json.loads((copy / "full_easy_results.json").read_text())
    assert sharded == single


SCRIPT_3D = textwrap.dedent("""
    import json, pathlib
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    from sphyr_jax.data.convert import read_raw_csv_3d
    from sphyr_jax.problem.grids import densities_from_grid
    from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
    from sphyr_jax.scoring.metrics import analyze_batch

    files = sorted(pathlib.Path("sphyr_jax/data/sets/dataset_3d/raw").glob("*_SPhyR_3D.csv"))
    grids = [read_raw_csv_3d(p).grid("hard") for p in files]
    cases = stack_load_cases([load_case_from_grid(g) for g in grids])
    rho = np.stack([densities_from_grid(g)[0] for g in grids])
    rng = np.random.default_rng(0)
    for b in (0, 3):  # scattered islands: the direct fallback runs on some devices
        rho[b].flat[rng.choice(rho[b].size, 30, replace=False)] = rng.integers(1, 11, 30) / 10
    out = {"devices": jax.local_device_count()}
    for n in (4, 1):
        out[n] = analyze_batch(cases, rho, num_devices=n).compliance.tolist()
    print(json.dumps(out))
""")


def test_four_devices_equal_one_on_voxels():
    """Voxel analyses (multigrid CG, direct fallback on some samples) split over four
    devices run to completion and equal the one-device figures."""
    proc = _run(SCRIPT_3D)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    np.testing.assert_allclose(out["4"], out["1"], rtol=1e-12)
    assert all(np.isfinite(out["1"]))


SCRIPT_YARDSTICK = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
    from sphyr_jax.topopt.options import DEFAULT_REFERENCE
    from sphyr_jax.topopt.yardstick import reference_optimum_batch
    import dataclasses

    lines = open(sys.argv[1]).read().splitlines()[:8]
    records = [json.loads(line) for line in lines]
    cases = stack_load_cases([load_case_from_grid(r["ground_truth"], r["input_grid"])
                              for r in records])
    from sphyr_jax.fem.solvers import Banded
    from sphyr_jax.fem.structured import get_grid
    out = {"devices": jax.local_device_count(),
           "lapack": Banded().uses_lapack(get_grid(cases.shape))}
    for n in (4, 1):
        res = reference_optimum_batch(
            cases, options=dataclasses.replace(DEFAULT_REFERENCE, num_devices=n))
        out[n] = {"compliance": res.compliance.tolist(), "winner": res.winner.tolist(),
                  "designs": res.densities.tolist()}
    print(json.dumps(out))
""")


@pytest.mark.parametrize("dataset", ["sphyr_jax/data/sets/dataset/full_easy.jsonl",
                                     "sphyr_jax/data/sets/dataset_v2_20/1_random_cell_easy.jsonl"])
def test_reference_yardstick_on_four_devices_with_few_samples_each(dataset):
    """Eight samples over four devices (the published polish's small solves were
    batched LAPACK calls, which froze XLA's CPU pool when devices ran them at
    once): the run finishes and takes the same decisions as one device.  On
    the 20x20 set every device factors by LAPACK on the host at the same time
    (through the FFI target; the same calls made through ``jax.pure_callback``
    stalled this run) and reaches the same optima."""
    proc = _run(SCRIPT_YARDSTICK, dataset)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    assert out["lapack"] == ("v2_20" in dataset)
    assert out["4"]["winner"] == out["1"]["winner"]
    np.testing.assert_array_equal(out["4"]["designs"], out["1"]["designs"])
    np.testing.assert_allclose(out["4"]["compliance"], out["1"]["compliance"], rtol=1e-12)
