"""Rescore, validate and the app's flag files, on the stored reference data.

Optima come from the session's cache (filled by the yardstick test when it
runs first), so these tests mostly exercise scoring and file handling.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil

import numpy as np
import pytest
from conftest import FULL_EASY, REPO, RTOL_REFERENCE, SHARED, require_shared, run_app, store_optima

from sphyr_jax.scoring.results import (
    AGGREGATE_KEYS,
    AGGREGATED_SUFFIX,
    RECORD_METRIC_KEYS,
    aggregate,
    rescore_tree,
)
from sphyr_jax.scoring.static import STATIC_METRIC_KEYS, static_metrics
from sphyr_jax.scoring.validation import probe_completions, validate_records

METRIC_FIELDS = (
    "physically_valid", "load_carrying", "compliance", "ground_truth_compliance",
    "optimal_compliance", "own_budget_optimal_compliance", "topology_score",
    "structural_efficiency", "structural_efficiency_raw", "design_efficiency",
    "material_efficiency", "compliance_efficiency_vs_ground_truth", "volume_fraction",
    "ground_truth_volume_fraction", "volume_ratio", "max_displacement", "unfilled_cells",
    "unparsable_cells", "invalid_reason", "solver_result",
)

# The published validate table (full_easy, 20 samples): probe -> (topo score,
# stiffness, material, vs GT, volume, carrying).
SEED_TABLE = {
    "dataset answer": (0.933, 0.933, 1.000, 1.000, 0.285, 1.000),
    "2 cells flipped": (0.804, 0.843, 0.909, 0.896, 0.296, 0.950),
    "10 cells flipped": (0.476, 0.599, 0.735, 0.639, 0.348, 0.900),
    "filled solid": (0.285, 1.000, 0.285, 1.000, 1.000, 1.000),
    "left empty": (0.000, 0.000, 0.000, 0.000, 0.095, 0.000),
}


@pytest.fixture(scope="module")
def stripped_tree(tmp_path_factory, gpt4o_records, claude_records):
    """A copy of the stored results with every metric field removed."""
    root = tmp_path_factory.mktemp("results")
    originals = {}
    for folder, records, subject in (
        ("gpt-4o-2024-08-06", gpt4o_records, "full_easy"),
        # Claude's records carry no stored metrics: 16 of them test that other
        # fields survive (and keep the test short).
        ("claude-3-7-sonnet-20250219", claude_records[:16], "10_random_cell_hard"),
    ):
        stripped = [{k: v for k, v in r.items() if k not in METRIC_FIELDS} for r in records]
        path = root / folder / f"{subject}_results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(stripped, indent=2))
        originals[folder] = (records, stripped)
    return root, originals


@pytest.fixture(scope="module")
def rescored(stripped_tree, optimum_cache):
    root, originals = stripped_tree
    summary = rescore_tree(root, cache=optimum_cache)
    return root, originals, summary


def _read(path):
    return json.loads(pathlib.Path(path).read_text())


def test_rescore_restores_reference_metrics(rescored):
    root, originals, summary = rescored
    stored, _ = originals["gpt-4o-2024-08-06"]
    new = _read(root / "gpt-4o-2024-08-06" / "full_easy_results.json")
    assert len(new) == len(stored)
    same = 0
    for old, rec in zip(stored, new, strict=True):
        assert rec["load_carrying"] == old["load_carrying"]
        assert rec["ground_truth_compliance"] == pytest.approx(old["ground_truth_compliance"],
                                                               rel=RTOL_REFERENCE)
        if old["load_carrying"]:
            assert rec["compliance"] == pytest.approx(old["compliance"], rel=RTOL_REFERENCE)
            assert rec["max_displacement"] == pytest.approx(old["max_displacement"],
                                                            rel=RTOL_REFERENCE)
        # The reference yardstick reproduces the published optimum (the
        # yardstick tests list any record that differs).
        same += rec["optimal_compliance"] == pytest.approx(old["optimal_compliance"],
                                                           rel=RTOL_REFERENCE)
        same += rec["topology_score"] == pytest.approx(old["topology_score"],
                                                       rel=RTOL_REFERENCE, abs=1e-12)
        for key in ("volume_fraction", "ground_truth_volume_fraction", "volume_ratio"):
            assert rec[key] == pytest.approx(old[key], rel=1e-12)
        assert rec["unfilled_cells"] == old["unfilled_cells"]
        assert rec["unparsable_cells"] == old["unparsable_cells"]
        assert rec["physically_valid"] == old["physically_valid"]
    assert same >= 0.98 * 2 * len(stored)
    assert summary.records == 116 and summary.files == 2 and not summary.skipped
    assert summary.optimum == "reference"


def test_rescore_leaves_other_fields_alone(rescored):
    root, originals, _ = rescored
    for folder, (_, stripped) in originals.items():
        (path,) = [p for p in (root / folder).glob("*_results.json")
                   if not p.name.endswith(AGGREGATED_SUFFIX)]
        new = _read(path)
        for before, after in zip(stripped, new, strict=True):
            for key, value in before.items():
                if key not in STATIC_METRIC_KEYS:  # the stored exact_match is recomputed
                    assert after[key] == value
            assert list(after)[: len(before)] == list(before)  # key order kept
            assert set(after) == set(before) | set(METRIC_FIELDS) | set(STATIC_METRIC_KEYS)


STATIC_TYPES = {"valid_output_grid": bool, "exact_match": bool,
                "load_support_connected": bool,
                "load_support_connected_force_directional": bool,
                "isolated_clusters_count": int}


def test_rescore_fills_every_static_field(rescored):
    root, originals, _ = rescored
    for folder, (stored, _) in originals.items():
        (path,) = [p for p in (root / folder).glob("*_results.json")
                   if not p.name.endswith(AGGREGATED_SUFFIX)]
        new = _read(path)
        assert len(new) == len(stored)
        for old, rec in zip(stored, new, strict=True):
            assert set(RECORD_METRIC_KEYS) <= set(rec)
            for key in STATIC_METRIC_KEYS:
                assert type(rec[key]) is STATIC_TYPES.get(key, float), (folder, key)
            # Both stored files carry the published harness's exact_match.
            assert rec["exact_match"] == old["exact_match"]
            assert not rec["valid_output_grid"] or rec["physically_valid"]
            assert 0.0 <= rec["force_path_cost_average_efficiency_ratio"] <= 1.0
            assert 0.0 <= rec["difficulty_score"] <= 3.0
            # The same figures as the public one-record function, on the same text.
            alone = static_metrics(old["completion"], old["ground_truth"], old["prompt"])
            assert {k: rec[k] for k in STATIC_METRIC_KEYS} == alone.as_dict()
        assert sum(r["valid_output_grid"] for r in new) >= 0.9 * len(new)
        assert sum(r["load_support_connected"] for r in new) >= 0.5 * len(new)
        assert all(r["difficulty_score"] > 0 for r in new)


def test_rescore_aggregates_consistent(rescored):
    root, _, summary = rescored
    for path in root.glob(f"*/*{AGGREGATED_SUFFIX}"):
        agg = _read(path)
        records = _read(str(path).replace(AGGREGATED_SUFFIX, "_results.json"))
        assert agg["evaluated_samples"] == len(records)
        assert set(AGGREGATE_KEYS) == set(STATIC_METRIC_KEYS) | {
            "topology_score", "structural_efficiency", "material_efficiency",
            "compliance_efficiency_vs_ground_truth", "load_carrying", "volume_ratio"}
        for key in AGGREGATE_KEYS:
            assert agg[f"total_{key}"] == pytest.approx(
                sum(float(r[key] or 0.0) for r in records), rel=1e-12, abs=1e-12), key
    by_model = {row["model"]: row for row in summary.leaderboard}
    gpt = _read(root / "gpt-4o-2024-08-06" / "full_easy_results.json")
    assert by_model["gpt-4o-2024-08-06"]["topology_score"] == pytest.approx(
        np.mean([r["topology_score"] for r in gpt]), rel=1e-12)


def test_rescore_is_idempotent(rescored, optimum_cache):
    root, _, _ = rescored
    before = {p: p.read_bytes() for p in root.rglob("*.json")}
    summary = rescore_tree(root, cache=optimum_cache)
    assert summary.optimisations == 0
    after = {p: p.read_bytes() for p in root.rglob("*.json")}
    assert before == after


def test_dry_run_writes_nothing(stripped_tree, optimum_cache, tmp_path):
    root, _ = stripped_tree
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    before = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    summary = rescore_tree(copy, dry_run=True, cache=optimum_cache)
    after = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert before == after and summary.records == 116 and not summary.written


HOSTILE = [None, "", "I cannot solve this.", 12, math.nan, "1e308 " * 10,
           "nan inf -inf", "１ ０ １", [["1"] * 3] * 2, {"grid": 1}, "[[", "\x00" * 50]


def test_hostile_completions_and_corrupt_files(tmp_path, gpt4o_records, optimum_cache):
    base = gpt4o_records[0]
    records = [dict(base, completion=c) for c in HOSTILE]
    records.append({k: v for k, v in base.items() if k != "completion"})
    records.append(dict(base, ground_truth=None))
    records += [dict(base, gravity_dir=[0, 0]), dict(base, gravity_dir=[1, [2]])]
    records.append(dict(base))  # a normal record scores normally
    good = tmp_path / "model-a" / "full_easy_results.json"
    good.parent.mkdir()
    good.write_text(json.dumps(records, allow_nan=True))
    truncated = tmp_path / "model-b" / "full_easy_results.json"
    truncated.parent.mkdir()
    text = json.dumps([dict(base)], indent=2)
    truncated.write_text(text[: len(text) // 2])
    not_a_list = tmp_path / "model-c" / "full_easy_results.json"
    not_a_list.parent.mkdir()
    not_a_list.write_text('{"records": []}')
    bad_agg = tmp_path / "model-a" / "full_easy_aggregated_results.json"
    bad_agg.write_text("{not json")
    frozen = {p: p.read_bytes() for p in (truncated, not_a_list, bad_agg)}

    logged = []
    summary = rescore_tree(tmp_path, cache=optimum_cache, log=logged.append)
    reported = {path for path, _ in summary.skipped}
    assert reported == {str(truncated), str(not_a_list), str(bad_agg)}
    assert len([line for line in logged if line.startswith("skipped")]) == 3
    # Records whose own fields are unusable are named (file and index) with the reason.
    invalid = [line for line in logged if line.startswith("invalid record")]
    n = len(HOSTILE)
    assert [(i, reason.split(" ")[0]) for _, i, reason in summary.invalid] == [
        (n + 1, "ground"), (n + 2, "gravity_dir"), (n + 3, "gravity_dir")]
    assert invalid == [f"invalid record: {good} [{i}]: {reason}"
                       for _, i, reason in summary.invalid]
    for path, data in frozen.items():
        assert path.read_bytes() == data  # byte-for-byte untouched
    out = _read(good)
    assert len(out) == len(records)
    for rec in out[:-1]:
        assert rec["physically_valid"] is False
        assert rec["topology_score"] == 0.0 and rec["compliance"] is None
        assert rec["valid_output_grid"] is False and rec["difference_ratio"] == 0.0
    assert out[-1]["physically_valid"] is True and out[-1]["valid_output_grid"] is True
    assert out[-1]["compliance"] == pytest.approx(base["compliance"], rel=RTOL_REFERENCE)
    assert summary.invalid_records == len(records) - 1
    # Untouched record content survives, NaN included.
    assert math.isnan(out[4]["completion"])


def test_aggregate_merges_existing_fields():
    existing = {"exact_match": 3, "total_topology_score": 99.0}
    recs = [{"topology_score": 0.5, "load_carrying": True}, {"topology_score": None}]
    agg = aggregate(recs, existing)
    assert agg["exact_match"] == 3
    assert agg["total_topology_score"] == 0.5
    assert agg["total_load_carrying"] == 1.0
    assert agg["evaluated_samples"] == 2


# ----------------------------------------------------------------------------
# validate


def test_probes_follow_the_published_recipe():
    import random

    gt = [list("0LL0"), list("0110"), list("0100"), list("0SS0")]
    probes = probe_completions(gt, random.Random(3), hard=False)
    rng = random.Random(3)
    cells = [(r, c) for r in range(4) for c in range(4) if gt[r][c] not in "LS"]
    two = rng.sample(cells, 2)
    ten = rng.sample(cells, 10)
    for name, picked in (("2 cells flipped", two), ("10 cells flipped", ten)):
        diff = {(r, c) for r in range(4) for c in range(4) if probes[name][r][c] != gt[r][c]}
        assert diff == set(picked)
    assert all(t in "LS1" for row in probes["filled solid"] for t in row)
    assert all(t in "LS0" for row in probes["left empty"] for t in row)
    hard = probe_completions(gt, random.Random(3), hard=True)
    rng = random.Random(3)
    for _ in rng.sample(cells, 2):  # the 2-cell probe's draws come first
        rng.choice([0.0, 0.2, 0.5, 0.7, 1.0])
    expected = [row[:] for row in gt]
    for r, c in rng.sample(cells, 10):
        expected[r][c] = f"{rng.choice([0.0, 0.2, 0.5, 0.7, 1.0]):.1f}"
    assert hard["10 cells flipped"] == expected


def _seed_table() -> list[str]:
    """The published validate table, as printed in the seed's README."""
    path = SHARED.parent / "seed" / "SPhyR_README.txt"
    require_shared(path)
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("completion "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("Reference optimiser"))
    return [line.rstrip() for line in lines[start: end + 1]]


