"""Training corpora in this process: held apart from the benchmark, optima stored and right,
the same bytes after a crash, readable by ``datasets`` and by ``prompt_dataset``."""

from __future__ import annotations

import functools
import json
import math
import pathlib
import shutil

import numpy as np
import pytest
from conftest import SETS, SHARED, require_shared, run_app

from sphyr_jax.data import corpus as cp
from sphyr_jax.data.datasets import list_subjects, load_subject, sidecar_path
from sphyr_jax.data.engines import LocalEngine
from sphyr_jax.data.exclusion import BenchmarkIndex, default_exclusion_dirs
from sphyr_jax.data.generate_v2 import QUICK_V2_OPTIONS
from sphyr_jax.errors import UserInputError
from sphyr_jax.problem.grids import extract_grid
from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
from sphyr_jax.rl import prompt_dataset
from sphyr_jax.topopt.optimum import optimum_batch, optimum_key

SPEC = cp.CorpusSpec(8, grid_size=10, seed=5, options=QUICK_V2_OPTIONS, format="parquet",
                     batch_size=8, window=4, file_samples=4)


def _exclusion_dirs() -> list[str]:
    """The shipped 10x10 benchmark sets and, where present, the published records."""
    shared = SHARED / "datasets"
    return default_exclusion_dirs(10) + ([str(shared)] if shared.is_dir() else [])


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    """Every data file and the card, by relative path (the manifest holds timings)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != cp.MANIFEST}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    index = BenchmarkIndex.from_dirs(_exclusion_dirs(), 10)
    summary = cp.build_corpus(SPEC, folder, exclusion=index)
    return folder, summary


def _tokens(folder, subject="full_easy"):
    """(layout codes, easy solid cells) of every record of an easy subject, from its tokens."""
    out = []
    for record in load_subject(folder, subject):
        answer = np.asarray(record["ground_truth"], dtype=object)
        codes = (answer == "L").astype(int) + 2 * (answer == "S")
        out.append((codes, (answer == "1") | (answer == "L") | (answer == "S")))
    return out


def test_layout_and_files(built):
    folder, summary = built
    assert summary["kept"] == 8 and summary["files"] == 2
    names = set(_files(folder))
    assert names == {"README.md"} | {f"{s}/train-0000{f}-of-00002.parquet"
                                     for s in list_subjects() for f in (0, 1)}
    assert not (folder / cp.WORK).exists()
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n- config_name: 1_random_cell_easy\n")
    assert card.count("config_name:") == 16
    drawn = summary["drawn"]
    assert sum(summary["rejected"].values()) == drawn - 8
    assert f"| {drawn} | " in card


def test_no_sample_is_near_an_excluded_or_another_sample(built):
    """Brute force over tokens: layouts 6 cells apart, easy answers 8, from every excluded
    sample of every folder and from each other; the layout rejections are recounted."""
    folder, summary = built
    ours = _tokens(folder)
    theirs = []
    for excluded in _exclusion_dirs():
        for name in list_subjects():
            if not (pathlib.Path(excluded) / f"{name}.jsonl").is_file():
                continue
            for codes, solid in _tokens(excluded, name):
                if codes.shape == (10, 10):
                    theirs.append((codes, solid if name.endswith("_easy") else None))
    assert len(theirs) > 1000
    for k, (codes, solid) in enumerate(ours):
        for other_codes, other_solid in theirs:
            assert np.count_nonzero(codes != other_codes) >= 6
            if other_solid is not None:
                assert np.count_nonzero(solid != other_solid) >= 8
        for other_codes, other_solid in ours[:k]:
            assert np.count_nonzero(codes != other_codes) >= 6
            assert np.count_nonzero(solid != other_solid) >= 8
    # Every candidate refused for an excluded layout is within 6 cells of one, by count.
    near = 0
    for i in range(summary["drawn"]):
        candidate = cp.draw_candidate(SPEC, i)
        if isinstance(candidate, str) or candidate.solid_cells - (
                candidate.load_mask | candidate.support_mask).sum() < 1:
            continue
        codes = candidate.layout()
        near += any(np.count_nonzero(codes != c) < 6 for c, _ in theirs)
    assert near == summary["rejected"]["excluded_layout"]


def _recomputed(records):
    cases, seeds = [], []
    for r in records:
        case = load_case_from_grid(r["ground_truth"], r["input_grid"],
                                   tuple(float(v) for v in r["gravity_dir"]))
        seed = np.asarray(case.pinned).copy()
        seed[np.asarray(case.load_mask | case.support_mask)] = 1.0
        cases.append(case)
        seeds.append(seed)
    return cases, seeds, optimum_batch(stack_load_cases(cases), np.stack(seeds))


def test_stored_optima_equal_recomputation(built):
    """Every record's optimum is its own masked problem's, keyed as a scorer keys it."""
    folder, _ = built
    records = [r for name in list_subjects() for r in load_subject(folder, name)]
    assert len(records) == 8 * 16
    cases, seeds, fresh = _recomputed(records)
    for k, record in enumerate(records):
        stored = record["optimum"]
        assert stored["yardstick"] == "reference"
        assert stored["key"] == optimum_key(cases[k], seeds[k])
        assert math.isclose(stored["compliance"], fresh.compliance[k], rel_tol=1e-9)
        np.testing.assert_allclose(stored["densities"], fresh.densities[k], rtol=0, atol=1e-9)
        assert stored["iterations"] == fresh.iterations[k]
    assert len({r["optimum"]["key"] for r in records}) == len(records)


def test_load_dataset_reads_every_subject(built, tmp_path):
    import datasets

    folder, _ = built
    for name in list_subjects():
        ours = load_subject(folder, name)
        full = datasets.load_dataset(str(folder), name=name, split="train",
                                     cache_dir=str(tmp_path / "hf"))
        streamed = list(datasets.load_dataset(str(folder), name=name, split="train",
                                              streaming=True))
        assert len(full) == len(streamed) == 8
        for a, b, c in zip(ours, full, streamed, strict=True):
            assert a["index"] == b["index"] == c["index"]
            assert a["input_grid"] == b["input_grid"] == c["input_grid"]
            assert a["optimum"]["key"] == b["optimum"]["key"] == c["optimum"]["key"]


def test_prompt_dataset_trains_on_the_corpus_and_tests_on_the_benchmark(built):
    folder, _ = built
    ds = prompt_dataset(folder, ["full_easy", "1_random_row_hard"], split="train",
                        conversational=True)
    assert len(ds) == 16 and "optimum" in ds.column_names
    records = {r["index"]: r for r in load_subject(folder, "full_easy")}
    for row in ds.filter(lambda r: r["subject"] == "full_easy"):
        assert row["optimum"]["key"] == records[row["index"]]["optimum"]["key"]
        assert "V" in row["input_grid"] and row["prompt"][0]["role"] == "user"
    with pytest.raises(UserInputError, match="split='train' reads a generated"):
        prompt_dataset(str(SETS / "dataset_v2"), ["full_easy"], split="train")
    with pytest.raises(UserInputError, match="training corpus: split='train'"):
        prompt_dataset(folder, ["full_easy"], split="test")
    assert "optimum" not in prompt_dataset(str(SETS / "dataset_v2"), ["full_easy"],
                                           split="test", sample_count=2).column_names


class _Crashing(LocalEngine):
    """A local engine whose driver 'dies' once ``tasks`` results came back."""

    def __init__(self, tasks: int, workers: int):
        super().__init__(workers)
        self.left = tasks

    def result(self, handle):
        if self.left == 0:
            raise KeyboardInterrupt("driver stopped")
        self.left -= 1
        return super().result(handle)


def test_a_crashed_run_started_again_writes_the_same_bytes(built, tmp_path):
    folder, _ = built
    index = BenchmarkIndex.from_dirs(_exclusion_dirs(), 10)
    again = tmp_path / "again"
    with pytest.raises(KeyboardInterrupt), _Crashing(3, workers=2) as engine:
        cp.build_corpus(SPEC, again, engine=engine, exclusion=index)
    manifest = json.loads((again / cp.MANIFEST).read_text())
    assert not manifest["complete"] and (again / cp.WORK / "solve").is_dir()
    reports = []
    with LocalEngine(2) as engine:
        summary = cp.build_corpus(SPEC, again, engine=engine, exclusion=index,
                                  progress=lambda *r: reports.append(r))
    assert _files(again) == _files(folder)
    # Progress: the written samples count on from what the first run wrote, to the total.
    written = [done for stage, done, total in reports if stage == "samples" and total == 8]
    assert written[0] == manifest["files_done"] * SPEC.samples_per_file
    assert written == sorted(written) and written[-1] == 8
    assert max(done for stage, done, _ in reports if stage == "accepted") == 8
    assert summary["tasks"]["solve"] < 3 + summary["batches"]  # cached solves not redone
    # Complete: a third run leaves it as it is; another spec is refused.
    assert cp.build_corpus(SPEC, again, exclusion=index)["resumed"]
    with pytest.raises(cp.CorpusError, match="holds another corpus"):
        cp.build_corpus(SPEC, again, exclusion=None, exclude_defaults=False)


def test_jsonl_corpus_verifies_its_optima_and_catches_a_wrong_one(tmp_path):
    spec = cp.CorpusSpec(4, grid_size=10, seed=5, options=QUICK_V2_OPTIONS, batch_size=8,
                         window=4)
    assert spec.format == "jsonl"
    out = tmp_path / "small"
    cp.build_corpus(spec, out, exclusion=BenchmarkIndex.from_dirs(_exclusion_dirs(), 10))
    assert sorted(p.name for p in out.glob("*.jsonl")) == sorted(
        f"{s}.jsonl" for s in list_subjects())
    assert all("optimum" in r for r in load_subject(out, "full_hard"))
    report = cp.verify_optima(out, 4, seed=1)
    assert report["checked"] >= 1 and report["largest_difference"] <= 1e-9
    path = out / "full_easy.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row["optimum"]["compliance"] *= 1.001
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(cp.OptimumMismatchError, match="full_easy sample"):
        cp.verify_optima(out, 60, seed=1)  # 60 picks over 16 subjects reach full_easy


def test_published_records_get_their_published_optima_beside_them(tmp_path):
    """The optima command's file on the published records: the stored GPT-4o results'
    optimal compliance of the same problems, to the yardstick's parity."""
    shared = require_shared(SHARED / "datasets")
    results = json.loads(require_shared(SHARED / "results" / "gpt-4o-2024-08-06"
                                        / "full_easy_results.json").read_text())
    folder = tmp_path / "published"
    shutil.copytree(shared, folder)
    summary = cp.add_optima(folder, subjects=["full_easy"])
    assert summary["records"] == {"full_easy": 40}
    assert sidecar_path(folder, "full_easy").is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["full_easy.jsonl", "full_hard.jsonl",
                                                       "optima"]
    assert (folder / "full_easy.jsonl").read_bytes() == (shared / "full_easy.jsonl").read_bytes()
    # The stored GPT-4o results hold the published optimal compliance of 100 published
    # full_easy problems: as a subject file, their optima come out the same.
    problems = tmp_path / "problems"
    problems.mkdir()
    (problems / "full_easy.jsonl").write_text("".join(
        json.dumps({"index": k, "input_grid": extract_grid(r["prompt"]),
                    "ground_truth": r["ground_truth"]}) + "\n" for k, r in enumerate(results)))
    cp.add_optima(problems)
    stored = [r["optimum"]["compliance"] for r in load_subject(problems, "full_easy")]
    agree = sum(math.isclose(ours, r["optimal_compliance"], rel_tol=1e-6)
                for ours, r in zip(stored, results, strict=True))
    assert agree >= 98, agree
    # A sidecar that no longer matches its records is refused, not misapplied.
    lines = sidecar_path(folder, "full_easy").read_text().splitlines()
    sidecar_path(folder, "full_easy").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(UserInputError, match="do not match"):
        load_subject(folder, "full_easy")


