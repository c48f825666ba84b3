"""Sample generation (sphyr_jax.data.generate): boundary conditions, CSV round trip, physics, files.

Generation runs on 6x6 grids with the cheap optimiser settings and one fixed
batch size, so every run after the first reuses the compiled functions.
"""

import hashlib
import itertools
import os
import pathlib

import jax
import numpy as np
import pytest
from conftest import SETS

import sphyr_jax
from sphyr_jax.data import generate
from sphyr_jax.data.convert import convert_raw_dir, list_raw_files, read_raw_csv
from sphyr_jax.data.datasets import is_hard, list_subjects, load_subject
from sphyr_jax.data.generation import GenerationError
from sphyr_jax.io import read_json
from sphyr_jax.problem.grids import densities_from_grid, token_masks

GRID = 6
SMALL = dict(grid_size=GRID, options=generate.QUICK_OPTIONS, batch_size=8)
ANALYZE = jax.jit(sphyr_jax.analyze)  # one compile serves every check below
EDGE_OF = {(1, 0): (0, -1), (-1, 0): (0, 0), (0, 1): (1, -1), (0, -1): (1, 0)}  # axis, index


def _tree(folder: pathlib.Path) -> dict:
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _text(grid) -> str:
    return "\n".join(" ".join(row) for row in grid)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("generated") / "data"
    summary = generate.generate_dataset(out, 4, seed=0, **SMALL)
    return out, summary


@pytest.fixture(scope="module")
def rotated(tmp_path_factory):
    out = tmp_path_factory.mktemp("rotated")
    summary = generate.generate_dataset(out, 4, seed=4, gravity_dirs=("left", "up", "right"),
                                        **SMALL)
    return out, summary


# ----------------------------------------------------------------------------
# Boundary conditions.


@pytest.mark.parametrize("gravity", sorted(generate.DIRECTIONS))
def test_boundary_runs_sit_on_the_edges_the_gravity_implies(gravity):
    g = generate.DIRECTIONS[gravity]
    axis, index = EDGE_OF[g]
    spec = generate.DEFAULT_BOUNDARY
    for seed in range(20):
        load, support = generate.draw_boundary_conditions(np.random.default_rng(seed), 10, gravity)
        # supports on the edge the load points to, loads on the opposite one
        s_edge = np.take(support, index, axis=axis)
        l_edge = np.take(load, -1 - index if index == 0 else 0, axis=axis)
        assert support.sum() == s_edge.sum() > 0
        assert load.sum() == l_edge.sum() > 0
        for edge, (lo, hi) in ((s_edge, spec.support_length), (l_edge, spec.load_length)):
            runs = [len(list(v)) for k, v in itertools.groupby(edge) if k]
            assert len(runs) == 1 and round(lo * 10) <= runs[0] <= round(hi * 10)
    same = [generate.draw_boundary_conditions(np.random.default_rng(7), 10, gravity)
            for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(same[0], same[1], strict=True))


def test_several_support_groups_are_separate_runs():
    spec = generate.BoundarySpec(support_groups=(2, 3), support_length=(0.1, 0.3))
    for seed in range(30):
        _, support = generate.draw_boundary_conditions(np.random.default_rng(seed), 10,
                                                       "down", spec)
        runs = [len(list(v)) for k, v in itertools.groupby(support[-1]) if k]
        assert 2 <= len(runs) <= 3 and support[:-1].sum() == 0


def test_direction_names_and_turns():
    assert generate.gravity_name((0, -1)) == "left" and generate.gravity_name(" Up") == "up"
    for name, g in generate.DIRECTIONS.items():  # turning the canonical load (1, 0)
        k = generate.quarter_turns(name)
        arrow = np.zeros((3, 3), int)
        arrow[1, 1], arrow[2, 1] = 1, 2  # tail and head of a downward step
        turned = np.rot90(arrow, k)
        tail, head = np.argwhere(turned == 1)[0], np.argwhere(turned == 2)[0]
        assert tuple(head - tail) == g
    with pytest.raises(ValueError):
        generate.gravity_name((1, 1))