def test_validate_matches_published_table(full_easy_records, optimum_cache):
    """With the reference yardstick the table is the published one, digit for digit."""
    report = validate_records(full_easy_records[:20], "full_easy", cache=optimum_cache)
    rows = {row["probe"]: row for row in report.rows}
    assert list(rows) == list(SEED_TABLE)
    for probe, seed in SEED_TABLE.items():
        got = tuple(round(rows[probe][field], 3) for field in (
            "topology_score", "structural_efficiency", "material_efficiency",
            "compliance_efficiency_vs_ground_truth", "volume_fraction", "load_carrying"))
        assert got == seed, probe
    assert report.beaten == 0 and report.optimum == "reference"
    assert [line.rstrip() for line in report.table().splitlines()] == _seed_table()


# ----------------------------------------------------------------------------
# The app and its flag files.



def test_rescore_flagfile(stripped_tree, optimum_cache, tmp_path, monkeypatch, capsys):
    root, _ = stripped_tree
    copy = tmp_path / "tree"
    shutil.copytree(root, copy)
    out_json = tmp_path / "board.json"
    status = run_app(["rescore", f"--flagfile={REPO / 'configs' / 'rescore.cfg'}",
                       f"--results_root={copy}", f"--output_json={out_json}",
                       "--progress=false"], monkeypatch, optimum_cache)
    assert status == 0
    text = capsys.readouterr().out
    assert "devices=" in text and "rescored 116 records" in text
    board = _read(out_json)["rows"]
    assert {r["model"] for r in board} == {"gpt-4o-2024-08-06", "claude-3-7-sonnet-20250219"}
    assert (copy / "gpt-4o-2024-08-06" / "full_easy_aggregated_results.json").exists()


