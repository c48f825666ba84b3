"""The report: leaderboards of a results tree built from the stored results
files, copied into several model and experiment folders with perturbed metric
values, parsed back and checked against values computed here from the
records; the LaTeX compiled when a TeX engine is on PATH, its structure checked
otherwise."""

from __future__ import annotations

import json
import math
import pathlib
import re
import shutil
import subprocess

import pytest
from absl import flags
from conftest import require_shared

from sphyr_jax.app import cli, common
from sphyr_jax.evaluation.report import (
    METRICS,
    collect,
    latex_document,
    markdown_report,
    split_folder,
    tex_escape,
    write_report,
)
from sphyr_jax.io import atomic_write_json
from sphyr_jax.scoring.results import AGGREGATE_KEYS, aggregate
from sphyr_jax.scoring.static import static_metrics_batch


def test_folder_names_give_model_and_experiment():
    assert split_folder("gpt-4o-2024-08-06") == ("gpt-4o-2024-08-06", "main")
    assert split_folder("claude-opus-4-20250514_3_rotations") == (
        "claude-opus-4-20250514", "3_rotations")
    assert split_folder("org_model_few_shot_1") == ("org_model", "few_shot_1")
    assert split_folder("gemini_physics_enhanced_prompt") == (
        "gemini", "physics_enhanced_prompt")
    assert split_folder("m_physics_neutral_prompt") == ("m", "physics_neutral_prompt")
    assert split_folder("m_3_rotations_few_shot_3") == ("m", "3_rotations_few_shot_3")
    assert split_folder("m_1_rotations_physics_enhanced_prompt") == (
        "m", "1_rotations_physics_enhanced_prompt")
    assert split_folder("_3_rotations") == ("_3_rotations", "main")


def test_every_reported_metric_has_a_display():
    assert tuple(spec.key for spec in METRICS) == AGGREGATE_KEYS
    lower = {spec.key for spec in METRICS if spec.better == "lower"}
    assert lower == {"isolated_clusters_count"}


# ----------------------------------------------------------------------------
# A tree from the stored files.

HARD = "10_random_cell_hard"
EASY = "full_easy"


def _with_static(records: list[dict]) -> list[dict]:
    statics = static_metrics_batch([r["completion"] for r in records],
                                   [r["ground_truth"] for r in records],
                                   [r["prompt"] for r in records])
    return [dict(r, **m.as_dict()) for r, m in zip(records, statics, strict=True)]


def _write(folder: pathlib.Path, subject: str, records: list[dict], totals=True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / f"{subject}_results.json", records)
    if totals:
        atomic_write_json(folder / f"{subject}_aggregated_results.json", aggregate(records))


def _scaled(records: list[dict], **factors) -> list[dict]:
    return [dict(r, **{k: r[k] * f for k, f in factors.items()}) for r in records]


@pytest.fixture(scope="module")
def tree(tmp_path_factory, gpt4o_records, claude_records):
    """model-a (the stored GPT-4o figures), model-b (half their topology score,
    no isolated clusters, the answer's volume), model-c (no full_easy), plus 3-rotation, few-shot
    and prompt-style folders, an old folder without static totals and one with
    totals only."""
    root = tmp_path_factory.mktemp("tree")
    easy = _with_static(gpt4o_records)
    hard = [dict(r, topology_score=0.8, load_carrying=True)
            for r in _with_static(claude_records)]
    _write(root / "model-a", EASY, easy)
    _write(root / "model-a", HARD, hard)
    _write(root / "model-b", EASY, [dict(r, isolated_clusters_count=0, volume_ratio=1.0)
                                    for r in _scaled(easy, topology_score=0.5)])
    _write(root / "model-b", HARD, hard)
    _write(root / "model-c", HARD, _scaled(hard, topology_score=0.5))
    _write(root / "model-a_3_rotations", EASY, easy)
    _write(root / "model-b_3_rotations", EASY, _scaled(easy, topology_score=0.25))
    _write(root / "model-a_few_shot_1", HARD, hard)
    _write(root / "model-a_physics_enhanced_prompt", EASY, easy)
    # An older tree: records carry the fields, the aggregated file only old totals.
    old = root / "model-d"
    _write(old, EASY, easy, totals=False)
    atomic_write_json(old / f"{EASY}_aggregated_results.json",
                      {"total_exact_match": 0, "total_score": 1.5})
    # Totals without records (evaluated_samples says how many).
    totals = root / "model-e"
    totals.mkdir()
    atomic_write_json(totals / f"{EASY}_aggregated_results.json",
                      dict(aggregate(easy), evaluated_samples=len(easy)))
    return root, easy, hard


