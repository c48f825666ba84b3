"""The app and the library facing real users' inputs: odd trees, bad flags, bad records.

Each case runs against real files in a temporary tree (real symbolic links,
real permission bits) and checks the bytes left on disk and the lines
printed, never only a return value.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from absl import flags
from conftest import REPO, SETS, run_app

import sphyr_jax as sj
from sphyr_jax.app import cli
from sphyr_jax.data.convert import convert_raw_dir
from sphyr_jax.data.datasets import load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.baselines import baseline_records
from sphyr_jax.scoring.results import rescore_tree


def _records(n=3):
    """The first records of the solid baseline on the embedded ``full_easy`` (as
    ``baselines`` writes them: results trees are regenerated, not shipped)."""
    data = load_subject(SETS / "dataset", "full_easy")[:n]
    return baseline_records("solid", "full_easy", data)


@pytest.fixture(scope="module")
def solid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("solid") / "full_easy_results.json"
    path.write_text(json.dumps(_records(20)))
    return path


def _tree(root: pathlib.Path, models=("m",), n=3) -> pathlib.Path:
    for model in models:
        (root / model).mkdir(parents=True)
        (root / model / "full_easy_results.json").write_text(json.dumps(_records(n)))
    return root



def _app(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "sphyr_jax", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _digest(folder: pathlib.Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


# --- flags, help and usage mistakes ------------------------------------------------------------

def test_help_lists_commands_and_each_commands_flags():
    top = _app("--help")
    assert top.returncode == 0
    for name, module in cli.COMMANDS.items():
        assert re.search(rf"^\s+{name}\s+{re.escape(module.SUMMARY)}$", top.stdout, re.M)
    own = _app("rescore", "--help")
    assert own.returncode == 0
    assert "--chunk" in own.stdout and "dry_run" in own.stdout
    assert "--results_root" in own.stdout  # shared flags listed too
    assert "--raw_dir" not in own.stdout  # another command's flag is not


@pytest.mark.parametrize("argv, needle", [
    (["rescore", "--chunk=0"], "--chunk=0"),
    (["rescore", "--chunk=-1"], "--chunk=-1"),
    (["validate", "--samples=-3"], "--samples=-3"),
    (["rescore", "--no_such_flag=1"], "no_such_flag"),
    (["nonsense"], "unknown command 'nonsense'"),
    ([], "no command given"),
    (["rescore"], "rescore needs --results_root"),
    (["rescore", "--results_root=/nonexistent/tree"], "does not exist"),
    (["validate", "--subject=nope"], "nope"),
    (["plot", "--input=README.md"], "README.md"),
    (["plot", "--input={solid_file}", "--index=99"], "record index 99 is out of range"),
    (["validate", "--results_root=/nonexistent", "--output_dir=/x"],
     "validate does not read --output_dir, --results_root"),
    (["generate"], "generate needs --output_dir"),
])
def test_user_mistakes_are_one_line_and_exit_2(argv, needle, request):
    if any("{solid_file}" in a for a in argv):
        solid = request.getfixturevalue("solid_file")
        argv = [a.replace("{solid_file}", str(solid)) for a in argv]
    quiet = argv and argv[0] in cli.COMMANDS and "progress" in cli.command_flags(argv[0])
    done = _app(*argv, *(["--progress=false"] if quiet else []))
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("sphyr_jax: error:")]
    assert len(errors) == 1 and needle in errors[0], done.stderr
    assert not argv or f"{argv[0]}: {argv[0]}" not in errors[0]  # the command named once
    if argv:  # (no command: the command list comes first)
        assert done.stderr.strip() == errors[0]  # the one line, nothing else
    assert "Traceback" not in done.stderr


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sphyr_jax: error: "), err
    return err[0]


@pytest.mark.parametrize("argv, unread", [
    (["validate", "--results_root=/nonexistent", "--output_dir=/x"],
     ["--output_dir", "--results_root"]),
    (["validate", "--model=x", "--raw_dir=y"], ["--model", "--raw_dir"]),
    (["report", "--results_root=r", "--output_dir=o", "--cache_dir=c"], ["--cache_dir"]),
    (["convert", "--raw_dir=r", "--output_dir=o", "--progress=false"], ["--progress"]),
    (["plot", "--input=x", "--dataset_version=v2"], ["--dataset_version"]),
])
def test_flags_a_command_does_not_read_are_refused(argv, unread, monkeypatch, capsys):
    """Before any work: the command says which flags it does not read."""
    assert run_app(argv, monkeypatch) == 2
    line = _one_error(capsys)
    assert f"{argv[0]} does not read {', '.join(unread)}" in line
    assert f"{argv[0]} --help" in line


def test_help_lists_only_what_a_command_reads():
    validate = cli.command_help("validate")
    for flag in ("--samples", "--subject", "--dataset_dir", "--dataset_version", "--cache_dir",
                 "--[no]progress", "--output_json"):
        assert flag in validate, flag
    for flag in ("--results_root", "--output_dir", "--model", "--raw_dir", "--chunk", "--seed"):
        assert flag not in validate, flag
    generate = cli.command_help("generate")  # what each version writes
    assert "raw/<NN>_SPhyR_2D.csv" in generate
    assert "16 subject files <subject>.jsonl only" in generate
    assert "--cache_dir" not in generate
    for name in cli.COMMANDS:  # what --help lists is what the command accepts
        listed = set(re.findall(r"^  --(?:\[no\])?(\w+)", cli.command_help(name), re.M))
        assert listed == set(cli.command_flags(name)), name


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("*.cfg")
                                        if p.stem in cli.COMMANDS))
def test_each_flag_file_names_only_flags_its_command_reads(name):
    try:
        flags.FLAGS(["sphyr_jax", f"--flagfile={REPO / 'configs' / f'{name}.cfg'}"])
        assert [f for f in cli.app_flags() if flags.FLAGS[f].present]  # it sets some
        assert cli.unused_flags(name) == []
    finally:
        flags.FLAGS.unparse_flags()


def test_plot_refuses_a_report_json_in_one_line(tmp_path, monkeypatch, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"experiments": [{"experiment": "main", "models": ["m"]}]}))
    assert run_app(["plot", f"--input={report}", f"--output={tmp_path / 'p.png'}"],
                   monkeypatch) == 2
    assert "report.json" in _one_error(capsys)
    assert not (tmp_path / "p.png").exists()


def test_plot_draws_the_trainers_leaderboard(tmp_path, monkeypatch, capsys):
    """The trainer's own leaderboard.json (written by write_leaderboard) is a leaderboard
    JSON plot draws: one heat map per entry, subject by direction."""
    from matplotlib import image

    from sphyr_jax import training

    cell = {"topology_score": 0.5, "load_carrying": 1.0}
    rows = [{"source": "dataset", "subject": s, "direction": d, "samples": 2, "model": cell,
             "empty": dict(cell, topology_score=0.1), "solid": dict(cell, topology_score=0.3)}
            for s in ("1_random_cell_easy", "full_easy") for d in ("down", "left")]
    files = training.write_leaderboard({"rows": rows, "entries": ["model", "empty", "solid"]},
                                       tmp_path / "run", plot=False)
    out = tmp_path / "board.png"
    assert run_app(["plot", f"--input={files['json']}", f"--output={out}"], monkeypatch) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    pixels = image.imread(out)
    assert pixels.ndim == 3 and pixels.shape[1] > pixels.shape[0] > 100  # three panels wide


def test_report_on_an_unscored_tree_names_rescore(tmp_path, monkeypatch, capsys):
    """A tree before scoring is an error naming the command that scores it; a tree with some
    metrics gets tables of those only, and the others are named with that command."""
    bare = tmp_path / "bare"
    (bare / "m").mkdir(parents=True)
    keep = ("prompt", "completion", "ground_truth", "input_grid", "index")
    (bare / "m" / "full_easy_results.json").write_text(
        json.dumps([{k: r[k] for k in keep if k in r} for r in _records()]))
    assert run_app(["report", f"--results_root={bare}", f"--output_dir={tmp_path / 'out'}"],
                   monkeypatch) == 2
    assert f"python -m sphyr_jax rescore --results_root={bare}" in _one_error(capsys)

    part = tmp_path / "part"
    (part / "m").mkdir(parents=True)
    (part / "m" / "full_easy_results.json").write_text(json.dumps(
        [{**{k: r[k] for k in keep if k in r}, "topology_score": 0.25 * i}
         for i, r in enumerate(_records())]))
    out = tmp_path / "paper"
    assert run_app(["report", f"--results_root={part}", f"--output_dir={out}", "--nofigures"],
                   monkeypatch) == 0
    err = capsys.readouterr().err
    assert "difference_ratio" in err and f"rescore --results_root={part}" in err
    table = (out / "main.md").read_text()
    assert "topology_score" in table or "topology score" in table.lower()
    assert "difference ratio" not in table.lower() and "difference_ratio" not in table


def test_traceback_on_request():
    done = _app("validate", "--subject=nope", env={"SPHYR_JAX_TRACEBACK": "1"})
    assert done.returncode == 2 and "Traceback" in done.stderr


def test_rescore_without_a_results_root_writes_nothing(monkeypatch, optimum_cache, capsys):
    """rescore never picks a tree by itself (the checkout's data/ included)."""
    before = _digest(REPO / "data")
    assert run_app(["rescore", "--progress=false"], monkeypatch, optimum_cache) == 2
    assert "rescore needs --results_root" in capsys.readouterr().err
    assert _digest(REPO / "data") == before


# --- one bad file or record never stops the run ----------------------------------------------

def test_bad_files_are_named_skipped_and_untouched(tmp_path, monkeypatch, optimum_cache, capsys):
    root = _tree(tmp_path / "tree", models=("good", "odd"))
    odd = root / "odd"
    (odd / "x_results.json").mkdir()                       # a folder with a results name
    os.symlink("y_results.json", odd / "y_results.json")   # a link loop
    (odd / "z_results.json").write_text("{not json")       # corrupt
    ro = odd / "full_easy_results.json"
    ro.chmod(0o444)                                        # read-only
    before = {p: p.read_bytes() for p in (ro, odd / "z_results.json")}
    status = run_app(["rescore", f"--results_root={root}", "--progress=false"],
                      monkeypatch, optimum_cache)
    err = capsys.readouterr().err
    assert status == 1
    for name, why in (("x_results.json", "not a regular file"), ("y_results.json", "link"),
                      ("z_results.json", "JSON"), ("full_easy_results.json", "read-only")):
        assert re.search(rf"skipped \(left untouched\): \S*odd/{name}: .*{why}", err), (name, err)
    assert all(p.read_bytes() == b for p, b in before.items())
    good = json.loads((root / "good" / "full_easy_results.json").read_text())
    assert all(r["physically_valid"] and r["topology_score"] > 0 for r in good)
    assert (root / "good" / "full_easy_aggregated_results.json").exists()
    assert not (odd / "full_easy_aggregated_results.json").exists()


@pytest.mark.parametrize("gravity, reason", [
    ([[0, 1], [1]], "not a list of numbers"),
    ([float("nan"), 0], "finite"),
    (["down", 0], "not a list of numbers"),
    ([0, -1, 0], "3 components but the grid is 2D"),
])
def test_unusable_record_fields_make_that_record_invalid(gravity, reason, tmp_path,
                                                         optimum_cache):
    root = _tree(tmp_path / "tree", models=("a", "b"))
    path = root / "b" / "full_easy_results.json"
    records = json.loads(path.read_text())
    records[1]["gravity_dir"] = gravity
    path.write_text(json.dumps(records, allow_nan=True))
    lines = []
    summary = rescore_tree(root, cache=optimum_cache, log=lines.append)
    assert summary.files == 2 and not summary.skipped
    assert [(pathlib.Path(p).parent.name, i) for p, i, _ in summary.invalid] == [("b", 1)]
    assert any("b/full_easy_results.json [1]: gravity_dir" in line and reason in line
               for line in lines), lines
    stored = json.loads(path.read_text())
    assert stored[1]["physically_valid"] is False and reason in stored[1]["invalid_reason"]
    assert stored[1]["gravity_dir"] == records[1]["gravity_dir"] or gravity[0] != gravity[0]
    reference = json.loads((root / "a" / "full_easy_results.json").read_text())
    for i in (0, 2):  # the neighbours equal the untouched copy in the other folder
        assert stored[i]["compliance"] == reference[i]["compliance"]


def test_three_component_direction_is_not_a_voxel_grid():
    rec = _records(1)[0]
    down = sj.get_structural_metrics(rec["ground_truth"], rec["ground_truth"], rec["prompt"],
                                     [1, 0])
    wrong = sj.get_structural_metrics(rec["ground_truth"], rec["ground_truth"], rec["prompt"],
                                      [0, -1, 0])
    default = sj.get_structural_metrics(rec["ground_truth"], rec["ground_truth"], rec["prompt"],
                                        None)
    assert down.physically_valid and not wrong.physically_valid
    assert "2D" in wrong.invalid_reason and wrong.compliance == float("inf")
    assert default.compliance == down.compliance


# --- links, pairs of files, the leaderboard ----------------------------------------------------

def test_links_are_respected(tmp_path, optimum_cache):
    store = _tree(tmp_path / "store", models=("real",))
    root = tmp_path / "tree"
    (root / "linked").mkdir(parents=True)
    target = store / "real" / "full_easy_results.json"
    os.symlink(target, root / "linked" / "full_easy_results.json")
    os.symlink(store / "real", root / "alias_a")
    os.symlink(store / "real", root / "alias_b")
    summary = rescore_tree(root, cache=optimum_cache)
    link = root / "linked" / "full_easy_results.json"
    assert link.is_symlink() and os.readlink(link) == str(target)   # still a link
    assert all("topology_score" in r for r in json.loads(target.read_text()))  # target updated
    # alias_a/alias_b and the linked file are one real file: scored once.
    assert summary.records == 3 and summary.files == 1
    assert [row["records"] for row in summary.leaderboard] == [3]
    assert len(summary.skipped) == 2


def test_results_and_aggregates_move_together(tmp_path, optimum_cache, monkeypatch):
    from sphyr_jax import io

    root = _tree(tmp_path / "tree", models=("m",))
    results = root / "m" / "full_easy_results.json"
    agg = root / "m" / "full_easy_aggregated_results.json"
    rescore_tree(root, cache=optimum_cache)
    before = {p: p.read_bytes() for p in (results, agg)}
    records = json.loads(results.read_text())
    records[0]["completion"] = records[0]["ground_truth"]  # changes its figures
    results.write_text(json.dumps(records, indent=2))
    before[results] = results.read_bytes()
    original = io._write_temp

    def failing(path, writer, encoding):  # the aggregates' temporary file cannot be made
        if str(path).endswith("_aggregated_results.json"):
            raise OSError(28, "No space left on device")
        return original(path, writer, encoding)

    monkeypatch.setattr(io, "_write_temp", failing)
    summary = rescore_tree(root, cache=optimum_cache)
    assert {p: p.read_bytes() for p in before} == before  # the previous pair, both
    assert summary.files == 0 and summary.leaderboard == []
    assert "No space left" in summary.skipped[0][1]
    monkeypatch.setattr(io, "_write_temp", original)
    summary = rescore_tree(root, cache=optimum_cache)
    records = json.loads(results.read_text())
    totals = json.loads(agg.read_text())
    assert totals["evaluated_samples"] == len(records)
    assert totals["total_topology_score"] == pytest.approx(
        sum(r["topology_score"] for r in records), rel=1e-12)
    assert summary.leaderboard[0]["topology_score"] == pytest.approx(
        np.mean([r["topology_score"] for r in records]), rel=1e-12)


def test_unreadable_aggregates_are_left_alone(tmp_path, optimum_cache):
    root = _tree(tmp_path / "tree", models=("m",))
    agg = root / "m" / "full_easy_aggregated_results.json"
    agg.mkdir()
    summary = rescore_tree(root, cache=optimum_cache)
    assert agg.is_dir() and summary.files == 1
    assert [pathlib.Path(p).name for p, _ in summary.skipped] == [agg.name]
    assert all("topology_score" in r
               for r in json.loads((root / "m" / "full_easy_results.json").read_text()))


# --- edges of the library ----------------------------------------------------------------------

def test_size_guard_reports_too_large_quickly():
    n = 130
    gt = [["L"] * n] + [["1"] * n for _ in range(n - 2)] + [["S"] * n]
    m = sj.score_batch([sj.ScoreItem(gt, gt, None, None)])[0]
    assert not m.physically_valid and m.invalid_reason.startswith("too large")


def test_convert_rejects_unsolvable_raw_samples(tmp_path):
    raw = SETS / "dataset" / "raw"
    files = sorted(raw.glob("*_SPhyR_2D.csv"))[:2]
    assert files, "the embedded raw samples are missing"
    folder = tmp_path / "raw"
    folder.mkdir()
    for f in files:
        shutil.copy(f, folder / f.name)
    bad = folder / files[0].name
    lines = bad.read_text().splitlines()
    # Static cells on the bottom row are supports: make them ordinary cells.
    fixed = []
    for line in lines:
        parts = line.split(",", 6)
        if float(parts[2]) < 1 and parts[5].strip() in ("1", "True", "true"):
            parts[5] = "False"
        fixed.append(",".join(parts))
    bad.write_text("\n".join(fixed) + "\n")
    with pytest.raises(UserInputError, match=re.escape(bad.name) + ".*support"):
        convert_raw_dir(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    said = []
    written = convert_raw_dir(folder, tmp_path / "out", skip_unsolvable=True, log=said.append)
    assert len(said) == 1 and bad.name in said[0]
    assert set(written.values()) == {1}


def test_evaluate_feedback_rounds_and_resample(tmp_path, monkeypatch, optimum_cache, capsys):
    """``evaluate --feedback_rounds=1 [--resample]`` with a fixed model: both rounds score
    the solid fill of each sample, whose figures get_structural_metrics gives directly."""
    from sphyr_jax.data.datasets import load_subject
    from sphyr_jax.evaluation.baselines import fill_masked
    from sphyr_jax.evaluation.prompts import sample_order

    records = sample_order(load_subject(str(SETS / "dataset"), "full_easy"), 2)
    expected = np.mean([sj.get_structural_metrics(fill_masked(r["input_grid"], "1"),
                                                  r["ground_truth"], r["input_grid"],
                                                  cache=optimum_cache).topology_score
                        for r in records])
    for extra, mode in (([], "feedback"), (["--resample"], "resample")):
        status = run_app(["evaluate", "--model=baseline:solid", "--feedback_rounds=1",
                           "--subjects=full_easy", "--sample_count=2",
                           f"--results_root={tmp_path}", "--progress=false", *extra],
                          monkeypatch, optimum_cache)
        assert status == 0
        folder = tmp_path / f"baseline_solid_{mode}_1"
        table = json.loads((folder / "full_easy_rounds.json").read_text())
        assert table["mode"] == mode and [row["round"] for row in table["table"]] == [0, 1]
        for row in table["table"]:
            assert row["mean_topology_score"] == pytest.approx(expected, rel=1e-12)
            assert row["valid_share"] == 1.0
        episodes = (folder / "full_easy_trajectories.jsonl").read_text().splitlines()
        assert len(episodes) == 2
        rounds = json.loads(episodes[0])["trajectory"]
        assert len(rounds) == 2
        # Feedback shows the verdict in the second prompt; the control asks the same again.
        assert (rounds[1]["prompt"] != rounds[0]["prompt"]) == (mode == "feedback")
    capsys.readouterr()