def test_validate_flagfile(optimum_cache, tmp_path, monkeypatch, capsys):
    require_shared(FULL_EASY)
    out_json = tmp_path / "validate.json"
    status = run_app(["validate", f"--flagfile={REPO / 'configs' / 'validate.cfg'}",
                       f"--dataset_dir={SHARED / 'datasets'}", f"--output_json={out_json}",
                       "--progress=false"], monkeypatch, optimum_cache)
    assert status == 0
    text = capsys.readouterr().out
    assert "Reference optimiser beaten by the dataset answer on 0/20 samples." in text
    assert "(optimum=reference)" in text
    for line in _seed_table():
        assert line in text
    assert _read(out_json)["samples"] == 20


def test_usage_errors(monkeypatch, optimum_cache, tmp_path, capsys):
    assert run_app(["nonsense"], monkeypatch, optimum_cache) == 2
    assert "unknown command 'nonsense'" in capsys.readouterr().err
    assert run_app(["convert"], monkeypatch, optimum_cache) == 2
    assert "convert needs --raw_dir" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_app(["rescore", f"--results_root={empty}", "--progress=false"],
                    monkeypatch, optimum_cache) == 1


KILL_SCRIPT = """
import os, signal, sys
import jax
jax.config.update("jax_enable_x64", True)
from sphyr_jax import io
from sphyr_jax.scoring import results
from sphyr_jax.topopt.optimum import OptimumCache

root, cache_dir, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
original = io._write_temp
count = [0]

def dying(path, writer, encoding):
    count[0] += 1
    if count[0] != kill_at:
        return original(path, writer, encoding)

    def half_then_die(handle):
        writer(handle)
        handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # mid-write: temp file done, not renamed

    return original(path, half_then_die, encoding)

io._write_temp = dying
results.rescore_tree(root, cache=OptimumCache(cache_dir))
"""