def _mean(records, key):
    return sum(float(r.get(key) or 0.0) for r in records) / len(records)


def _parse_markdown(text: str) -> dict:
    """{metric heading: {row label: {model: cell text}}} of a report."""
    tables: dict = {}
    heading = None
    models: list[str] = []
    for line in text.splitlines():
        if line.startswith("### "):
            heading = line[4:].split(" (%)")[0].split(":")[0]
            tables[heading] = {}
        elif line.startswith("| subject |"):
            models = [c.strip() for c in line.strip("|").split("|")][1:]
        elif line.startswith("|") and not line.startswith("|---") and heading:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == len(models) + 1, line
            tables[heading][cells[0]] = dict(zip(models, cells[1:], strict=True))
    return tables


def _value(cell: str) -> float | None:
    if cell == "—":
        return None
    return float(cell.strip("*").rstrip("*"))


def test_markdown_tables(tree):
    root, easy, hard = tree
    boards = {b.experiment: b for b in collect(root)}
    assert list(boards) == ["main", "3_rotations", "few_shot_1", "physics_enhanced_prompt"]
    main = boards["main"]
    assert main.models == ["model-a", "model-b", "model-c", "model-d", "model-e"]
    assert main.subjects == [EASY, HARD]  # easy ones first
    tables = _parse_markdown(markdown_report(main))
    assert set(tables) == {spec.label for spec in METRICS}

    topo = tables["Topology score"]
    expected_a = 100 * _mean(easy, "topology_score")
    assert _value(topo[EASY]["model-a"]) == pytest.approx(expected_a, abs=0.05)
    assert _value(topo[EASY]["model-b"]) == pytest.approx(expected_a / 2, abs=0.05)
    # model-a is best on full_easy (model-d and -e carry the same records: a tie).
    bold = {m for m, c in topo[EASY].items() if c.startswith("**")}
    assert bold == {"model-a", "model-d", "model-e"}
    # A tie on the hard subject: both 80.0 bold; model-c is half of it.
    assert topo[HARD]["model-a"] == topo[HARD]["model-b"] == "**80.0**"
    assert topo[HARD]["model-c"] == "40.0"
    # Missing subjects are missing, not zero, and partial averages are marked, not ranked.
    assert topo[EASY]["model-c"] == "—" and topo["easy average"]["model-c"] == "—"
    assert topo[HARD]["model-d"] == "—"
    assert topo["overall"]["model-c"] == "40.0*"
    assert topo["overall"]["model-a"] == f"**{(expected_a + 80.0) / 2:.1f}**"
    assert topo["hard average"]["model-c"] == "40.0"

    # Cluster counts: the lowest is best; model-b has none.
    clusters = tables["Isolated clusters per record"]
    assert clusters[EASY]["model-b"] == "**0.000**"
    assert _value(clusters[EASY]["model-a"]) == pytest.approx(
        _mean(easy, "isolated_clusters_count"), abs=5e-4)
    assert not clusters[EASY]["model-a"].startswith("**")
    # The old tree's static cells come from its records; its other totals are kept.
    ratio = tables["Difference ratio"]
    assert _value(ratio[EASY]["model-d"]) == pytest.approx(
        100 * _mean(easy, "difference_ratio"), abs=0.05)
    assert ratio[EASY]["model-d"] == ratio[EASY]["model-a"] == ratio[EASY]["model-e"]
    # The difficulty score describes the samples: no best.
    assert not any("**" in c for row in tables["Difficulty score"].values()
                   for c in row.values())
    # Volume ratio: closest to 1 is best.
    volume = tables["Volume ratio"]
    assert volume[EASY]["model-b"] == "**1.000**"
    assert _value(volume[EASY]["model-a"]) == pytest.approx(_mean(easy, "volume_ratio"),
                                                            abs=5e-4)
    assert not volume[EASY]["model-a"].startswith("**")


