"""Each record's own load direction, read the same way everywhere.

``record_gravity`` (the record's ``gravity_dir``, else its results folder's
rotation, else down), ``check_gravity`` and ``direction_words``; the dataset
loader keeping and checking ``gravity_dir``; the embedded sets by version; and
``rescore`` / ``validate`` scoring every record along its own direction, the
compliance checked against an independent SciPy Q4 model.
"""

import json
import math
import shutil

import numpy as np
import pytest
from absl import flags
from conftest import SETS
from test_generate_v2 import scipy_compliance

from sphyr_jax.app import common
from sphyr_jax.data import datasets, embedded
from sphyr_jax.data.datasets import DatasetError, dataset_source, load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.baselines import baseline_prompt
from sphyr_jax.problem.grids import InvalidProblemError, grid_to_text
from sphyr_jax.problem.loadcase import check_gravity, direction_words, record_gravity
from sphyr_jax.scoring import validation
from sphyr_jax.scoring.results import rescore_tree

MALFORMED = ["up", [1], [1, 0, 0], [True, False], [[1], [0]], [math.nan, 0], [math.inf, 1],
             [0, 0], {"row": 1, "col": 0}, [None, 1], ["1", "0"]]


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_directions_are_user_errors(value):
    with pytest.raises(InvalidProblemError) as info:
        record_gravity({"gravity_dir": value})
    assert isinstance(info.value, UserInputError) and "gravity_dir" in str(info.value)


def test_record_folder_down_in_that_order():
    assert record_gravity({"gravity_dir": [-1, 1]}, "gpt_3_rotations") == (-1.0, 1.0)
    assert record_gravity({"gravity_dir": np.array([0.5, -2])}) == (0.5, -2.0)
    assert record_gravity({}, "gpt-4o_3_rotations") == (0.0, 1.0)
    assert record_gravity({"gravity_dir": None}, "/runs/x/model_2_rotations") == (-1.0, 0.0)
    assert record_gravity({}, "results/model_1_rotations") == (0.0, -1.0)
    assert record_gravity({}, "gpt-4o") == record_gravity({}) == (1.0, 0.0)
    assert record_gravity({}, "m_3_rotations", ndim=3) == (1.0, 0.0, 0.0)
    assert record_gravity({"gravity_dir": [0, 1, 0]}, ndim=None) == (0.0, 1.0, 0.0)
    with pytest.raises(InvalidProblemError):
        record_gravity({"gravity_dir": [1, 0]}, ndim=3)
    with pytest.raises(InvalidProblemError, match="mapping"):
        record_gravity([1, 0])
    assert check_gravity((3, 4)) == (3.0, 4.0)


def test_direction_words():
    words = {(1, 0): "straight down", (-1, 0): "straight up", (0, 1): "to the right",
             (0, -1): "to the left", (1, 1): "down and to the right",
             (1, -1): "down and to the left", (-1, 1): "up and to the right",
             (-1, -1): "up and to the left"}
    for step, text in words.items():
        assert direction_words(step) == text
        assert direction_words([2.5 * v for v in step]) == text
    assert direction_words((0.7071067811865476, 0.7071067811865476)) == "down and to the right"
    for bad in ([0.5, 1], [0, 0], "down", [1]):
        with pytest.raises(InvalidProblemError):
            direction_words(bad)
    record = {"input_grid": [["L", "V"], ["S", "0"]]}
    prompt = baseline_prompt({**record, "gravity_dir": [-1, 1]}, "full_easy")
    assert ("The load on the 'L' cells pulls up and to the right "
            "(row, column step [-1, 1]).") in prompt
    assert "pulls" not in baseline_prompt(record, "full_easy")  # the published prompt


def test_loader_keeps_and_checks_the_direction(tmp_path):
    good = {"index": 0, "input_grid": "L V\nS 0", "ground_truth": "L 1\nS 0",
            "gravity_dir": [1, -1]}
    (tmp_path / "full_easy.jsonl").write_text(json.dumps(good) + "\n")
    assert load_subject(str(tmp_path), "full_easy")[0]["gravity_dir"] == [1, -1]
    for value in ([math.nan, 0], [0, 0], [True, 1]):
        bad = dict(good, gravity_dir=value)
        (tmp_path / "full_hard.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad)
                                                  + "\n")
        with pytest.raises(DatasetError, match="full_hard.jsonl, line 2: gravity_dir"):
            load_subject(str(tmp_path), "full_hard")


