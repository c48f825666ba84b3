"""Subject names and the dataset loader (sphyr_jax.data.datasets)."""

import json
import socket
import subprocess
import sys

import datasets as hf
import pytest

from sphyr_jax.data.convert import convert_raw_dir
from sphyr_jax.data.datasets import DatasetError, is_hard, list_subjects, load_subject


@pytest.fixture(scope="module")
def both_formats(raw_data_dir, tmp_path_factory):
    jsonl = tmp_path_factory.mktemp("jsonl")
    text = tmp_path_factory.mktemp("json")
    convert_raw_dir(raw_data_dir, jsonl, fmt="jsonl")
    convert_raw_dir(raw_data_dir, text, fmt="json")
    return jsonl, text


@pytest.fixture
def no_network(monkeypatch):
    """Fail loudly if anything opens a connection or asks the hub."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(hf, "load_dataset", refuse)


def _text_record(record):
    out = dict(record)
    for key in ("input_grid", "ground_truth"):
        out[key] = "\n".join(" ".join(row) for row in record[key])
    return out


def test_subject_names():
    subjects = list_subjects()
    assert len(subjects) == len(set(subjects)) == 16
    assert subjects[:3] == ["1_random_cell_easy", "1_random_cell_hard", "5_random_cell_easy"]
    assert subjects[-2:] == ["full_easy", "full_hard"]
    assert [is_hard(s) for s in subjects] == [False, True] * 8
    with pytest.raises(DatasetError):
        is_hard("full")


def test_jsonl_and_json_forms_load_identically(both_formats, no_network):
    jsonl, text = both_formats
    for subject in list_subjects():
        a = load_subject(jsonl, subject)
        b = load_subject(str(text), subject)
        assert a == b and len(a) == 12
        assert all(isinstance(t, str) for r in a for row in r["input_grid"] for t in row)
        assert set(a[0]) == {"index", "input_grid", "ground_truth"}


def test_published_file_loads_unchanged(raw_data_dir, full_easy_records, no_network):
    folder = raw_data_dir.parent / "datasets"
    assert load_subject(folder, "full_easy") == full_easy_records
    assert load_subject(str(folder), "full_easy", limit=5) == full_easy_records[:5]
    assert load_subject(folder / "full_easy.jsonl", "ignored", limit=0) == []


def test_json_variants_are_normalised(tmp_path, no_network):
    grid = [["L", "0"], ["S", "1"]]
    # Old published .json: numbers stored as JSON numbers, 4-space indent.
    (tmp_path / "full_easy.json").write_text(
        json.dumps([{"index": 0, "input_grid": [["L", 0], ["S", "V"]],
                     "ground_truth": [["L", 0], ["S", 1]]}], indent=4)
    )  # fmt: skip
    # JSON lines inside a .json file, text grids, an extra key, gravity_dir.
    lines = [
        {"index": 3, "input_grid": "L V\nS 1", "ground_truth": "L 0\nS 1", "note": "x"},
        {"index": 4, "input_grid": "L 0\nS V", "ground_truth": "L 0\nS 1", "gravity_dir": [0, 1]},
    ]
    (tmp_path / "full_hard.json").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    easy = load_subject(tmp_path, "full_easy")
    assert easy == [{"index": 0, "input_grid": [["L", "0"], ["S", "V"]], "ground_truth": grid}]
    hard = load_subject(tmp_path, "full_hard")
    assert hard[0] == {"index": 3, "input_grid": [["L", "V"], ["S", "1"]], "ground_truth": grid}
    assert hard[1]["gravity_dir"] == [0, 1]


def test_gravity_dir_survives_convert_and_load(tmp_path, both_formats):
    jsonl, _ = both_formats
    records = load_subject(jsonl, "full_hard")
    records[0]["gravity_dir"] = [-1, 0]
    (tmp_path / "full_hard.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    loaded = load_subject(tmp_path, "full_hard")
    assert loaded[0]["gravity_dir"] == [-1, 0] and "gravity_dir" not in loaded[1]


def test_local_hugging_face_folders(both_formats, tmp_path, no_network):
    jsonl, _ = both_formats
    expected = load_subject(jsonl, "3_random_row_hard")
    as_lists = hf.Dataset.from_list(expected)
    as_text = hf.Dataset.from_list([_text_record(r) for r in expected])

    as_lists.save_to_disk(str(tmp_path / "saved" / "3_random_row_hard"))
    assert load_subject(tmp_path / "saved", "3_random_row_hard") == expected

    hf.DatasetDict({"test": as_text}).save_to_disk(str(tmp_path / "dict" / "3_random_row_hard"))
    assert load_subject(str(tmp_path / "dict"), "3_random_row_hard", limit=4) == expected[:4]

    hf.DatasetDict({"3_random_row_hard": as_text}).save_to_disk(str(tmp_path / "by_subject"))
    assert load_subject(tmp_path / "by_subject", "3_random_row_hard") == expected

    as_text.to_parquet(str(tmp_path / "files" / "3_random_row_hard.parquet"))
    assert load_subject(tmp_path / "files", "3_random_row_hard") == expected

    shards = tmp_path / "shards" / "3_random_row_hard"
    shards.mkdir(parents=True)
    as_lists.select(range(5)).to_parquet(str(shards / "test-00000-of-00002.parquet"))
    as_lists.select(range(5, 12)).to_parquet(str(shards / "test-00001-of-00002.parquet"))
    assert load_subject(tmp_path / "shards", "3_random_row_hard", split="test") == expected

    (tmp_path / "files" / "full_easy.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match=r"full_easy\.parquet: cannot read data file"):
        load_subject(tmp_path / "files", "full_easy")

    with pytest.raises(DatasetError, match="no split 'train'"):
        load_subject(tmp_path / "dict", "3_random_row_hard", split="train")


def test_hub_loading_goes_through_load_dataset(both_formats, monkeypatch):
    jsonl, _ = both_formats
    expected = load_subject(jsonl, "full_easy")
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split, kwargs))
        return hf.Dataset.from_list([_text_record(r) for r in expected])

    monkeypatch.setattr(hf, "load_dataset", fake_load_dataset)
    assert load_subject("philippds/SPhyR", "full_easy") == expected
    assert (
        load_subject("hf://someone/SPhyR-copy", "full_easy", split="train", limit=2)
        == (expected[:2])
    )
    assert calls == [
        ("philippds/SPhyR", "full_easy", "test", {}),
        ("someone/SPhyR-copy", "full_easy", "train", {}),
    ]


def test_unknown_strings_are_not_sent_to_the_hub(tmp_path, no_network):
    with pytest.raises(DatasetError, match="no such local dataset"):
        load_subject("data/sphyr", "full_easy")
    with pytest.raises(DatasetError, match="no such local dataset"):
        load_subject(tmp_path / "absent", "full_easy")
    with pytest.raises(DatasetError, match="not a Hugging Face dataset id"):
        load_subject("hf://no id", "full_easy")


def test_missing_subject_and_bad_records(tmp_path, both_formats):
    jsonl, _ = both_formats
    with pytest.raises(DatasetError, match=r"subject 'full_medium' not found in .*jsonl"):
        load_subject(jsonl, "full_medium")
    with pytest.raises(ValueError, match="limit"):
        load_subject(jsonl, "full_easy", limit=-1)

    good = json.dumps({"index": 0, "input_grid": "L V\nS 1", "ground_truth": "L 0\nS 1"})
    cases = {
        "corrupt": ("{not json", "line 2: invalid JSON"),
        "no_truth": (json.dumps({"index": 1, "input_grid": "L V\nS 1"}), "line 2: record has no"),
        "ragged": (
            json.dumps({"index": 1, "input_grid": "L V\nS", "ground_truth": "L 0\nS 1"}),
            "line 2: bad input_grid: input_grid is ragged",
        ),
        "shapes": (
            json.dumps({"index": 1, "input_grid": "L V 0\nS 1 0", "ground_truth": "L 0\nS 1"}),
            "line 2: input_grid is 2x3 but ground_truth is 2x2",
        ),
        "gravity": (
            json.dumps({"index": 1, "input_grid": "V", "ground_truth": "1", "gravity_dir": [1]}),
            "line 2: gravity_dir must be",
        ),
        "index": (
            json.dumps({"index": "one", "input_grid": "V", "ground_truth": "1"}),
            "line 2: index must be an integer",
        ),
        "not_object": ("[1, 2]", "line 2: a record must be a JSON object"),
    }
    for name, (line, words) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        path = folder / "full_easy.jsonl"
        path.write_text(good + "\n" + line + "\n")
        with pytest.raises(DatasetError) as info:
            load_subject(folder, "full_easy")
        assert str(path) in str(info.value) and words in str(info.value), name

    (tmp_path / "list").mkdir()
    bad_json = tmp_path / "list" / "full_easy.json"
    bad_json.write_text('[{"index": 0, "input_grid": "V"}]')
    with pytest.raises(DatasetError, match=r"full_easy\.json, record 0: record has no"):
        load_subject(tmp_path / "list", "full_easy")
    bad_json.write_text('[{"index": 0,\n "input_grid": ')
    with pytest.raises(DatasetError, match=r"full_easy\.json: invalid JSON at line 2"):
        load_subject(tmp_path / "list", "full_easy")


def test_core_modules_import_without_hugging_face():
    code = (
        "import sys; import sphyr_jax.data.datasets, sphyr_jax.data.convert, sphyr_jax.io; "
        "assert 'datasets' not in sys.modules, 'datasets imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