@pytest.mark.parametrize("kill_at", [1, 3])
def test_kill_during_rescore_loses_nothing(kill_at, tmp_path, gpt4o_records, optimum_cache):
    import subprocess
    import sys

    records = [{k: r[k] for k in ("subject", "prompt", "ground_truth", "completion")}
               for r in gpt4o_records[:3]]
    root = tmp_path / "results"
    for model in ("model-a", "model-b"):
        (root / model).mkdir(parents=True)
        (root / model / "full_easy_results.json").write_text(json.dumps(records))
    before = {p: p.read_bytes() for p in root.rglob("*.json")}
    store_optima(tmp_path / "optima", records, optimum_cache)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(root),
                           str(tmp_path / "optima"), str(kill_at)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    # Writes go results, aggregates, results, ...: files before the kill are
    # new and complete, the one being written and later ones are the old bytes.
    targets = [root / "model-a" / "full_easy_results.json",
               root / "model-a" / "full_easy_aggregated_results.json",
               root / "model-b" / "full_easy_results.json"]
    for j, path in enumerate(targets):
        if j < kill_at - 1:
            data = json.loads(path.read_text())
            assert data  # complete, parseable, new
            if path.name.endswith(AGGREGATED_SUFFIX):
                assert data["evaluated_samples"] == len(records)
            else:
                assert all("topology_score" in r for r in data)
        elif path in before:
            assert path.read_bytes() == before[path]
        else:
            assert not path.exists()
    # Re-running completes the job; the result equals an uninterrupted run.
    rescore_tree(root, cache=optimum_cache)
    clean = tmp_path / "clean"
    for model in ("model-a", "model-b"):
        (clean / model).mkdir(parents=True)
        (clean / model / "full_easy_results.json").write_text(json.dumps(records))
    rescore_tree(clean, cache=optimum_cache)
    for path in clean.rglob("*_results.json"):
        assert path.read_bytes() == (root / path.relative_to(clean)).read_bytes()


