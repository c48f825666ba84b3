"""SPhyR-v2 generation (sphyr_jax.data.generate_v2), checked rule by rule.

Three levels.  The draws and the masks: pure NumPy over many seeds, at N = 10
and N = 20.  A small generated set (4 samples at N = 10, cheap SIMP settings)
through the library and the app: files, records, rules, separations, same seed
same bytes, and every answer load carrying under its own direction with the
compliance of an independent SciPy Q4 model loaded along that direction.  The
shipped sets (the embedded ``dataset_v2`` and ``dataset_v2_20``): the same rules
read off the files, and SciPy compliance of every answer.
"""

import functools
import itertools
import json
import math
import re

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
from conftest import SETS, run_app

import sphyr_jax
from sphyr_jax.data import generate_v2 as g2
from sphyr_jax.data.datasets import (
    VARIANTS,
    dataset_source,
    list_subjects,
    load_subject,
    subject_rng,
)
from sphyr_jax.data.generation import GenerationError

DIRECTIONS = {(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1)}
# Masked cells / lines per variant, worked out by hand from the published rule
# (round(k (N/10)^2) cells, round(k N/10) lines).
EXPECTED_COUNTS = {
    10: {"1_random_cell": 1, "5_random_cell": 5, "10_random_cell": 10, "1_random_row": 1,
         "3_random_row": 3, "1_random_column": 1, "3_random_column": 3},
    20: {"1_random_cell": 4, "5_random_cell": 20, "10_random_cell": 40, "1_random_row": 2,
         "3_random_row": 6, "1_random_column": 2, "3_random_column": 6},
}
SOLID_CELLS = {10: 30, 20: 120}  # round(0.3 N^2), load and support cells included
SMALL = dict(grid_size=10, options=g2.QUICK_V2_OPTIONS, batch_size=8)
SAMPLES = 4
SEED = 3
ONE_DECIMAL = re.compile(r"(0\.\d|1\.0)")


# ----------------------------------------------------------------------------
# An independent plane-stress Q4 model (SciPy), written from DESIGN.md.


@functools.lru_cache(maxsize=1)
def _q4_stiffness(nu: float = 0.3) -> np.ndarray:
    """Unit-square Q4 element matrix by 2x2 Gauss quadrature; x right, y down (grid rows).

    Nodes: top-left, top-right, bottom-right, bottom-left; DOFs (x, y) per node.
    """
    d = np.array([[1.0, nu, 0.0], [nu, 1.0, 0.0], [0.0, 0.0, (1.0 - nu) / 2]]) / (1.0 - nu**2)
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    ke = np.zeros((8, 8))
    gauss = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))
    for x, y in itertools.product(gauss, gauss):
        # bilinear shape functions N_i = (1 - |x - x_i|)(1 - |y - y_i|) on the unit square
        dndx = np.array([(1 if cx else -1) * (1 - abs(y - cy)) for cx, cy in corners])
        dndy = np.array([(1 if cy else -1) * (1 - abs(x - cx)) for cx, cy in corners])
        b = np.zeros((3, 8))
        b[0, 0::2], b[1, 1::2] = dndx, dndy
        b[2, 0::2], b[2, 1::2] = dndy, dndx
        ke += 0.25 * b.T @ d @ b
    return ke


@functools.lru_cache(maxsize=4)
def _element_dofs(n_rows: int, n_cols: int) -> np.ndarray:
    """(cells, 8) DOFs of every element, nodes top-left, top-right, bottom-right, bottom-left."""
    width = n_cols + 1
    r, c = np.divmod(np.arange(n_rows * n_cols), n_cols)
    nodes = np.stack([r * width + c, r * width + c + 1, (r + 1) * width + c + 1,
                      (r + 1) * width + c], axis=1)
    return np.stack([2 * nodes, 2 * nodes + 1], axis=2).reshape(-1, 8)