def test_experiments_keep_their_models(tree):
    root, easy, _ = tree
    boards = {b.experiment: b for b in collect(root)}
    rotations = boards["3_rotations"]
    assert rotations.models == ["model-a", "model-b"]
    assert rotations.folders == {"model-a": "model-a_3_rotations",
                                 "model-b": "model-b_3_rotations"}
    topo = _parse_markdown(markdown_report(rotations))["Topology score"]
    assert _value(topo[EASY]["model-b"]) == pytest.approx(
        25 * _mean(easy, "topology_score"), abs=0.05)
    assert "hard average" not in topo  # no hard subject in this experiment
    assert boards["few_shot_1"].subjects == [HARD]


_TEX_ROW = re.compile(r"(?<!\\)&")


def _check_latex(text: str, models: int) -> list[list[str]]:
    """Table rows (cells) of a LaTeX document, after structural checks."""
    assert text.count(r"\begin{table}") == text.count(r"\end{table}") > 0
    assert text.count(r"\begin{tabular}") == text.count(r"\end{tabular}")
    assert text.startswith(r"\documentclass") and text.rstrip().endswith(r"\end{document}")
    assert text.count("{") == text.count("}") + text.count(r"\}") - text.count(r"\{")
    rows = []
    for spec in re.findall(r"\\begin\{tabular\}\{([lr]+)\}", text):
        assert spec == "l" + "r" * models
    for line in text.splitlines():
        if line.endswith(r"\\") and not line.startswith("\\"):
            cells = [c.strip() for c in _TEX_ROW.split(line[:-2])]
            assert len(cells) == models + 1, line
            rows.append(cells)
    return rows


def test_latex_tables(tree, tmp_path):
    root, easy, _ = tree
    main = collect(root)[0]
    text = latex_document(main)
    rows = _check_latex(text, len(main.models))
    header = rows[0]
    assert header[0] == "Subject" and header[1:] == [tex_escape(m) for m in main.models]
    assert tex_escape("full_easy") == r"full\_easy" and tex_escape("a&b%") == r"a\&b\%"
    topo_start = text.index(r"\caption{Topology score")
    block = text[text.rindex(r"\begin{table}", 0, topo_start):
                 text.index(r"\end{table}", topo_start)]
    by_label = {}
    for line in block.splitlines():
        if line.endswith(r"\\") and not line.startswith("\\"):
            cells = [c.strip() for c in _TEX_ROW.split(line[:-2])]
            by_label[cells[0]] = dict(zip(main.models, cells[1:], strict=True))
    assert by_label[r"full\_easy"]["model-a"] == (
        rf"\textbf{{{100 * _mean(easy, 'topology_score'):.1f}}}")
    assert by_label[r"full\_easy"]["model-c"] == "--"
    assert by_label[r"10\_random\_cell\_hard"]["model-b"] == r"\textbf{80.0}"
    assert by_label["Overall"]["model-c"] == "40.0*"
    engine = next((e for e in ("tectonic", "pdflatex") if shutil.which(e)), None)
    if engine is not None:  # compile it where a TeX engine is installed
        tex = tmp_path / "main.tex"
        tex.write_text(text)
        args = [engine, tex.name] if engine == "tectonic" else [
            engine, "-interaction=nonstopmode", "-halt-on-error", tex.name]
        proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert (tmp_path / "main.pdf").exists()