# ----------------------------------------------------------------------------
# score_records: the scoring step the evaluation harness calls.


def _turned(record: dict) -> dict:
    """The record turned by 180 degrees (grids as text), its load pointing up."""
    from sphyr_jax.scoring.static import read_grid

    def turn(text):
        return "\n".join(" ".join(row[::-1]) for row in read_grid(text)[::-1])

    return dict(record, prompt=turn(record["prompt"]), completion=turn(record["completion"]),
                ground_truth=turn(record["ground_truth"]))


def test_score_records_physics_and_static_share_the_direction(gpt4o_records, optimum_cache):
    from sphyr_jax.scoring.metrics import (
        METRIC_FIELDS as STRUCTURAL_FIELDS,
    )
    from sphyr_jax.scoring.metrics import (
        CompletionMetrics,
        StructuralMetrics,
        get_structural_metrics,
    )
    from sphyr_jax.scoring.results import score_records

    record = gpt4o_records[0]
    (fields,) = score_records([record], cache=optimum_cache)
    assert tuple(fields) == RECORD_METRIC_KEYS
    # The default outputs are unchanged; static=True adds the static fields.
    plain = get_structural_metrics(record["completion"], record["ground_truth"],
                                   record["prompt"], cache=optimum_cache)
    assert type(plain) is StructuralMetrics and tuple(plain.as_dict()) == STRUCTURAL_FIELDS
    full = get_structural_metrics(record["completion"], record["ground_truth"],
                                  record["prompt"], cache=optimum_cache, static=True)
    assert isinstance(full, CompletionMetrics) and full.as_dict() == fields
    assert {k: fields[k] for k in STRUCTURAL_FIELDS} == plain.as_dict()
    assert {k: fields[k] for k in STATIC_METRIC_KEYS} == static_metrics(
        record["completion"], record["ground_truth"], record["prompt"]).as_dict()

    # Turned upside down with the load pointing up, from the record or from the
    # caller (a folder's rule): the same problem, so the same compliances, and
    # the same static figures (both searches and the path costs turn with it).
    turned = _turned(record)
    from_record = score_records([dict(turned, gravity_dir=[-1, 0])], cache=optimum_cache)[0]
    from_caller = score_records([turned], gravity=(-1.0, 0.0), cache=optimum_cache)[0]
    assert from_record == from_caller
    for key in ("compliance", "ground_truth_compliance"):
        assert from_record[key] == pytest.approx(fields[key], rel=1e-9)
    for key in STATIC_METRIC_KEYS:
        assert from_record[key] == pytest.approx(fields[key], rel=1e-12, abs=1e-12), key
    # The same grids with the load pointing down do not carry it the same way.
    down = score_records([turned], cache=optimum_cache)[0]
    assert down["load_support_connected_force_directional"] is False
    assert fields["load_support_connected_force_directional"] is True