def test_raw_names_sort_by_number():
    names = [generate.raw_name(i, 120) for i in range(120)]
    assert names[7] == "007_SPhyR_2D.csv" and sorted(names) == names


def test_csv_writer_refuses_boundary_conditions_it_cannot_encode():
    load = np.zeros((4, 4), bool)
    support = np.zeros((4, 4), bool)
    load[0, 1] = True
    support[0, 3] = True  # a support off the bottom row would read back as a load
    with pytest.raises(ValueError):
        generate.render_raw_csv(np.ones((4, 4)), load, support)


def test_near_copies_include_mirrors_and_slides():
    grid = np.array([r.split() for r in (
        "0 L L L 0 0 0", "0 0 1 0 0 0 0", "0 0 1 1 0 0 0", "0 S S S 0 0 0")], dtype=object)
    slid = np.roll(grid, 2, axis=1)
    mirrored = grid[:, ::-1].copy()
    assert generate.is_near_copy(slid, grid) and generate.is_near_copy(mirrored, grid)
    nudged = slid.copy()
    nudged[1, 3] = "1"  # one more cell: still a near-copy
    assert generate.is_near_copy(nudged, grid)
    nudged[2, 6] = nudged[1, 6] = "1"
    assert not generate.is_near_copy(nudged, grid)  # three cells apart
    # slides never wrap material around the edge
    left, split = np.roll(grid, -1, axis=1), np.roll(grid, -2, axis=1)  # cols 0-2, 6/0/1
    assert not generate.is_near_copy(split, left) and generate.is_near_copy(left, grid)
    # the same picture for another load direction is another sample
    turned = np.rot90(grid, generate.quarter_turns("left"))
    assert not generate.is_near_copy(turned, grid, "left", "down")
    assert generate.is_near_copy(turned, np.rot90(slid, 3), "left", "left")


# ----------------------------------------------------------------------------
# Generated data.


def test_subjects_and_csvs_reproduce_the_generated_answers(dataset):
    out, summary = dataset
    assert summary["kept"] == 4 and summary["drawn"] >= 4
    answers = [s["grid"] for s in summary["samples"]]
    files = list_raw_files(out / "raw")
    assert [p.name for p in files] == [f"{i}_SPhyR_2D.csv" for i in range(4)]
    for path, answer in zip(files, answers, strict=True):
        sample = read_raw_csv(path, shape=(GRID, GRID))
        assert _text(sample.easy.tolist()) == answer
        hard = [[t if t in "LS" else str(int(float(t))) for t in row] for row in sample.hard]
        assert _text(hard) == answer  # 0/1 answers: identical hard grids
    for subject in list_subjects():
        records = load_subject(out, subject)
        assert [r["index"] for r in records] == [0, 1, 2, 3]
        for record, answer in zip(records, answers, strict=True):
            assert "gravity_dir" not in record
            gt = record["ground_truth"]
            if is_hard(subject):
                gt = [[t if t in "LS" else f"{float(t):g}" for t in row] for row in gt]
            assert _text(gt) == answer
    # a plain conversion of the raw folder gives the same subject files
    again = out.parent / "converted"
    convert_raw_dir(out / "raw", again)
    assert _tree(again) == {k: v for k, v in _tree(out).items() if not k.startswith("raw/")}


