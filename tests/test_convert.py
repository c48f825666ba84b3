"""Raw CSV -> subject files (sphyr_jax.data.convert), checked against the published data."""

import hashlib
import json
import os
import pathlib
import random
import shutil

import numpy as np
import pytest

from sphyr_jax.data import convert
from sphyr_jax.data.convert import ConversionError, RawSample, convert_raw_dir, read_raw_csv
from sphyr_jax.data.datasets import VARIANTS, list_subjects

# Which published record each reference raw file is (found by matching the
# ground truths of the published full_easy/full_hard files, whose indices are
# positions in the name-sorted list of all 1296 raw files).  10_SPhyR_2D.csv
# lies beyond the first 40 published records.
PUBLISHED_INDEX = {
    0: 0, 1002: 3, 1005: 6, 1006: 7, 1007: 8, 1008: 9, 1009: 10,
    100: 11, 1010: 12, 1011: 13, 101: 22,
}  # fmt: skip

# Masks of published record 0 (= 0_SPhyR_2D.csv, first in name order in both
# the full and the reference folder), read from the public repository's
# src/sphyr/dataset_creation/huggingface/2D/datasets/*.jsonl: (row, col) of V.
PUBLISHED_RECORD0_V_CELLS = {
    "10_random_cell_hard": {
        (1, 3), (1, 4), (3, 0), (4, 6), (6, 1), (8, 1), (8, 7), (9, 4), (9, 5),
    },
}  # fmt: skip
PUBLISHED_RECORD0_V_COLUMNS = {"3_random_column_hard": {2, 6, 7}}


