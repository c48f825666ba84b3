"""SPhyR-3D data layer: raw voxel CSVs -> subjects, 3D grid text, 3D load cases."""

import json
import math
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, SETS, SHARED, require_shared

from sphyr_jax.data.convert import (
    ConversionError,
    build_subjects,
    convert_raw_dir,
    read_raw_csv_3d,
)
from sphyr_jax.data.datasets import (
    VARIANTS,
    DatasetError,
    is_hard,
    list_subjects,
    load_subject,
    subject_ndim,
)
from sphyr_jax.problem.grids import (
    InvalidProblemError,
    check_rectangular,
    densities_from_grid,
    extract_grid,
    grid_to_text,
)
from sphyr_jax.problem.loadcase import load_case_from_grid, normalise_gravity, stack_load_cases

RAW_3D = SHARED / "raw_data_3d"


@pytest.fixture(scope="module")
def raw_3d_dir():
    require_shared(RAW_3D)
    if not any(RAW_3D.glob("*_SPhyR_3D.csv")):
        require_shared(RAW_3D / "0_SPhyR_3D.csv")
    return RAW_3D


def _independent_grids(path):
    """Easy/hard ground truths read straight from a CSV: [layer][row][col] tokens."""
    rows = [line.split(",", 6) for line in path.read_text().splitlines() if line.strip()]
    xyz = [tuple(int(math.floor(float(v))) for v in r[1:4]) for r in rows]
    nx, ny, nz = (max(c[i] for c in xyz) + 1 for i in range(3))
    easy = [[[None] * nx for _ in range(ny)] for _ in range(nz)]
    hard = [[[None] * nx for _ in range(ny)] for _ in range(nz)]
    for (x, y, z), r in zip(xyz, rows, strict=True):
        density, static = float(r[4]), r[5].strip() == "True"
        layer, row = nz - 1 - z, ny - 1 - y
        if static:
            token = "S" if z == 0 else "L"
            easy[layer][row][x] = hard[layer][row][x] = token
        else:
            value = round(density, 1)
            easy[layer][row][x] = "1" if value > 0 else "0"
            hard[layer][row][x] = f"{abs(value):.1f}" if value == 0 else f"{value:.1f}"
    return easy, hard


