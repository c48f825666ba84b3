"""The shipped checkpoint ``physics``: it loads in a fresh process that sees no shared
data, its completions score exactly as its own stored figures say, the app's evaluate
serves it by name, and it is exactly equivariant under the eight symmetries of the square.

The stored figures (``tests/data/physics_figures.json``) are records of the model's own
results trees, written by ``evaluate --model=checkpoint:physics --results_root=ROOT/<set>``
for the sets v1, v2 and v2-20 and scored by ``rescore`` (the leaderboards' figures);
``python tests/test_pretrained.py ROOT`` writes them again from those trees.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, SETS, assert_dihedral_equivariance, child_env

FIGURES = REPO / "tests" / "data" / "physics_figures.json"
METRICS = ("topology_score", "load_carrying", "compliance", "optimal_compliance",
           "volume_fraction", "structural_efficiency", "material_efficiency")
PICKS = (("v1", "full_easy", 0), ("v1", "10_random_cell_hard", 0),
         ("v2", "full_hard", 0), ("v2", "3_random_row_easy", 65),
         ("v2-20", "5_random_cell_hard", 0))
"""(set, subject, position in the results file) of the stored figures; the v2
3_random_row_easy one is a completion the carrying decode made (its bare threshold
drops the load)."""

_SCRIPT = textwrap.dedent("""
    import json, sys
    import sphyr_jax
    from sphyr_jax import training
    from sphyr_jax.training.evaluation import score_summary

    sphyr_jax.enable_x64()
    figures, metrics = json.load(open(sys.argv[1])), sys.argv[2].split(",")
    model = training.load_pretrained("physics")
    out = []
    for rec in figures["records"]:
        hard = rec["subject"].endswith("_hard")
        done = training.complete_records(model, [rec], hard=hard)[0]
        bare = training.complete_records(model, [rec], hard=hard, carry=False)[0]
        scored = score_summary([rec], [done])["per_record"][0]
        out.append({"completion": "\\n".join(" ".join(row) for row in done),
                    "bare_carries": bool(score_summary([rec], [bare])["per_record"][0][
                        "load_carrying"]),
                    **{k: scored[k] for k in metrics}})
    print(json.dumps({"records": out, "file": training.__file__}))
""")


def test_the_checkpoint_loads_in_a_fresh_process_and_scores_as_stored(tmp_path):
    """No shared data (``SPHYR_JAX_SHARED`` points nowhere, the process runs outside the
    checkout): the package's own checkpoint completes the stored records exactly as stored,
    and the reference yardstick scores them as the model's results trees say."""
    figures = json.loads(FIGURES.read_text())
    assert len(figures["records"]) == len(PICKS)
    script = tmp_path / "physics.py"
    script.write_text(_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(FIGURES), ",".join(METRICS)],
                          cwd=tmp_path,
                          env=child_env(SPHYR_JAX_SHARED=str(tmp_path / "nothing")),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for want, have in zip(figures["records"], got["records"], strict=True):
        assert have["completion"] == want["completion"], want["subject"]
        # the carrying decode made the 3_random_row_easy completion (see PICKS)
        assert have["bare_carries"] is (want["subject"] != "3_random_row_easy")
        for name in METRICS:
            assert have[name] == pytest.approx(want[name], rel=1e-9, abs=1e-12), name


def test_evaluate_serves_the_checkpoint_by_name(tmp_path):
    """``evaluate --model=checkpoint:physics`` on an embedded set answers a record as the
    library's completion does (a second path to the same model)."""
    import sphyr_jax
    from sphyr_jax import training
    from sphyr_jax.data.datasets import load_subject
    from sphyr_jax.problem.grids import extract_grid

    done = subprocess.run(
        [sys.executable, "-m", "sphyr_jax", "evaluate", "--model=checkpoint:physics",
         "--dataset_version=v2", "--subjects=3_random_row_hard", "--sample_count=2",
         f"--results_root={tmp_path}", "--progress=false"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = json.loads((tmp_path / "checkpoint_physics" /
                         "3_random_row_hard_results.json").read_text())
    assert len(stored) == 2
    sphyr_jax.enable_x64()
    model = training.load_pretrained()
    records = {json.dumps(r["ground_truth"]): r for r in
               load_subject(str(SETS / "dataset_v2"), "3_random_row_hard")}
    for rec in stored:
        truth = extract_grid(rec["ground_truth"])
        source = records[json.dumps(truth)]
        assert rec["gravity_dir"] == source["gravity_dir"]
        mine = training.complete_records(model, [source], hard=True)[0]
        assert extract_grid(rec["completion"]) == mine
        assert rec["load_carrying"] is True


def test_the_shipped_checkpoint_is_exactly_equivariant():
    """Eight load directions (axes and diagonals) x eight symmetries of the square, a hard
    10x10 and an easy 20x20 record: the moved input gets the moved completion bit for bit."""
    from sphyr_jax import training
    from sphyr_jax.data.datasets import load_subject

    model = training.load_pretrained()
    records = [load_subject(str(SETS / "dataset"), "full_hard", limit=1)[0],
               load_subject(str(SETS / "dataset_v2_20"), "3_random_column_easy", limit=1)[0]]
    assert_dihedral_equivariance(model, records)


def test_the_checkpoint_folder_holds_its_training_record():
    """Weights, architecture, the training configuration and the command that trained it;
    a few MB at most."""
    from sphyr_jax import training

    folder = training.pretrained_dir("physics")
    names = {p.name for p in folder.iterdir()}
    assert {"model.eqx", "model.json", "config.json", "command.txt"} <= names
    assert sum(p.stat().st_size for p in folder.iterdir()) < 3_000_000
    config = training.train_config_from_dict(json.loads((folder / "config.json").read_text()))
    model_json = json.loads((folder / "model.json").read_text())
    assert training.model_config_from_dict(model_json) == config.model
    command = (folder / "command.txt").read_text()
    assert command.startswith("python -m sphyr_jax train ")
    flagfile = command.split("--flagfile=")[1].split()[0] if "--flagfile=" in command else None
    assert flagfile is None or (REPO / flagfile).is_file()


def _write_figures(root: pathlib.Path) -> None:
    """Pick the stored records out of the model's results trees under ``root`` (see the
    module docstring)."""
    from sphyr_jax.problem.grids import extract_grid

    out = []
    for tree, subject, i in PICKS:
        path = root / tree / "checkpoint_physics" / f"{subject}_results.json"
        rec = json.loads(path.read_text())[i]
        out.append({"tree": tree, "subject": subject, "position": i,
                    "input_grid": extract_grid(rec["prompt"]),
                    "ground_truth": extract_grid(rec["ground_truth"]),
                    "gravity_dir": rec.get("gravity_dir"), "completion": rec["completion"],
                    **{k: rec[k] for k in METRICS}})
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(json.dumps({
        "about": "records of the physics checkpoint's results trees (evaluate "
                 "--model=checkpoint:physics, then rescore), default yardstick",
        "records": out}, indent=1) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    _write_figures(pathlib.Path(sys.argv[1]))