def _tree_digest(folder: pathlib.Path) -> dict:
    if not folder.exists():
        return {}
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _read_jsonl(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def _v_cells(grid):
    return {(r, c) for r, row in enumerate(grid) for c, t in enumerate(row) if t == "V"}


def _write_csv(path, rows):
    """rows: (x_centre, y_centre, density, is_static) tuples, or raw strings."""
    lines = []
    for i, row in enumerate(rows):
        if isinstance(row, str):
            lines.append(row)
        else:
            x, y, d, s = row
            lines.append(f"{i},{x},{y},0.0,{d},{s},[{i}, {i + 1}]")
    path.write_text("\n".join(lines) + "\n")
    return path


def _grid_rows(nelx, nely, density=0.5, static=()):
    rows = []
    for y in range(nely):
        for x in range(nelx):
            rows.append((x + 0.5, y + 0.5, density, (x, y) in static))
    return rows


@pytest.fixture(scope="module")
def converted(raw_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted")
    counts = convert_raw_dir(raw_data_dir, out)
    return out, counts


# --- reading one raw file -----------------------------------------------------


def test_read_raw_csv_hand_built(tmp_path):
    # 3 columns x 4 rows (not 10x10); y = 0 is the bottom row.
    densities = {
        (0, 1): 0.04, (1, 1): 0.051, (2, 1): 0.449,
        (0, 2): 0.96, (1, 2): 0.001, (2, 2): 1.0,
        (0, 3): 0.3, (1, 3): 0.0, (2, 3): 0.66,
    }  # fmt: skip
    rows = []
    for y in range(4):
        for x in range(3):
            static = y == 0 and x < 2 or (x, y) == (2, 3)
            rows.append((x + 0.5, y + 0.5, densities.get((x, y), 1.0), static))
    random.Random(3).shuffle(rows)  # line order does not matter
    sample = read_raw_csv(_write_csv(tmp_path / "7_SPhyR_2D.csv", rows))
    assert sample.index == 7 and sample.shape == (4, 3)
    assert sample.easy.tolist() == [
        ["1", "0", "L"],
        ["1", "0", "1"],
        ["0", "1", "1"],
        ["S", "S", "1"],
    ]
    assert sample.hard.tolist() == [
        ["0.3", "0.0", "L"],
        ["1.0", "0.0", "1.0"],
        ["0.0", "0.1", "0.4"],
        ["S", "S", "1.0"],
    ]
    assert sample.density[0, 0] == 0.3 and sample.density[3, 2] == 1.0
    assert sample.grid("hard") == sample.hard.tolist()


def test_read_raw_csv_formats(tmp_path):
    # No neighbour list, CRLF endings, blank lines, True/true, a BOM.
    text = "\ufeff0,0.5,0.5,0.0,0.2,TRUE\r\n\r\n1,1.5,0.5,0.0,0.7,false,[]\r\n"
    text += "2,0.5,1.5,0.0,0.9,False,[0, 1,3]\r\n3,1.5,1.5,0,1e-3,true,[2]\r\n"
    path = tmp_path / "x.csv"
    path.write_text(text, encoding="utf-8")
    sample = read_raw_csv(path)
    assert sample.index is None
    assert sample.easy.tolist() == [["1", "L"], ["S", "1"]]
    assert sample.hard.tolist() == [["0.9", "L"], ["S", "0.7"]]


def test_reference_raw_files_match_published_ground_truths(
    raw_data_dir, full_easy_records, full_hard_records
):
    easy_by_grid = {json.dumps(r["ground_truth"]): r["index"] for r in full_easy_records}
    hard_by_grid = {json.dumps(r["ground_truth"]): r["index"] for r in full_hard_records}
    found = {}
    for path in sorted(raw_data_dir.glob("*_SPhyR_2D.csv")):
        sample = read_raw_csv(path)
        assert sample.shape == (10, 10)
        easy = easy_by_grid.get(json.dumps(sample.easy.tolist()))
        hard = hard_by_grid.get(json.dumps(sample.hard.tolist()))
        assert easy == hard  # both levels find the same published sample (or none)
        if easy is not None:
            found[sample.index] = easy
    assert found == PUBLISHED_INDEX


def test_published_indices_follow_file_name_order(raw_data_dir):
    names = [p.name for p in convert.list_raw_files(raw_data_dir)]
    published = [PUBLISHED_INDEX[int(n.split("_")[0])] for n in names if not n.startswith("10_")]
    assert published == sorted(published)  # name order, not numeric order
    numeric = [p.name for p in convert.list_raw_files(raw_data_dir, order="number")]
    assert numeric[:4] == ["0_SPhyR_2D.csv", "10_SPhyR_2D.csv", "100_SPhyR_2D.csv",
                           "101_SPhyR_2D.csv"]  # fmt: skip
    assert names[-1] == "10_SPhyR_2D.csv" and names[7] == "100_SPhyR_2D.csv"


# --- converting a folder -------------------------------------------------------


def test_convert_writes_sixteen_subjects(converted):
    out, counts = converted
    assert list(counts) == list_subjects()
    assert set(counts.values()) == {12}
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{s}.jsonl" for s in counts)


def test_converted_ground_truths_equal_published(converted, full_easy_records, full_hard_records):
    out, _ = converted
    for level, published in (("easy", full_easy_records), ("hard", full_hard_records)):
        by_grid = {json.dumps(r["ground_truth"]): r for r in published}
        matched = 0
        for subject in list_subjects():
            if not subject.endswith(level):
                continue
            for record in _read_jsonl(out / f"{subject}.jsonl"):
                twin = by_grid.get(json.dumps(record["ground_truth"]))
                matched += twin is not None
        assert matched == 8 * len(PUBLISHED_INDEX)


def test_first_records_are_byte_identical_to_published(converted, raw_data_dir):
    out, _ = converted
    for subject in ("full_easy", "full_hard"):
        ours = (out / f"{subject}.jsonl").read_bytes().split(b"\n")[0]
        theirs = (raw_data_dir.parent / "datasets" / f"{subject}.jsonl").read_bytes()
        theirs = theirs.split(b"\n")[0]
        assert ours == theirs


def test_random_masks_reproduce_published_stream(converted):
    out, _ = converted
    for subject, cells in PUBLISHED_RECORD0_V_CELLS.items():
        grid = _read_jsonl(out / f"{subject}.jsonl")[0]["input_grid"]
        assert _v_cells(grid) == cells
    for subject, cols in PUBLISHED_RECORD0_V_COLUMNS.items():
        record = _read_jsonl(out / f"{subject}.jsonl")[0]
        grid, truth = record["input_grid"], record["ground_truth"]
        assert {c for c in range(10) if all(row[c] == "V" for row in grid)} == cols
        # the masked column 2 covers a load and a support cell
        assert truth[0][2] == "L" and truth[9][2] == "S"


def _check_mask(variant, record):
    grid, truth = record["input_grid"], record["ground_truth"]
    nely, nelx = len(truth), len(truth[0])
    assert len(grid) == nely and all(len(row) == nelx for row in grid)
    assert all("V" not in row for row in truth)
    for r in range(nely):
        for c in range(nelx):
            assert grid[r][c] in ("V", truth[r][c])
    masked = {(r, c) for r in range(nely) for c in range(nelx) if grid[r][c] == "V"}
    full_rows = {r for r in range(nely) if all(t == "V" for t in grid[r])}
    full_cols = {c for c in range(nelx) if all(grid[r][c] == "V" for r in range(nely))}
    if variant.endswith("_random_cell"):
        n = int(variant.split("_")[0])
        assert 1 <= len(masked) <= n
    elif variant.endswith("_random_row"):
        n = int(variant.split("_")[0])
        assert len(full_rows) == n and full_rows <= set(range(1, nely - 1))
        assert masked == {(r, c) for r in full_rows for c in range(nelx)}
    elif variant.endswith("_random_column"):
        n = int(variant.split("_")[0])
        assert len(full_cols) == n
        assert masked == {(r, c) for r in range(nely) for c in full_cols}
    else:
        assert variant == "full"
        assert masked == {(r, c) for r in range(1, nely - 1) for c in range(nelx)}
    return masked


def test_masks_have_the_right_shape(converted):
    out, _ = converted
    masks = {}
    for subject in list_subjects():
        variant = subject.rsplit("_", 1)[0]
        records = _read_jsonl(out / f"{subject}.jsonl")
        assert [r["index"] for r in records] == list(range(12))
        masks[subject] = [_check_mask(variant, r) for r in records]
    # easy and hard draw their own masks from the stream
    for variant in VARIANTS[:-1]:
        assert masks[f"{variant}_easy"] != masks[f"{variant}_hard"]


def test_json_format_holds_text_grids(raw_data_dir, tmp_path, converted):
    out, _ = converted
    counts = convert_raw_dir(raw_data_dir, tmp_path, fmt="json")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{s}.json" for s in counts)
    for subject in ("3_random_row_hard", "full_easy"):
        as_text = json.loads((tmp_path / f"{subject}.json").read_text())
        as_lists = _read_jsonl(out / f"{subject}.jsonl")
        assert len(as_text) == len(as_lists)
        for t, lst in zip(as_text, as_lists, strict=True):
            assert t["index"] == lst["index"]
            for key in ("input_grid", "ground_truth"):
                assert isinstance(t[key], str)
                assert [row.split(" ") for row in t[key].split("\n")] == lst[key]


def test_deterministic_for_a_seed_and_seed_dependent(raw_data_dir, tmp_path, converted):
    out, _ = converted
    again = tmp_path / "again"
    convert_raw_dir(raw_data_dir, again, seed=42)
    assert _tree_digest(again) == _tree_digest(out)
    other = tmp_path / "other"
    convert_raw_dir(raw_data_dir, other, seed=7)
    for subject in list_subjects():
        a = _read_jsonl(out / f"{subject}.jsonl")
        b = _read_jsonl(other / f"{subject}.jsonl")
        assert [r["ground_truth"] for r in a] == [r["ground_truth"] for r in b]
        same_masks = [r["input_grid"] for r in a] == [r["input_grid"] for r in b]
        assert same_masks == subject.startswith("full")


def test_listing_order_is_irrelevant(raw_data_dir, tmp_path, monkeypatch, converted):
    out, _ = converted
    files = sorted(raw_data_dir.glob("*_SPhyR_2D.csv"))
    digests = []
    for k in range(2):
        shuffled = list(files)
        random.Random(k).shuffle(shuffled)
        raw = tmp_path / f"raw{k}"
        raw.mkdir()
        for path in shuffled:  # creation order differs between the folders
            shutil.copy(path, raw / path.name)
        (raw / "README.txt").write_text("not a raw file")
        real_iterdir = pathlib.Path.iterdir

        def scrambled(self, real_iterdir=real_iterdir, k=k):
            entries = list(real_iterdir(self))
            random.Random(100 + k).shuffle(entries)
            return iter(entries)

        monkeypatch.setattr(pathlib.Path, "iterdir", scrambled)
        convert_raw_dir(raw, tmp_path / f"out{k}")
        monkeypatch.undo()
        digests.append(_tree_digest(tmp_path / f"out{k}"))
    assert digests[0] == digests[1] == _tree_digest(out)


def test_number_order(raw_data_dir, tmp_path):
    convert_raw_dir(raw_data_dir, tmp_path, order="number")
    records = _read_jsonl(tmp_path / "full_hard.jsonl")
    assert records[1]["ground_truth"] == read_raw_csv(raw_data_dir / "10_SPhyR_2D.csv").grid("hard")


def test_small_grid_caps_row_and_column_counts(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    # 2 columns x 4 rows: only rows 1 and 2 can be masked, only 2 columns exist.
    _write_csv(raw / "0_SPhyR_2D.csv", _grid_rows(2, 4, static={(0, 0), (1, 3)}))
    convert_raw_dir(raw, tmp_path / "out")
    for subject in list_subjects():
        (record,) = _read_jsonl(tmp_path / "out" / f"{subject}.jsonl")
        masked = _v_cells(record["input_grid"])
        if "random_row" in subject or subject.startswith("full"):
            expected = 1 if subject.startswith("1_") else 2
            assert {r for r, _ in masked} <= {1, 2} and len(masked) == 2 * expected
        elif "random_column" in subject:
            assert len(masked) == 4 * (1 if subject.startswith("1_") else 2)
        else:
            assert 1 <= len(masked) <= int(subject.split("_")[0])


def test_gravity_dir_is_carried_from_samples(tmp_path):
    easy = np.array([["L", "0"], ["S", "1"]], dtype=object)
    hard = np.array([["L", "0.0"], ["S", "0.6"]], dtype=object)
    dens = np.array([[1.0, 0.0], [1.0, 0.6]])
    samples = [
        RawSample(None, easy, hard, dens, gravity_dir=(0, -1)),
        RawSample(None, easy, hard, dens),
    ]
    subjects = convert.build_subjects(samples, seed=1)
    assert subjects["full_hard"][0]["gravity_dir"] == [0, -1]
    assert "gravity_dir" not in subjects["full_hard"][1]
    counts = convert.write_subjects(subjects, tmp_path / "out", fmt="json")
    assert counts["1_random_cell_easy"] == 2
    stored = json.loads((tmp_path / "out" / "full_easy.json").read_text())
    assert stored[0]["gravity_dir"] == [0, -1] and stored[0]["ground_truth"] == "L 0\nS 1"


# --- malformed input: clear errors, nothing written ------------------------------

BAD_CSVS = {
    "short line": ("5,1.5,2.5,0.0", 6, "short line"),
    "non-number": ("5,1.5,2.5,0.0,abc,False,[1]", 6, "density is not a number"),
    "nan density": ("5,1.5,2.5,0.0,nan,False,[1]", 6, "density is not a number"),
    "non-integer index": ("5.5,1.5,2.5,0.0,0.3,False,[]", 6, "index"),
    "non-boolean": ("5,1.5,2.5,0.0,0.3,maybe,[1]", 6, "is_static"),
    "duplicate cell": ("5,0.7,0.2,0.0,0.3,False,[1]", 6, "duplicate cell x=0, y=0"),
    "bad neighbours": ("5,1.5,2.5,0.0,0.3,False,[1, x]", 6, "neighbour"),
    "out of range": ("5,1.5,2.5,0.0,1.2,False,[1]", 6, "outside [0, 1]"),
    "missing cell": (None, 5, "1 of 6 cells missing"),
}


def _bad_csv(path, kind):
    rows = _grid_rows(2, 3, static={(0, 0), (1, 2)})
    lines = [f"{i},{x},{y},0.0,{d},{s},[]" for i, (x, y, d, s) in enumerate(rows)]
    line, _, _ = BAD_CSVS[kind]
    if line is None:
        del lines[2]
    else:
        lines[5] = line  # line 6 of the file
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("kind", sorted(BAD_CSVS))
def test_bad_csv_raises_and_leaves_output_untouched(kind, raw_data_dir, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("0_SPhyR_2D.csv", "1002_SPhyR_2D.csv"):
        shutil.copy(raw_data_dir / name, raw / name)
    bad = _bad_csv(raw / "999_SPhyR_2D.csv", kind)
    out = tmp_path / "out"
    out.mkdir()
    (out / "full_easy.jsonl").write_text('{"index": 0, "old": true}\n')
    (out / "notes.txt").write_text("keep me")
    before = _tree_digest(out)

    with pytest.raises(ConversionError) as info:
        convert_raw_dir(raw, out)
    _, line, words = BAD_CSVS[kind]
    message = str(info.value)
    assert str(bad) in message and f"line {line}" in message and words in message
    assert info.value.path == str(bad) and info.value.line == line
    assert _tree_digest(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["full_easy.jsonl", "notes.txt"]

    with pytest.raises(ConversionError):
        convert_raw_dir(raw, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_expected_shape(tmp_path, raw_data_dir):
    assert read_raw_csv(raw_data_dir / "0_SPhyR_2D.csv", shape=(10, 10)).shape == (10, 10)
    path = _write_csv(tmp_path / "4_SPhyR_2D.csv", _grid_rows(3, 2))  # top row absent
    with pytest.raises(ConversionError, match=r"\(line 6\): .* 2x3 grid, expected 3x3"):
        read_raw_csv(path, shape=(3, 3))


def test_empty_file(tmp_path):
    path = tmp_path / "3_SPhyR_2D.csv"
    path.write_text("\n\n")
    with pytest.raises(ConversionError, match=r"3_SPhyR_2D\.csv, line 1: empty file"):
        read_raw_csv(path)


def test_write_failure_mid_way_leaves_output_untouched(raw_data_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "full_easy.jsonl").write_text("old\n")
    (out / "notes.txt").write_text("keep me")
    before = _tree_digest(out)
    real_replace = os.replace
    calls = []

    def flaky_replace(src, dst):
        calls.append(dst)
        if len(calls) == 9:
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    with pytest.raises(OSError, match="disk full"):
        convert_raw_dir(raw_data_dir, out)
    with pytest.raises(OSError, match="disk full"):
        calls.clear()
        convert_raw_dir(raw_data_dir, tmp_path / "new" / "deeper")
    monkeypatch.undo()
    assert _tree_digest(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["full_easy.jsonl", "notes.txt"]
    assert not (tmp_path / "new").exists()


def test_folder_errors(tmp_path):
    with pytest.raises(ConversionError, match="not a folder"):
        convert_raw_dir(tmp_path / "absent", tmp_path / "out")
    with pytest.raises(ConversionError, match="no \\*_SPhyR_2D.csv files"):
        convert_raw_dir(tmp_path, tmp_path / "out")
    (tmp_path / "abc_SPhyR_2D.csv").write_text("")
    with pytest.raises(ConversionError, match="must be <number>_SPhyR_2D.csv"):
        convert_raw_dir(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="fmt"):
        convert_raw_dir(tmp_path, tmp_path / "out", fmt="csv")
    with pytest.raises(ValueError, match="order"):
        convert.list_raw_files(tmp_path, order="mtime")
    assert not (tmp_path / "out").exists()


def test_mask_grid_variants_and_errors():
    grid = [[str(r * 4 + c) for c in range(4)] for r in range(5)]
    rng = random.Random(0)
    assert convert.mask_grid(grid, "full", rng)[1:4] == [["V"] * 4] * 3
    assert grid[1][0] == "4"  # input untouched
    masked = convert.mask_grid(np.array(grid, dtype=object), "2_random_column", rng)
    assert sum(all(row[c] == "V" for row in masked) for c in range(4)) == 2
    with pytest.raises(ValueError, match="unknown mask variant"):
        convert.mask_grid(grid, "2_random_diagonal", rng)
    with pytest.raises(TypeError):
        convert.build_subjects([], seed="42")