def _write_csv(path, voxels, drop=None):
    """voxels: dict (x, y, z) -> (density, static); optional line edits."""
    lines = []
    for i, ((x, y, z), (d, s)) in enumerate(sorted(voxels.items(), key=lambda kv: kv[0][::-1])):
        lines.append(f"{i},{x + 0.5},{y + 0.5},{z + 0.5},{d},{s},[]")
    if drop:
        lines = drop(lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def _set_field(lines, index, field, value):
    parts = lines[index].split(",")
    parts[field] = value
    return lines[:index] + [",".join(parts)] + lines[index + 1 :]


def _small_voxels(n=4):
    vox = {}
    for x in range(n):
        for y in range(n):
            for z in range(n):
                static = (z == 0 and 1 <= x <= 2) or (z == n - 1 and x == 1 and y == 1)
                vox[(x, y, z)] = (1.0 if static else (0.001 if (x + y + z) % 3 else 0.96), static)
    return vox


def test_conversion_reproduces_independent_reading(raw_3d_dir, tmp_path):
    files = sorted(raw_3d_dir.glob("*_SPhyR_3D.csv"), key=lambda p: p.name)
    written = convert_raw_dir(raw_3d_dir, tmp_path)
    assert set(written) == set(list_subjects(3)) and set(written.values()) == {len(files)}
    for level in ("easy", "hard"):
        for variant in VARIANTS:
            records = [json.loads(line) for line in
                       (tmp_path / f"{variant}_{level}_3d.jsonl").read_text().splitlines()]
            for position, (path, rec) in enumerate(zip(files, records, strict=True)):
                easy, hard = _independent_grids(path)
                assert rec["index"] == position
                assert rec["ground_truth"] == (easy if level == "easy" else hard), path.name
                # Masking only replaces cells by V.
                gt, inp = np.array(rec["ground_truth"]), np.array(rec["input_grid"])
                assert inp.shape == (10, 10, 10)
                assert np.all((inp == gt) | (inp == "V"))


def test_mask_shapes_per_variant(raw_3d_dir, tmp_path):
    convert_raw_dir(raw_3d_dir, tmp_path)
    for subject in list_subjects(3):
        variant = subject.rsplit("_", 2)[0]
        for rec in load_subject(tmp_path, subject):
            v = np.array(rec["input_grid"]) == "V"
            nz, ny, nx = v.shape
            if variant == "full":
                expected = np.zeros_like(v)
                expected[1:-1] = True
                assert np.array_equal(v, expected)
                continue
            n = int(variant.split("_")[0])
            if variant.endswith("cell"):
                assert 1 <= v.sum() <= n
            elif variant.endswith("row"):
                lines = v.all(axis=2)  # (layer, row) lines along x
                assert lines.sum() == n and v.sum() == n * nx
                assert not lines[0].any() and not lines[-1].any()
            else:
                columns = v.all(axis=0)  # vertical (row, col) columns through all layers
                assert columns.sum() == n and v.sum() == n * nz


def test_masks_follow_the_documented_seed_42_stream(raw_3d_dir):
    samples = [read_raw_csv_3d(p) for p in sorted(raw_3d_dir.glob("*_SPhyR_3D.csv"))[:2]]
    subjects = build_subjects(samples, seed=42)
    rng = random.Random(42)
    for position in range(len(samples)):
        for variant in VARIANTS:
            for level in ("easy", "hard"):
                rec = subjects[f"{variant}_{level}_3d"][position]
                mask = np.array(rec["input_grid"]) == "V"
                expected = np.zeros((10, 10, 10), bool)
                kind = variant.split("_")[-1]
                n = int(variant.split("_")[0]) if variant != "full" else 0
                if kind == "cell":
                    for _ in range(n):
                        x, y, z = rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 9)
                        expected[z, y, x] = True
                elif kind == "row":
                    for k in rng.sample(range(8 * 10), n):
                        expected[1 + k // 10, k % 10, :] = True
                elif kind == "column":
                    for k in rng.sample(range(100), n):
                        expected[:, k // 10, k % 10] = True
                else:
                    expected[1:9] = True
                assert np.array_equal(mask, expected), (position, variant, level)


def test_read_raw_csv_3d_orientation_and_tokens(tmp_path):
    vox = _small_voxels()
    sample = read_raw_csv_3d(_write_csv(tmp_path / "7_SPhyR_3D.csv", vox))
    assert sample.index == 7 and sample.shape == (4, 4, 4) and sample.ndim == 3
    # Support at z = 0 is the last printed layer; the load at z = 3, y = 1 is layer 0, row 2.
    assert sample.easy[3, :, 1].tolist() == ["S"] * 4
    assert sample.easy[0, 2, 1] == "L" and sample.hard[0, 2, 1] == "L"
    assert sample.hard[1, 1, 0] == f"{round(vox[(0, 2, 2)][0], 1):.1f}"


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda ls: ls[:-1], r"end of file \(line 63\): 1 of 64 voxels missing"),
        (lambda ls: ls + [ls[5]], r"line 65: duplicate voxel x=1, y=1, z=0 \(first on line 6\)"),
        (lambda ls: _set_field(ls, 9, 4, "abc"), r"line 10: density is not a number: 'abc'"),
        (lambda ls: _set_field(ls, 6, 3, "1e400"), r"line 7: z is not finite"),
        (lambda ls: ls[:2] + [ls[2].replace("2.5,", "x,", 1)] + ls[3:],
         r"line 3: x is not a number"),
        (lambda ls: ls[:3] + [ls[3].replace(",False,", ",maybe,")] + ls[4:],
         r"line 4: is_static must be True or False"),
        (lambda ls: ls[:4] + ["4,1.5"] + ls[5:], r"line 5: short line"),
    ],
)
def test_bad_3d_csvs_name_file_and_line(tmp_path, edit, pattern):
    path = _write_csv(tmp_path / "3_SPhyR_3D.csv", _small_voxels(), drop=edit)
    with pytest.raises(ConversionError, match=r"3_SPhyR_3D\.csv, " + pattern) as info:
        read_raw_csv_3d(path)
    assert info.value.path == str(path) and info.value.line is not None


def test_convert_folder_of_3d_csvs_and_cli(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(3):
        _write_csv(raw / f"{i}_SPhyR_3D.csv", _small_voxels())
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "sphyr_jax", "convert", f"--raw_dir={raw}", f"--output_dir={out}",
         "--format=json", "--compilation_cache_dir="],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{s}.json" for s in list_subjects(3))
    stored = json.loads((out / "full_hard_3d.json").read_text())
    assert isinstance(stored[0]["ground_truth"], str) and "\n\n" in stored[0]["ground_truth"]
    records = load_subject(out, "full_hard_3d")  # text grids read back as layers
    truth = read_raw_csv_3d(raw / "0_SPhyR_3D.csv").hard.tolist()
    assert records[0]["ground_truth"] == truth
    with pytest.raises(ValueError, match="mix 2D and 3D"):
        from sphyr_jax.data.convert import read_raw_csv

        (tmp_path / "2d.csv").write_text("".join(
            f"{i},{i % 2 + 0.5},{i // 2 + 0.5},0,1.0,{i // 2 == 0}\n" for i in range(4)))
        build_subjects([read_raw_csv(tmp_path / "2d.csv"), read_raw_csv_3d(raw / "0_SPhyR_3D.csv")])