def test_write_report_files_and_json(tree, tmp_path):
    root, easy, _ = tree
    corrupt = root / "model-f" / f"{EASY}_aggregated_results.json"
    corrupt.parent.mkdir(exist_ok=True)
    corrupt.write_text("{not json")
    logged = []
    out = tmp_path / "out"
    try:
        summary = write_report(root, out, metrics=["topology_score"], formats=("png", "pdf"),
                               log=logged.append)
    finally:
        data = corrupt.read_text()
        shutil.rmtree(corrupt.parent)
    assert data == "{not json"  # reported and left untouched
    assert len(logged) == 1 and "model-f" in logged[0]
    assert summary.experiments == ["main", "3_rotations", "few_shot_1",
                                   "physics_enhanced_prompt"]
    assert ("main", "model-c", EASY) in summary.missing
    for experiment in summary.experiments:
        assert (out / f"{experiment}.md").exists() and (out / f"{experiment}.tex").exists()
    report = json.loads((out / "report.json").read_text())
    main = report["experiments"][0]
    assert main["values"]["topology_score"][EASY]["model-c"] is None
    assert main["values"]["topology_score"][EASY]["model-a"] == pytest.approx(
        _mean(easy, "topology_score"), rel=1e-12)
    assert main["records"][EASY]["model-a"] == len(easy)
    assert set(main["values"]) == {"topology_score"}
    figures = sorted(p.relative_to(out).as_posix() for p in (out / "figures").rglob("*.*"))
    assert "figures/main/topology_score_easy.png" in figures
    assert "figures/main/topology_score_hard.pdf" in figures
    assert "figures/3_rotations/topology_score_hard.png" not in figures  # no hard subject
    png = (out / "figures/main/topology_score_easy.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert (out / "figures/main/topology_score_easy.pdf").read_bytes().startswith(b"%PDF")
    from matplotlib.image import imread

    image = imread(out / "figures/main/topology_score_easy.png")
    assert image.shape[0] > 300 and image.shape[1] > 600
    assert len(summary.files) == 4 * 2 + 1 + len(figures)


def test_report_command(tree, tmp_path, monkeypatch, capsys):
    root, _, _ = tree
    monkeypatch.setattr(common, "setup", lambda: None)

    def run(argv):
        remaining = flags.FLAGS(["sphyr_jax"] + argv)
        try:
            return cli.main(remaining)
        finally:
            flags.FLAGS.unparse_flags()

    out = tmp_path / "cmd"
    flagfile = pathlib.Path(__file__).resolve().parents[1] / "configs" / "report.cfg"
    assert run(["report", f"--flagfile={flagfile}", f"--results_root={root}",
                f"--output_dir={out}", "--report_metrics=exact_match", "--nofigures"]) == 0
    text = capsys.readouterr()
    assert "report: 4 experiments" in text.out
    assert f"missing: main model-c {EASY}" in text.err
    assert (out / "main.md").exists() and not (out / "figures").exists()
    assert "Exact match" in (out / "main.md").read_text()
    assert run(["report", f"--results_root={tmp_path / 'nowhere'}", f"--output_dir={out}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    empty = tmp_path / "empty"
    (empty / "model").mkdir(parents=True)
    assert run(["report", f"--results_root={empty}", f"--output_dir={out}"]) == 2
    assert "no results files" in capsys.readouterr().err
    with pytest.raises(flags.IllegalFlagValueError):
        flags.FLAGS(["sphyr_jax", "report", "--report_metrics=topology_score,nonsense"])
    flags.FLAGS.unparse_flags()


def test_stored_files_report_what_they_hold(tmp_path):
    """The stored files as published: no aggregated totals, only the fields
    their records carry (GPT-4o: the physics; Claude: exact_match)."""
    from conftest import CLAUDE_RESULTS, GPT4O_RESULTS

    for path in (require_shared(GPT4O_RESULTS), require_shared(CLAUDE_RESULTS)):
        (tmp_path / path.parent.name).mkdir()
        shutil.copy(path, tmp_path / path.parent.name / path.name)
    (main,) = collect(tmp_path)
    gpt = json.loads(GPT4O_RESULTS.read_text())
    topo = main.values["topology_score"]
    assert topo[EASY]["gpt-4o-2024-08-06"] == pytest.approx(_mean(gpt, "topology_score"))
    assert topo[HARD]["claude-3-7-sonnet-20250219"] is None  # not in its records
    assert main.values["exact_match"][HARD]["claude-3-7-sonnet-20250219"] == 0.0
    assert main.values["difference_ratio"][EASY]["gpt-4o-2024-08-06"] is None
    assert math.isfinite(main.values["load_carrying"][EASY]["gpt-4o-2024-08-06"])