def test_app_generates_the_library_corpus(built, tmp_path, monkeypatch, capsys):
    quick = functools.partial(cp.CorpusSpec, options=QUICK_V2_OPTIONS, batch_size=8, window=4)
    monkeypatch.setattr(cp, "CorpusSpec", quick)
    out = tmp_path / "app"
    status = run_app(["generate", "--dataset_version=v2", "--num_samples=4", "--seed=5",
                      f"--output_dir={out}", "--progress=false", "--verify_optima=2",
                      "--workers=2"], monkeypatch)
    assert status == 0
    printed = capsys.readouterr().out
    assert "rejected: excluded_layout" in printed and "16 subject files" in printed
    library = tmp_path / "library"
    cp.build_corpus(quick(4, grid_size=10, seed=5), library)
    assert _files(out) == _files(library)


def test_app_optima_writes_a_sets_optima_beside_its_records(tmp_path, monkeypatch, capsys):
    """``optima`` on a benchmark-style folder: a sidecar per subject, the records untouched,
    and each record read back with its own optimum, equal to a recomputation."""
    folder = tmp_path / "set"
    folder.mkdir()
    source = (SETS / "dataset_v2" / "3_random_row_easy.jsonl").read_text().splitlines()
    (folder / "3_random_row_easy.jsonl").write_text("\n".join(source[:3]) + "\n")
    before = (folder / "3_random_row_easy.jsonl").read_bytes()
    status = run_app(["optima", f"--dataset_dir={folder}", "--progress=false"], monkeypatch)
    assert status == 0
    assert "optima of 3 records (1 subjects, reference yardstick)" in capsys.readouterr().out
    assert (folder / "3_random_row_easy.jsonl").read_bytes() == before
    assert sidecar_path(folder, "3_random_row_easy").is_file()
    records = load_subject(folder, "3_random_row_easy")
    cases, seeds, fresh = _recomputed(records)
    for k, record in enumerate(records):
        assert record["optimum"]["key"] == optimum_key(cases[k], seeds[k])
        assert math.isclose(record["optimum"]["compliance"], fresh.compliance[k], rel_tol=1e-9)


