"""Baseline results files (sphyr_jax.evaluation.baselines) on a small hand-made dataset."""

import json

import numpy as np
import pytest

from sphyr_jax import extract_grid
from sphyr_jax.data.datasets import is_hard, list_subjects, load_subject
from sphyr_jax.data.generate import GRAVITY_FILE, render_raw_csv, write_subjects_from_raw
from sphyr_jax.evaluation import baselines
from sphyr_jax.evaluation.prompts import build_prompt
from sphyr_jax.io import read_json
from sphyr_jax.problem.grids import grid_to_text

# Three 5x5 canonical designs: load runs on the top row, supports on the bottom row.
DESIGNS = [
    ("L L L 0 0", "0 1 0 0 0", "0 1 0 0 0", "0 1 1 0 0", "0 S S S 0"),
    ("0 0 L L 0", "0 0 1 1 0", "0 1 1 0 0", "1 1 0 0 0", "S S 0 0 0"),
    ("0 L L L L", "0 1 0 0 1", "0 1 0 0 1", "0 1 1 1 1", "S S 0 0 S"),
]


def _write_raw(folder, gravity=None):
    folder.mkdir(parents=True)
    for i, rows in enumerate(DESIGNS):
        tokens = np.array([r.split() for r in rows], dtype=object)
        density = np.where(np.isin(tokens, ["L", "S", "1"]), 1.0, 0.0)
        (folder / f"{i}_SPhyR_2D.csv").write_text(
            render_raw_csv(density, tokens == "L", tokens == "S"))
    if gravity is not None:
        (folder / GRAVITY_FILE).write_text(json.dumps(gravity))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline_data")
    _write_raw(root / "raw")
    write_subjects_from_raw(root / "raw", root)
    return root


@pytest.fixture(scope="module")
def results(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("baseline_results")
    paths = baselines.write_baseline_results(dataset, out, seed=0)
    return out, paths


def _cells(text):
    return [row.split() for row in text.split("\n")]


def test_every_model_and_subject_is_written_and_readable(results):
    out, paths = results
    assert len(paths) == len(baselines.MODELS) * 16
    for model in baselines.MODELS:
        for subject in list_subjects():
            records = read_json(out / model / f"{subject}_results.json")
            assert len(records) == len(DESIGNS)
            for record in records:
                assert set(record) == {"subject", "prompt", "ground_truth", "completion"}
                assert record["subject"] == subject


@pytest.mark.parametrize("subject", ["full_easy", "10_random_cell_hard", "3_random_column_hard"])
def test_prompts_hold_the_input_grid_and_the_right_instructions(dataset, results, subject):
    out, _ = results
    records = load_subject(dataset, subject)
    stored = read_json(out / "empty" / f"{subject}_results.json")
    for record, row in zip(records, stored, strict=True):
        assert extract_grid(row["prompt"]) == record["input_grid"]
        assert grid_to_text(record["input_grid"]) in row["prompt"]
        assert row["ground_truth"] == grid_to_text(record["ground_truth"])
        assert ("one decimal" in row["prompt"]) == is_hard(subject)
        # No load direction stored: the benchmark's own (published) prompt.
        assert row["prompt"] == build_prompt(record["input_grid"], subject)
        assert row["prompt"].startswith("You are given a structural material distribution")


@pytest.mark.parametrize("subject", ["full_easy", "full_hard", "5_random_cell_easy",
                                     "1_random_row_hard"])
def test_completions_fill_exactly_the_masked_cells(dataset, results, subject):
    out, _ = results
    records = load_subject(dataset, subject)
    files = {m: read_json(out / m / f"{subject}_results.json") for m in baselines.MODELS}
    hard = is_hard(subject)
    allowed = {f"{v / 10:.1f}" for v in range(11)} if hard else {"0", "1"}
    for i, record in enumerate(records):
        given = record["input_grid"]
        masked = np.array(given, dtype=object) == "V"
        assert masked.any()
        assert files["copy_input"][i]["completion"] == grid_to_text(given)
        for model, fill in (("empty", "0"), ("solid", "1"), ("random", None)):
            got = np.array(_cells(files[model][i]["completion"]), dtype=object)
            assert got.shape == masked.shape
            assert np.array_equal(got[~masked], np.array(given, dtype=object)[~masked])
            if fill is not None:
                assert set(got[masked]) == {f"{fill}.0" if hard else fill}
            else:
                assert set(got[masked]) <= allowed


def test_random_baseline_is_seeded(dataset, results, tmp_path):
    out, _ = results
    again = baselines.write_baseline_results(dataset, tmp_path / "a", seed=0, models=("random",))
    other = baselines.write_baseline_results(dataset, tmp_path / "b", seed=1, models=("random",))
    same = [p.read_text() for p in again]
    assert same == [(out / "random" / p.name).read_text() for p in again]
    assert same != [p.read_text() for p in other]
    # coin flips: both values appear among the many masked cells of the full subject
    tokens = set()
    for row in read_json(out / "random" / "full_easy_results.json"):
        tokens |= {t for r in _cells(row["completion"]) for t in r}
    assert {"0", "1"} <= tokens


def test_gravity_is_carried_into_results(tmp_path):
    gravity = {"0": [0, -1], "1": [-1, 0], "2": [0, 1]}
    _write_raw(tmp_path / "data" / "raw", gravity)
    write_subjects_from_raw(tmp_path / "data" / "raw", tmp_path / "data")
    baselines.write_baseline_results(tmp_path / "data", tmp_path / "res", models=("solid",))
    rows = read_json(tmp_path / "res" / "solid" / "full_easy_results.json")
    assert [r["gravity_dir"] for r in rows] == [gravity[str(i)] for i in range(3)]
    assert "pulls to the left" in rows[0]["prompt"] and "pulls straight up" in rows[1]["prompt"]
    for row, record in zip(rows, load_subject(tmp_path / "data", "full_easy"), strict=True):
        assert extract_grid(row["prompt"]) == record["input_grid"]


def test_bad_requests_write_nothing(dataset, tmp_path):
    with pytest.raises(ValueError, match="unknown baselines"):
        baselines.write_baseline_results(dataset, tmp_path / "res", models=("oracle",))
    with pytest.raises(ValueError, match="no subject files"):
        baselines.write_baseline_results(tmp_path, tmp_path / "res")
    assert not (tmp_path / "res").exists()