def test_embedded_sets_by_version(tmp_path, monkeypatch):
    assert dataset_source("v1") == str(SETS / "dataset")
    assert dataset_source("v1", dim=3) == str(SETS / "dataset_3d")
    assert dataset_source("v2") == str(SETS / "dataset_v2")
    assert dataset_source("v2-20") == str(SETS / "dataset_v2_20")
    assert tuple(common.DATASET_VERSIONS) == ("v1", "v2", "v2-20")
    for args in (("v3",), ("v2", 3)):
        with pytest.raises(DatasetError):
            dataset_source(*args)
    with pytest.raises(DatasetError, match="no embedded set 'dataset_v9'.*dataset_v2_20"):
        embedded("dataset_v9")
    with monkeypatch.context() as patch:  # an installation that lost a set says so
        patch.setattr(datasets, "EMBEDDED_ROOT", tmp_path)
        with pytest.raises(DatasetError, match="dataset_v2_20.*missing from this installation"):
            dataset_source("v2-20")
    assert embedded("dataset_1_rotations") == str(SETS / "dataset_1_rotations")
    records = load_subject(dataset_source("v2-20"), "1_random_row_easy", limit=3)
    assert all(len(r["gravity_dir"]) == 2 and len(r["input_grid"]) == 20 for r in records)
    try:
        flags.FLAGS(["sphyr_jax", "--dataset_version=v2"])
        assert common.dataset() == dataset_source("v2")
        flags.FLAGS(["sphyr_jax", f"--dataset_dir={tmp_path}", "--dataset_version=v2"])
        assert common.dataset() == str(tmp_path)
    finally:
        flags.FLAGS.unparse_flags()


def _v2_records(count):
    """The first records of the shipped v2 full_easy subject whose load is not straight down."""
    records = [r for r in load_subject(dataset_source("v2"), "full_easy")
               if r["gravity_dir"] not in ([1, 0],)]
    return records[:count]


def test_validate_scores_each_record_along_its_own_direction(monkeypatch):
    seen = []

    def capture(items, *args, **kwargs):
        seen.extend(items)
        raise RuntimeError("captured")

    monkeypatch.setattr(validation, "score_batch", capture)
    records = _v2_records(3)
    with pytest.raises(RuntimeError, match="captured"):
        validation.validate_records(records, "full_easy")
    want = [tuple(float(v) for v in r["gravity_dir"]) for r in records for _ in validation.PROBES]
    assert [item.gravity_dir for item in seen] == want
    with pytest.raises(InvalidProblemError):
        validation.validate_records([dict(records[0], gravity_dir=[0, 0])], "full_easy")


def test_rescore_uses_the_record_direction_then_the_folder(tmp_path, optimum_cache):
    a, b = _v2_records(2)
    gt_a, gt_b = grid_to_text(a["ground_truth"]), grid_to_text(b["ground_truth"])

    def row(rec, gt, **extra):
        return {"prompt": f"Fill the grid:\n\n{grid_to_text(rec['input_grid'])}\n",
                "ground_truth": gt, "completion": gt, **extra}

    own = tmp_path / "root" / "model"
    turned = tmp_path / "root" / "model_3_rotations"
    own.mkdir(parents=True)
    turned.mkdir()
    records = [row(a, gt_a, gravity_dir=a["gravity_dir"]), row(b, gt_b),
               row(a, gt_a, gravity_dir="up"), row(a, gt_a, gravity_dir=[0, 0])]
    (own / "full_easy_results.json").write_text(json.dumps(records))
    shutil.copy(own / "full_easy_results.json", turned / "full_easy_results.json")
    summary = rescore_tree(tmp_path / "root", cache=optimum_cache)
    assert summary.records == 8 and summary.invalid_records == 4
    for folder, folder_dir in ((own, (1, 0)), (turned, (0, 1))):
        out = json.loads((folder / "full_easy_results.json").read_text())
        want_a = scipy_compliance(a["ground_truth"], a["gravity_dir"])
        want_b = scipy_compliance(b["ground_truth"], folder_dir)
        np.testing.assert_allclose(out[0]["compliance"], want_a, rtol=1e-8)
        np.testing.assert_allclose(out[1]["compliance"], want_b, rtol=1e-8)
        assert out[0]["load_carrying"] and out[0]["topology_score"] > 0.9
        assert [r["physically_valid"] for r in out] == [True, True, False, False]
        assert out[2]["compliance"] is None and out[2]["topology_score"] == 0.0
    # Along the folder's (or the default) direction the answer of ``a`` is another problem.
    assert abs(scipy_compliance(a["ground_truth"], (1, 0)) - want_a) > 1e-3 * want_a


def test_baseline_results_copy_each_record_direction(tmp_path):
    from sphyr_jax.app.commands import baselines as command
    from sphyr_jax.evaluation.baselines import ANSWER, MODELS, write_baseline_results

    assert command.CHOICES == MODELS + (ANSWER,)
    source = dataset_source("v2")
    write_baseline_results(source, tmp_path, models=("answer", "empty"))
    data = load_subject(source, "3_random_column_hard")
    for model in ("answer", "empty"):
        out = json.loads((tmp_path / model / "3_random_column_hard_results.json").read_text())
        assert [r["gravity_dir"] for r in out] == [r["gravity_dir"] for r in data]
        diagonal = [(r, p) for r, p in zip(data, out, strict=True) if all(r["gravity_dir"])]
        assert diagonal and all(direction_words(r["gravity_dir"]) in p["prompt"]
                                for r, p in diagonal)
    answers = json.loads((tmp_path / "answer" / "3_random_column_hard_results.json").read_text())
    assert [a["completion"] for a in answers] == [grid_to_text(r["ground_truth"]) for r in data]
    # The trees are regenerated, not shipped: the same command writes the same bytes.
    again = tmp_path / "again"
    write_baseline_results(source, again, models=("empty",))
    for path in sorted((tmp_path / "empty").iterdir()):
        assert (again / "empty" / path.name).read_bytes() == path.read_bytes()