def test_raw_csvs_follow_the_reference_layout(dataset):
    out, _ = dataset
    for path in list_raw_files(out / "raw"):
        lines = path.read_text().splitlines()
        assert len(lines) == GRID * GRID
        rows = {}
        for line in lines:
            head, neighbours = line.split(",[")
            index, x, y, z, density, static = head.split(",")
            col, row = int(float(x)), int(float(y))
            assert int(index) == row * GRID + col and float(z) == 0.0
            assert (float(x) - col, float(y) - row) == (0.5, 0.5)
            rows[int(index)] = (float(density), static == "True", neighbours.rstrip("]"))
        solid = {i for i, (d, s, _) in rows.items() if s or d >= 0.5}
        for i, (_, static, text) in rows.items():
            got = [int(v) for v in text.split(",")] if text else []
            r, c = divmod(i, GRID)
            expect = sorted(j for j in solid if j != i and abs(j // GRID - r) <= 1
                            and abs(j % GRID - c) <= 1) if i in solid else []
            assert got == expect
            if static:
                assert rows[i][0] == 1.0


def test_generated_answers_carry_load_and_are_distinct(dataset):
    out, summary = dataset
    records = load_subject(out, "full_easy")
    grids = [np.array(r["ground_truth"], dtype=object) for r in records]
    for a, b in itertools.combinations(grids, 2):
        assert np.sum(a != b) >= generate.MIN_DIFFERENCE
        assert not generate.is_near_copy(a, b) and not generate.is_near_copy(b, a)
    cases = [sphyr_jax.load_case_from_grid(r["ground_truth"]) for r in records]
    dens = np.stack([densities_from_grid(r["ground_truth"])[0] for r in records])
    res = ANALYZE(sphyr_jax.stack_load_cases(cases), dens)
    assert np.all(np.asarray(res.load_carrying))
    np.testing.assert_allclose(np.asarray(res.compliance),
                               [s["compliance"] for s in summary["samples"]], rtol=1e-9)
    for grid, sample, d in zip(grids, summary["samples"], dens, strict=True):
        load, support, _ = token_masks(grid.tolist())
        region = d[~(load | support)]
        assert 0 < region.sum() < region.size
        assert d.sum() <= sample["budget"] * d.size + 1e-9  # within the budget


def test_same_seed_same_files_other_seed_other_answers(dataset, tmp_path):
    out, summary = dataset
    generate.generate_dataset(tmp_path / "again", 4, seed=0, **SMALL)
    assert _tree(tmp_path / "again") == _tree(out)
    other = generate.generate_dataset(tmp_path / "other", 4, seed=1, **SMALL)
    assert [s["grid"] for s in other["samples"]] != [s["grid"] for s in summary["samples"]]
    assert _tree(tmp_path / "other") != _tree(out)


def test_gravity_is_recorded_and_honoured(rotated):
    out, summary = rotated
    stored = read_json(out / "raw" / "gravity.json")
    assert stored == {str(s["index"]): s["gravity_dir"] for s in summary["samples"]}
    allowed = {generate.DIRECTIONS[n] for n in ("left", "up", "right")}
    for subject in ("full_easy", "3_random_row_hard"):
        for record, sample in zip(load_subject(out, subject), summary["samples"], strict=True):
            g = tuple(record["gravity_dir"])
            assert g in allowed and list(g) == sample["gravity_dir"]
            load, support, masked = token_masks(record["ground_truth"])
            axis, index = EDGE_OF[g]
            assert support.sum() == np.take(support, index, axis=axis).sum()
            far = -1 if index == 0 else 0
            assert load.sum() == np.take(load, far, axis=axis).sum()
            if subject == "full_easy":  # masks drawn in the canonical frame keep L/S visible
                vis_l, vis_s, _ = token_masks(record["input_grid"])
                assert np.array_equal(vis_l, load) and np.array_equal(vis_s, support)
    records = load_subject(out, "full_easy")
    assert len({tuple(r["gravity_dir"]) for r in records}) >= 2
    dens = np.stack([densities_from_grid(r["ground_truth"])[0] for r in records])
    own = sphyr_jax.stack_load_cases([
        sphyr_jax.load_case_from_grid(r["ground_truth"], gravity_dir=r["gravity_dir"])
        for r in records])
    # a perpendicular load (reversing it would leave the compliance unchanged)
    across = sphyr_jax.stack_load_cases([
        sphyr_jax.load_case_from_grid(r["ground_truth"], gravity_dir=r["gravity_dir"][::-1])
        for r in records])
    c_own = np.asarray(ANALYZE(own, dens).compliance)
    c_across = np.asarray(ANALYZE(across, dens).compliance)
    np.testing.assert_allclose(c_own, [s["compliance"] for s in summary["samples"]], rtol=1e-9)
    assert np.all(c_across > 1.5 * c_own)  # optimised for its own direction
    # the raw CSVs hold the canonical frame; the subjects turn it back
    for path, record in zip(list_raw_files(out / "raw"), records, strict=True):
        k = generate.quarter_turns(record["gravity_dir"])
        turned = np.rot90(read_raw_csv(path).easy, k).tolist()
        assert turned == record["ground_truth"]


# ----------------------------------------------------------------------------
# Failures leave the output folder alone.


def _populated(folder: pathlib.Path) -> dict:
    (folder / "raw").mkdir(parents=True)
    (folder / "full_easy.jsonl").write_text("old\n")
    (folder / "raw" / "0_SPhyR_2D.csv").write_text("old csv\n")
    (folder / "notes.txt").write_text("keep me\n")
    return _tree(folder)


def test_attempt_bound_raises_and_writes_nothing(tmp_path):
    before = _populated(tmp_path / "out")
    with pytest.raises(GenerationError, match="kept only 0 of 3"):
        generate.generate_dataset(tmp_path / "out", 3, volume_fraction=0.05, max_attempts=20,
                                  **SMALL)  # the L/S cells alone exceed a 5 % budget
    assert _tree(tmp_path / "out") == before
    with pytest.raises(GenerationError):
        generate.generate_dataset(tmp_path / "new" / "deep", 3, volume_fraction=0.05,
                                  max_attempts=8, **SMALL)
    assert not (tmp_path / "new").exists()


def test_foreign_raw_files_are_refused(tmp_path):
    before = _populated(tmp_path / "out")
    (tmp_path / "out" / "raw" / "7_SPhyR_2D.csv").write_text("another dataset\n")
    before = _tree(tmp_path / "out")
    with pytest.raises(ValueError, match="another dataset"):
        generate.generate_dataset(tmp_path / "out", 3, **SMALL)
    assert _tree(tmp_path / "out") == before


def test_failed_commit_restores_the_folder(dataset, tmp_path, monkeypatch):
    before = _populated(tmp_path / "out")
    target = os.fspath(tmp_path / "out")
    real_replace = os.replace
    calls = []

    def flaky(src, dst, *args, **kwargs):
        if os.fspath(dst).startswith(target) and ".bak" not in os.fspath(src):
            calls.append(dst)
            if len(calls) == 3:  # a few files already renamed into place
                raise OSError("disk full")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        generate.generate_dataset(tmp_path / "out", 4, seed=0, **SMALL)
    monkeypatch.setattr(os, "replace", real_replace)
    assert len(calls) == 3
    assert _tree(tmp_path / "out") == before
    leftovers = [p.name for p in (tmp_path / "out").rglob(".*")]
    assert leftovers == []


def test_the_shipped_set_regenerates_byte_for_byte(tmp_path):
    """The first samples of ``sphyr_jax/data/sets/dataset`` come back from its seed and the default
    optimiser: the same raw CSVs and, subject by subject, the same first records.

    A smaller set draws the same stream of candidates and keeps them in the same
    order (whatever the batch size: each answer depends on its own candidate only),
    and the masks are drawn sample by sample from one stream, so a prefix of the
    shipped set is a byte-exact check of drawing, optimising and writing.
    """
    count = 2
    shipped = SETS / "dataset"
    generate.generate_dataset(tmp_path, count, seed=0, grid_size=10, num_devices=1,
                              batch_size=2)
    for i in range(count):
        assert (tmp_path / "raw" / generate.raw_name(i, count)).read_bytes() == (
            shipped / "raw" / generate.raw_name(i, 20)).read_bytes()
    for name in list_subjects():
        ours = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        assert ours == (shipped / f"{name}.jsonl").read_text().splitlines()[:count], name