def scipy_compliance(tokens, gravity) -> float:
    """Compliance of a token grid (L/S solid, numbers as densities), load along ``gravity``."""
    grid = np.asarray(tokens, dtype=object)
    n_rows, n_cols = grid.shape
    load, support = (grid == "L").ravel(), (grid == "S").ravel()
    rho = np.ones(grid.size)
    numbers = ~(load | support)
    rho[numbers] = [float(t) for t in grid.ravel()[numbers]]
    edofs = _element_dofs(n_rows, n_cols)
    n_dofs = 2 * (n_rows + 1) * (n_cols + 1)
    e = 1e-9 + rho**3 * (1.0 - 1e-9)
    k = scipy.sparse.coo_matrix(
        ((e[:, None, None] * _q4_stiffness()).ravel(),
         (np.repeat(edofs, 8, axis=1).ravel(), np.tile(edofs, (1, 8)).ravel())),
        shape=(n_dofs, n_dofs)).tocsc()
    g = np.asarray(gravity, float) / np.hypot(*gravity)
    force = np.zeros(n_dofs)
    share = 1.0 / (4 * load.sum())
    np.add.at(force, edofs[load][:, 0::2].ravel(), share * g[1])  # x: along columns
    np.add.at(force, edofs[load][:, 1::2].ravel(), share * g[0])  # y: along rows (down)
    fixed = np.zeros(n_dofs, bool)
    fixed[edofs[support].ravel()] = True
    free = np.flatnonzero(~fixed)
    u = np.zeros(n_dofs)
    # SuperLU with a symmetric ordering (fast, and no BLAS threads to oversubscribe).
    u[free] = scipy.sparse.linalg.spsolve(k[free][:, free], force[free],
                                          permc_spec="MMD_AT_PLUS_A")
    return float(force @ u)


def _solid(tokens):
    return [[t if t in ("L", "S") else "1" for t in row] for row in tokens]