def test_subject_names():
    names = list_subjects(3)
    assert len(names) == 16 and names[0] == "1_random_cell_easy_3d" and "full_hard_3d" in names
    assert is_hard("full_hard_3d") and not is_hard("full_easy_3d")
    assert subject_ndim("full_easy_3d") == 3 and subject_ndim("full_easy") == 2
    with pytest.raises(DatasetError):
        is_hard("full_3d")


def test_3d_text_roundtrip_and_extraction():
    grid = [[["0", "1", "L"], ["1", "0", "0"]], [["1", "V", "0"], ["S", "S", "1"]]]
    text = grid_to_text(grid)
    assert text == "0 1 L\n1 0 0\n\n1 V 0\nS S 1"
    assert extract_grid(text, ndim=3) == grid
    noisy = ("Sure! Here is the structure.\n```plaintext\nLayer 1:\n0 1 L\n1 0 0\n\n"
             "Layer 2:\n1 V 0\nS S 1\n```\nHope this helps.")
    assert extract_grid(noisy, ndim=3) == grid
    restated = "First try:\n1 1\n1 1\n\nFinal answer:\n" + text
    assert extract_grid(restated, ndim=3) == grid
    assert extract_grid(json.dumps(grid), ndim=3) == grid
    assert extract_grid(grid, ndim=3) == grid
    assert check_rectangular(grid) == (2, 2, 3)
    ragged = [[["0", "1"], ["1", "0"]], [["1", "0"]]]
    with pytest.raises(InvalidProblemError, match="layer 1"):
        check_rectangular(ragged)
    dens, rep = densities_from_grid(text, ndim=3)
    assert dens.shape == (2, 2, 3) and rep.unfilled_cells == 1
    assert dens[0, 0, 2] == 1.0 and dens[1, 1, 0] == 1.0
    # 2D reading of the same text is unchanged: the last rectangular block.
    assert extract_grid(text) == grid[1]


def test_3d_load_case_force_supports_and_gravity():
    n = 3
    gt = [[["0"] * n for _ in range(n)] for _ in range(n)]
    gt[0][1][1] = "L"
    gt[0][1][2] = "L"
    gt[-1][0][0] = "S"
    inp = [[[t if (z, r) != (1, 1) else "V" for t in row] for r, row in enumerate(layer)]
           for z, layer in enumerate(gt)]
    case = load_case_from_grid(gt, inp)
    assert case.ndim == 3 and case.shape == (3, 3, 3) and case.batch_shape == ()
    f = np.asarray(case.force).reshape(4, 4, 4, 3)
    assert np.isclose(f.sum(), 1.0) and np.allclose(f[..., :2], 0.0)  # all along +layer (down)
    assert np.isclose(f[0, 1, 2, 2], 2 / 16) and np.isclose(f[1, 2, 3, 2], 1 / 16)
    fixed = ~np.asarray(case.free_dofs).reshape(4, 4, 4, 3)
    assert fixed.sum() == 8 * 3 and fixed[2:4, 0:2, 0:2].all()
    assert case.design_mask.sum() == 3 and case.design_mask[1, 1].all()
    sideways = load_case_from_grid(gt, gravity_dir=(0, 0, 2))
    fs = np.asarray(sideways.force).reshape(4, 4, 4, 3)
    assert np.isclose(fs[..., 0].sum(), 1.0)  # component 0 = along columns
    np.testing.assert_allclose(normalise_gravity((3, 0, 4), ndim=3), [0.6, 0.0, 0.8])
    with pytest.raises(InvalidProblemError, match="three"):
        load_case_from_grid(gt, gravity_dir=(1, 0))
    batch = stack_load_cases([case, sideways])
    assert batch.shape == (3, 3, 3) and batch.batch_shape == (2,)


def test_embedded_3d_dataset_is_our_converter_output(tmp_path):
    root = SETS / "dataset_3d"
    raw = root / "raw"
    if not raw.is_dir():
        pytest.skip("no embedded 3D dataset")
    convert_raw_dir(raw, tmp_path)
    for subject in list_subjects(3):
        assert (tmp_path / f"{subject}.jsonl").read_bytes() == (
            root / f"{subject}.jsonl").read_bytes(), subject


def test_2d_conversion_and_subjects_unchanged():
    assert list_subjects() == [f"{v}_{lvl}" for v in VARIANTS for lvl in ("easy", "hard")]
    assert pathlib.Path(SETS / "dataset" / "full_easy.jsonl").is_file()