@pytest.mark.parametrize("argv, message", [
    (["--engine=ray"], "applies to v2 generation only"),
    (["--dataset_version=v2", "--draw_order=sequential", "--format=parquet"],
     "applies to --draw_order=keyed only"),
    (["--dataset_version=v2", "--workers=2", "--engine=ray"], "--engine=local only"),
    (["--dataset_version=v2", "--format=json"], "parquet or jsonl"),
    (["--dataset_version=v2", "--num_devices=2"], "does not apply to a v2 corpus"),
])
def test_app_refuses_corpus_options_where_they_do_not_apply(argv, message, tmp_path,
                                                             monkeypatch, capsys):
    status = run_app(["generate", *argv, f"--output_dir={tmp_path / 'x'}"], monkeypatch)
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "x").exists()


def _edited(record):
    """The record with one masked cell of its answer flipped (another problem)."""
    truth = [list(row) for row in record["ground_truth"]]
    for r, row in enumerate(record["input_grid"]):
        for c, token in enumerate(row):
            if token == "V":
                truth[r][c] = "1" if truth[r][c] == "0" else "0"
                return {**record, "ground_truth": truth}
    raise AssertionError("no masked cell")


def test_scorers_use_a_current_stored_optimum_and_reoptimise_a_stale_one(built, tmp_path):
    """A stored optimum whose key is the record's is used as stored, by rescore's record
    scoring, the reward, the environment and evaluate, with nothing optimised; an edited
    answer (another key) is optimised again, never scored against the stale optimum."""
    from sphyr_jax.evaluation.backends import BaselineBackend
    from sphyr_jax.evaluation.harness import evaluate
    from sphyr_jax.rl import TopologyEnvironment, TopologyReward
    from sphyr_jax.scoring.records import score_records
    from sphyr_jax.topopt.optimum import OptimumCache

    folder, _ = built
    record = load_subject(folder, "5_random_cell_easy")[0]
    # A marked optimum: the stored compliance scaled, its key kept (so it is used as stored).
    marked = {**record, "optimum": {**record["optimum"],
                                    "compliance": 1.5 * record["optimum"]["compliance"]}}
    answer = "\n".join(" ".join(row) for row in record["ground_truth"])
    cache = OptimumCache()
    [used] = score_records([{**marked, "completion": answer}], cache=cache)
    assert used["optimal_compliance"] == marked["optimum"]["compliance"]
    assert cache.computed == 0
    edited = _edited(marked)
    [fresh] = score_records([{**edited, "completion": answer}], cache=cache)
    _, _, recomputed = _recomputed([edited])
    assert cache.computed == 1
    assert math.isclose(fresh["optimal_compliance"], recomputed.compliance[0], rel_tol=1e-9)
    assert not math.isclose(fresh["optimal_compliance"], marked["optimum"]["compliance"],
                            rel_tol=1e-3)
    # The reward's optimum column.
    reward = TopologyReward(cache=OptimumCache())
    [metrics] = reward.metrics(completions=[answer], ground_truth=[record["ground_truth"]],
                               input_grid=[record["input_grid"]],
                               gravity_dir=[record["gravity_dir"]], optimum=[marked["optimum"]])
    assert metrics["optimal_compliance"] == marked["optimum"]["compliance"]
    assert reward.cache.computed == 0
    [stale] = reward.metrics(completions=[answer], ground_truth=[edited["ground_truth"]],
                             input_grid=[edited["input_grid"]],
                             gravity_dir=[edited["gravity_dir"]], optimum=[marked["optimum"]])
    assert reward.cache.computed == 1
    assert math.isclose(stale["optimal_compliance"], recomputed.compliance[0], rel_tol=1e-9)
    # The environment and evaluate read the corpus's records with their optima.
    env_cache = OptimumCache()
    env = TopologyEnvironment(str(folder), cache=env_cache)
    env.reset(subject="full_easy", sample_index=1)
    observation = env.step(env.episode.sample.ground_truth)
    assert env_cache.computed == 0 and observation["reward"] > 0.9
    eval_cache = OptimumCache()
    summary = evaluate(BaselineBackend("empty"), dataset=str(folder), subjects=["full_easy"],
                       results_root=str(tmp_path / "results"), sample_count=None,
                       cache=eval_cache, progress=None)
    assert summary.subjects[0].records == 8 and eval_cache.computed == 0