def test_scipy_model_is_the_88_line_element():
    # The quadrature element equals the closed form of the classic 88-line code
    # (nu = 0.3), so the SciPy model is the contract's model.
    nu = 0.3
    k = np.array([1 / 2 - nu / 6, 1 / 8 + nu / 8, -1 / 4 - nu / 12, -1 / 8 + 3 * nu / 8,
                  -1 / 4 + nu / 12, -1 / 8 - nu / 8, nu / 6, 1 / 8 - 3 * nu / 8]) / (1 - nu**2)
    pattern = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [2, 1, 8, 7, 6, 5, 4, 3],
                        [3, 8, 1, 6, 7, 4, 5, 2], [4, 7, 6, 1, 8, 3, 2, 5],
                        [5, 6, 7, 8, 1, 2, 3, 4], [6, 5, 4, 3, 2, 1, 8, 7],
                        [7, 4, 5, 2, 3, 8, 1, 6], [8, 3, 2, 5, 4, 7, 6, 1]]) - 1
    np.testing.assert_allclose(_q4_stiffness(), k[pattern], rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------
# Draws.


def _edge_of(cells, n):
    """Edges holding every cell of a group (a corner group can sit on two)."""
    return [e for e in g2.EDGES if set(cells) <= set(g2.edge_cells(e, n))]


def _contiguous_on(cells, edge, n):
    line = g2.edge_cells(edge, n)
    pos = sorted(line.index(c) for c in cells)
    return pos == list(range(pos[0], pos[0] + len(pos)))


@pytest.mark.parametrize("n", [10, 20])
def test_draws_follow_the_v2_rules(n):
    rng = np.random.default_rng(n)
    drawn = [g2.draw_v2_candidate(rng, n) for _ in range(3000)]
    kept = [c for c in drawn if c is not None]
    assert len(kept) > 2900
    for cand in kept:
        loads = [tuple(map(int, rc)) for rc in np.argwhere(cand.load_mask)]
        assert 1 <= len(loads) <= 3
        assert cand.load_edge in _edge_of(loads, n) and _contiguous_on(loads, cand.load_edge, n)
        assert 1 <= len(cand.support_groups) == len(cand.support_edges) <= 2
        for k, (group, edge) in enumerate(zip(cand.support_groups, cand.support_edges,
                                              strict=True)):
            lo, hi = (2, 5) if k == 0 else (2, 4)
            assert lo <= len(group) <= hi and edge != cand.load_edge
            assert edge in _edge_of(group, n) and _contiguous_on(group, edge, n)
        union = np.zeros((n, n), bool)
        for group in cand.support_groups:
            union[tuple(np.array(group).T)] = True
        np.testing.assert_array_equal(cand.support_mask, union & ~cand.load_mask)
        assert cand.support_mask.sum() >= 2 and not (cand.support_mask & cand.load_mask).any()
        assert cand.gravity_dir in DIRECTIONS
    share = lambda pred: sum(map(pred, kept)) / len(kept)  # noqa: E731
    # Binomial bounds, 4.5 standard deviations for ~3000 draws.
    assert abs(share(lambda c: len(c.support_groups) == 2) - 0.35) < 0.04
    for d in DIRECTIONS:
        assert abs(share(lambda c, d=d: c.gravity_dir == d) - 1 / 8) < 0.03
    for e in g2.EDGES:
        assert abs(share(lambda c, e=e: c.load_edge == e) - 1 / 4) < 0.04
    again = np.random.default_rng(n)
    for cand in drawn[:50]:
        other = g2.draw_v2_candidate(again, n)
        assert (cand is None) == (other is None)
        if cand is not None:
            assert np.array_equal(cand.layout(), other.layout())
            assert cand.gravity_dir == other.gravity_dir


def test_supports_on_loads_are_dropped_and_short_draws_redrawn():
    cand = g2.make_v2_candidate(10, [(0, 0), (0, 1)], [[(0, 0), (1, 0), (2, 0)]], (1, 1),
                                "top", ("left",))
    assert sorted(map(tuple, np.argwhere(cand.support_mask).tolist())) == [(1, 0), (2, 0)]
    # A two-cell group sharing its corner with the load keeps one cell: redrawn.
    assert g2.make_v2_candidate(10, [(0, 0)], [[(0, 0), (1, 0)]], (1, 0), "top",
                                ("left",)) is None
    # Two overlapping groups count their cells once.
    twin = g2.make_v2_candidate(10, [(9, 5)], [[(3, 0), (4, 0)], [(4, 0), (5, 0)]], (1, 0),
                                "bottom", ("left", "left"))
    assert twin.support_mask.sum() == 3
    with pytest.raises(ValueError, match="at least"):
        g2.draw_v2_candidate(np.random.default_rng(0), 4)


# ----------------------------------------------------------------------------
# Masks.


@pytest.mark.parametrize("n", [10, 20])
def test_mask_counts_and_coverage(n):
    assert g2.solid_budget(n) == SOLID_CELLS[n]
    for variant, count in EXPECTED_COUNTS[n].items():
        assert g2.mask_count(variant, n) == count
    free = np.ones((n, n), bool)
    free[0, :3] = free[n - 1, 4:9] = False  # loads and supports
    free[2, :] = False  # a row without free cells is never drawn
    free[:, 5] = False  # nor a column
    rng = np.random.default_rng(0)
    for variant in VARIANTS:
        for _ in range(40):
            mask = g2.v2_mask(variant, free, rng)
            assert not (mask & ~free).any()
            if variant == "full":
                np.testing.assert_array_equal(mask, free)
                continue
            kind = variant.split("_")[-1]
            count = EXPECTED_COUNTS[n][variant]
            if kind == "cell":
                assert mask.sum() == count
                continue
            lines_mask = mask if kind == "row" else mask.T
            lines_free = free if kind == "row" else free.T
            lines = np.flatnonzero(lines_mask.any(axis=1))
            assert len(lines) == count and (2 if kind == "row" else 5) not in lines
            np.testing.assert_array_equal(lines_mask[lines], lines_free[lines])
    a, b = subject_rng(7, "full_easy"), subject_rng(7, "full_hard")
    assert a.integers(1 << 30) != b.integers(1 << 30)
    assert subject_rng(7, "x").integers(1 << 30) == subject_rng(7, "x").integers(1 << 30)


# ----------------------------------------------------------------------------
# Rules read off a folder of v2 subject files (generated or shipped).


def _read(folder, subject):
    with open(folder / f"{subject}.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def check_v2_folder(folder, n: int, count: int) -> list[dict]:
    """Every v2 rule visible in the 16 files; returns the samples (layout, answers, direction)."""
    subjects = {s: _read(folder, s) for s in list_subjects()}
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{s}.jsonl" for s in subjects)
    samples = []
    for i in range(count):
        recs = {s: records[i] for s, records in subjects.items()}
        first = recs["full_easy"]
        gravity = tuple(first["gravity_dir"])
        assert gravity in DIRECTIONS
        easy = np.array(first["ground_truth"], dtype=object)
        hard = np.array(recs["full_hard"]["ground_truth"], dtype=object)
        assert easy.shape == (n, n)
        load, support = easy == "L", easy == "S"
        for s, rec in recs.items():
            assert set(rec) == {"index", "input_grid", "ground_truth", "gravity_dir"}
            assert rec["index"] == i and tuple(rec["gravity_dir"]) == gravity
            truth = np.array(rec["ground_truth"], dtype=object)
            np.testing.assert_array_equal(truth, hard if s.endswith("hard") else easy)
            masked = np.array(rec["input_grid"], dtype=object) == "V"
            free = ~(load | support)
            assert not (masked & ~free).any()
            np.testing.assert_array_equal(np.array(rec["input_grid"], dtype=object)[~masked],
                                          truth[~masked])
            variant = s.rsplit("_", 1)[0]
            kind = variant.split("_")[-1]
            if variant == "full":
                np.testing.assert_array_equal(masked, free)
            elif kind == "cell":
                assert masked.sum() == EXPECTED_COUNTS[n][variant]
            else:
                lines_m, lines_f = (masked, free) if kind == "row" else (masked.T, free.T)
                lines = np.flatnonzero(lines_m.any(axis=1))
                assert len(lines) == EXPECTED_COUNTS[n][variant]
                np.testing.assert_array_equal(lines_m[lines], lines_f[lines])
        # loads: 1-3 contiguous cells on one edge; supports: 2-9 border cells off that edge
        loads = [tuple(map(int, rc)) for rc in np.argwhere(load)]
        supports = [tuple(map(int, rc)) for rc in np.argwhere(support)]
        assert 1 <= len(loads) <= 3 and 2 <= len(supports) <= 9
        border = {e: set(g2.edge_cells(e, n)) for e in g2.EDGES}
        assert any(_contiguous_on(loads, e, n)
                   and all(any(c in border[o] for o in g2.EDGES if o != e) for c in supports)
                   for e in _edge_of(loads, n))
        tokens = easy[~(load | support)]
        assert set(tokens) <= {"0", "1"}
        assert (tokens == "1").sum() + len(loads) + len(supports) == SOLID_CELLS.get(
            n, g2.solid_budget(n))
        assert all(ONE_DECIMAL.fullmatch(t) for t in hard[~(load | support)])
        samples.append({"layout": load.astype(int) + 2 * support.astype(int),
                        "structure": (easy != "0"), "easy": easy.tolist(),
                        "hard": hard.tolist(), "gravity": gravity})
    for key, least in (("layout", g2.MIN_LAYOUT_DISTANCE),
                       ("structure", g2.MIN_STRUCTURE_DISTANCE)):
        flat = np.stack([s[key].ravel() for s in samples])
        apart = (flat[:, None, :] != flat[None, :, :]).sum(axis=-1)
        assert apart[np.triu_indices(len(samples), 1)].min(initial=least) >= least
    return samples


def _check_physics(samples, rtol=1e-8, with_jax=True):
    """Every answer carries the load along its own direction; compliance = SciPy's."""
    grids = [s[k] for s in samples for k in ("easy", "hard")]
    gravity = [s["gravity"] for s in samples for _ in range(2)]
    ref = np.array([scipy_compliance(t, gr) for t, gr in zip(grids, gravity, strict=True)])
    solid = np.array([scipy_compliance(_solid(s["easy"]), s["gravity"]) for s in samples])
    assert np.all(np.isfinite(ref)) and np.all(ref <= 1e3 * np.repeat(solid, 2))
    if with_jax:
        case = sphyr_jax.stack_load_cases([sphyr_jax.load_case_from_grid(t, gravity_dir=gr)
                                           for t, gr in zip(grids, gravity, strict=True)])
        rho = np.stack([sphyr_jax.densities_from_grid(t)[0] for t in grids])
        res = sphyr_jax.analyze(case, rho)
        np.testing.assert_allclose(np.asarray(res.compliance), ref, rtol=rtol)
        assert np.asarray(res.load_carrying).all()
    return ref


# ----------------------------------------------------------------------------
# A small generated set, through the library and through the app.


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("v2") / "data"
    summary = g2.generate_v2_dataset(out, SAMPLES, seed=SEED, **SMALL)
    return out, summary


def test_generated_set_follows_the_rules(generated):
    out, summary = generated
    samples = check_v2_folder(out, 10, SAMPLES)
    assert summary["kept"] == SAMPLES
    assert summary["drawn"] == (SAMPLES + sum(summary["rejected"].values())
                                + summary["unused"])
    assert set(summary["rejected"]) == set(g2.REJECTION_REASONS)
    assert [s["gravity_dir"] for s in summary["samples"]] == [list(s["gravity"])
                                                              for s in samples]
    records = load_subject(str(out), "3_random_row_hard")
    assert [tuple(r["gravity_dir"]) for r in records] == [s["gravity"] for s in samples]


def test_generated_answers_carry_their_own_load(generated):
    out, summary = generated
    samples = check_v2_folder(out, 10, SAMPLES)
    ref = _check_physics(samples)
    stored = [(s["easy_compliance"], s["hard_compliance"]) for s in summary["samples"]]
    np.testing.assert_allclose(ref, np.ravel(stored), rtol=1e-8)
    # The direction matters: loaded across its own direction, an answer is another
    # problem (a reversed load, -g, gives the same compliance: c is quadratic in f).
    across = [scipy_compliance(s["easy"], (-s["gravity"][1], s["gravity"][0]))
              for s in samples]
    assert all(abs(a - b) > 1e-2 * b for a, b in zip(across, ref[0::2], strict=True))


def test_attempt_bound_raises_and_writes_nothing(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(GenerationError, match=r"kept only \d+ of 20 samples after 8 draws"):
        g2.generate_v2_dataset(out, 20, seed=SEED, max_attempts=8, **SMALL)
    assert not out.exists()



def test_app_writes_the_same_bytes_for_the_same_seed(generated, tmp_path, monkeypatch,
                                                      capsys):
    """The command writes the library call's bytes and prints its counts as a table
    (and, with --output_json, as JSON)."""
    out, first = generated
    quick = functools.partial(g2.generate_v2_dataset, options=SMALL["options"],
                              batch_size=SMALL["batch_size"])
    monkeypatch.setattr(g2, "generate_v2_dataset", quick)
    again = tmp_path / "again"
    summary_json = tmp_path / "summary.json"
    status = run_app(["generate", "--dataset_version=v2", f"--num_samples={SAMPLES}",
                      f"--seed={SEED}", f"--output_dir={again}", "--progress=false",
                      f"--output_json={summary_json}"], monkeypatch)
    assert status == 0
    for name in list_subjects():
        assert (again / f"{name}.jsonl").read_bytes() == (out / f"{name}.jsonl").read_bytes()
    captured = capsys.readouterr()
    assert captured.err == ""
    rows = dict(re.findall(r"^(kept|drawn|solved|unused)\s+(\d+)$", captured.out, re.M))
    assert rows == {k: str(first[k]) for k in ("kept", "drawn", "solved", "unused")}
    for reason, count in first["rejected"].items():
        assert re.search(rf"^rejected: {reason}\s+{count}$", captured.out, re.M), reason
    assert "16 subject files" in captured.out and "raw/" not in captured.out
    assert f"kept {SAMPLES} of" in captured.out and "{" not in captured.out
    assert json.loads(summary_json.read_text())["kept"] == SAMPLES


@pytest.mark.parametrize("argv, message", [
    (["--dataset_version=v2-20", "--grid_size=10"], "20x20"),
    (["--dataset_version=v2", "--volume_fraction=0.2"], "v1 generation only"),
    (["--dataset_version=v2", "--gravity_dirs=up"], "v1 generation only"),
    (["--dataset_version=v2", "--grid_size=4"], "at least 5"),
])
def test_app_refuses_v1_options_for_v2(argv, message, tmp_path, monkeypatch, capsys):
    status = run_app(["generate", *argv, f"--output_dir={tmp_path / 'x'}"], monkeypatch)
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------
# The shipped sets.


@pytest.mark.parametrize("version, n", [("v2", 10), ("v2-20", 20)])
def test_shipped_sets_follow_the_rules(version, n):
    folder = SETS / {"v2": "dataset_v2", "v2-20": "dataset_v2_20"}[version]
    assert dataset_source(version) == str(folder)
    samples = check_v2_folder(folder, n, 100)
    assert {s["gravity"] for s in samples} == DIRECTIONS
    assert len(_read(folder, "full_easy")) == 100
    # SciPy alone on 20x20 (a JAX compile per shape is the costly part); JAX on 10x10.
    _check_physics(samples, with_jax=(n == 10))


@pytest.mark.parametrize("version, n, count", [("v2", 10, 3), ("v2-20", 20, 2)])
def test_shipped_sets_regenerate_byte_for_byte(version, n, count, tmp_path):
    """The first samples of a shipped set come back from seed 0 and the default
    settings, record for record in every subject (the candidate stream, the kept
    order and the per-subject masks do not depend on how many samples are asked for, and
    the answers not on how many candidates are solved together)."""
    folder = SETS / {"v2": "dataset_v2", "v2-20": "dataset_v2_20"}[version]
    g2.generate_v2_dataset(tmp_path, count, seed=0, grid_size=n, num_devices=1, batch_size=2)
    for name in list_subjects():
        ours = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        assert ours == (folder / f"{name}.jsonl").read_text().splitlines()[:count], name

