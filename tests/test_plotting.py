"""Figures: valid PNGs, and the plotted data checked against independent truths.

Truths: densities written out by hand, a displacement field solved here with a
dense NumPy assembly of the element matrices (own DOF bookkeeping), an
exhaustive search over the masked row of a tiny sample, and byte-identical
renders of the direct plotting calls.  Only one test runs an optimiser, with
light options, on a sample whose design region is a single row.
"""

from __future__ import annotations

import itertools
import json

import jax
import numpy as np
import pytest

from sphyr_jax.fem import elements, fea
from sphyr_jax.problem.loadcase import load_case_from_grid
from sphyr_jax.topopt import optimum
from sphyr_jax.topopt.options import StrongOptions

matplotlib = pytest.importorskip("matplotlib")
plotting = pytest.importorskip("sphyr_jax.app.plotting")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A 10x10 sample: loads on the top row, supports on the bottom row, two legs.
GROUND_TRUTH = """\
0 0 L L L L 0 0 0 0
0 0 1 1 1 1 0 0 0 0
0 0 1 0 0 1 0 0 0 0
0 1 1 0 0 1 1 0 0 0
0 1 0 0 0 0 1 0 0 0
0 1 0 0 0 0 1 0 0 0
0 1 1 0 0 1 1 0 0 0
0 0 1 1 1 1 0 0 0 0
0 0 1 0 0 1 0 0 0 0
0 0 S S S S 0 0 0 0"""

# A small cantilever: supports on the left column, load at the right end.
CANTILEVER = """\
S 1 1 1 1 1
S 1 0 0 1 1
S 1 1 1 1 L"""


def check_png(path) -> np.ndarray:
    """A decodable, non-empty, non-uniform PNG; returns its pixels."""
    from matplotlib.image import imread

    data = open(path, "rb").read()
    assert data[:8] == PNG_MAGIC
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 0 and pixels.shape[1] > 0
    assert np.ptp(pixels.reshape(-1, pixels.shape[-1]), axis=0).max() > 0.1
    return pixels


def numpy_displacements(case, rho, penal=3.0) -> np.ndarray:
    """(nely + 1, nelx + 1, 2) displacements from a dense assembly written here.

    Node (i, j) is n = i * (nelx + 1) + j with DOFs 2n (x) and 2n + 1 (y); an
    element's nodes are top-left, top-right, bottom-right, bottom-left.
    """
    nely, nelx = case.shape
    n = 2 * (nely + 1) * (nelx + 1)
    rows, cols, vals = [], [], []
    ke = elements.element_stiffness(2)
    for r, c in itertools.product(range(nely), range(nelx)):
        nodes = [r * (nelx + 1) + c, r * (nelx + 1) + c + 1,
                 (r + 1) * (nelx + 1) + c + 1, (r + 1) * (nelx + 1) + c]
        dofs = np.ravel([[2 * v, 2 * v + 1] for v in nodes])
        rows.append(np.repeat(dofs, 8))
        cols.append(np.tile(dofs, 8))
        vals.append(((1e-9 + rho[r, c] ** penal * (1 - 1e-9)) * ke).ravel())
    k = np.zeros((n, n))
    np.add.at(k, (np.concatenate(rows), np.concatenate(cols)), np.concatenate(vals))
    free = np.flatnonzero(np.asarray(case.free_dofs))
    u = np.zeros(n)
    f = np.asarray(case.force)
    u[free] = np.linalg.solve(k[np.ix_(free, free)], f[free])
    return u.reshape(nely + 1, nelx + 1, 2)


def numpy_compliance(case, rho) -> float:
    return float(np.asarray(case.force) @ numpy_displacements(case, rho).reshape(-1))


def solid_bc(case, rho):
    rho = np.array(rho, dtype=np.float64)
    rho[np.asarray(case.load_mask | case.support_mask)] = 1.0
    return rho


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_plot_grid_image_is_the_density_array(tmp_path, rng):
    rho = rng.uniform(size=(6, 9))
    fig = plotting.plot_grid(rho, title="densities")
    ax = fig.axes[0]
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), rho)
    assert ax.images[0].get_clim() == (0.0, 1.0)
    assert ax.get_title() == "densities"
    check_png(plotting.save_figure(fig, tmp_path / "sub" / "rho.png"))


def test_plot_grid_tokens_marks_load_support_and_masked_cells(tmp_path):
    grid = [["L", "0.5", "V"], ["1", "V", "0"], ["S", "S", "0.2"]]
    expected = np.array([[1.0, 0.5, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.2]])
    fig = plotting.plot_grid("\n".join(" ".join(row) for row in grid))
    ax = fig.axes[0]
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), expected)
    assert sorted(texts(ax)) == ["L", "S", "S"]
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert sorted((p.get_x(), p.get_y()) for p in hatched) == [(0.5, 0.5), (1.5, -0.5)]
    check_png(plotting.save_figure(fig, tmp_path / "tokens.png"))


def test_plot_layers_draws_every_voxel_layer(tmp_path):
    """A 3D grid: one panel per layer, each image that layer's densities, L/S/V marked."""
    layers = [[["L", "L", "0"], ["0", "1", "0"]],
              [["V", "0.5", "1"], ["1", "V", "0"]],
              [["S", "S", "0"], ["0", "S", "0"]]]
    fig = plotting.plot_grid(layers, title="voxels")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 3
    expected = [np.array([[1, 1, 0], [0, 1, 0]]), np.array([[0, 0.5, 1], [1, 0, 0]]),
                np.array([[1, 1, 0], [0, 1, 0]])]
    for k, (ax, want) in enumerate(zip(panels, expected, strict=True)):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), want)
        assert ax.get_title() == f"layer {k}"
    assert sorted(texts(panels[0])) == ["L", "L"]
    assert sorted(texts(panels[2])) == ["S", "S", "S"]
    assert len([p for p in panels[1].patches if p.get_hatch()]) == 2
    check_png(plotting.save_figure(fig, tmp_path / "layers.png"))


def test_plot_comparison_marks_bcs_from_ground_truth(tmp_path):
    # The completion drops the load letters; the ground truth still marks them.
    completion = "Here you go:\n```\n" + GROUND_TRUTH.replace("L", "1") + "\n```"
    metrics = {"topology_score": 0.75, "compliance": 12.5, "ground_truth_compliance": 10.0}
    fig = plotting.plot_comparison(completion, GROUND_TRUTH, np.ones((10, 10)), metrics=metrics)
    axes = fig.axes
    assert len(axes) == 3
    for ax in axes:
        assert texts(ax).count("L") == 4 and texts(ax).count("S") == 4
    assert "c = 12.5" in axes[0].get_title() and "c = 10" in axes[1].get_title()
    assert "topology_score 0.75" in fig.get_suptitle()
    check_png(plotting.save_figure(fig, tmp_path / "cmp.png"))

    fig = plotting.plot_comparison("I cannot solve this.", GROUND_TRUTH)
    assert len(fig.axes) == 2 and "no readable grid" in texts(fig.axes[0])


@pytest.mark.parametrize("gravity", [(1.0, 0.0), (0.0, 1.0)])
def test_plot_displacement_draws_the_fea_solution(tmp_path, rng, gravity):
    case = load_case_from_grid(CANTILEVER, gravity_dir=gravity)
    rho = solid_bc(case, rng.uniform(0.3, 1.0, size=case.shape))
    truth = numpy_displacements(case, rho)
    got = plotting.nodal_displacements(case, rho)
    np.testing.assert_allclose(got, truth, rtol=1e-9, atol=1e-12 * np.abs(truth).max())
    # The tip moves with the load: down for gravity (1, 0), right for (0, 1).
    component = 1 if gravity[0] else 0
    assert truth[-1, -1, component] > 0

    scale = 0.05
    fig = plotting.plot_displacement(case, rho, scale=scale)
    ax = fig.axes[0]
    (poly,) = [c for c in ax.collections if len(c.get_paths()) == rho.size]
    x, y = np.meshgrid(np.arange(case.shape[1] + 1) - 0.5, np.arange(case.shape[0] + 1) - 0.5)
    xd, yd = x + scale * truth[..., 0], y + scale * truth[..., 1]
    for e, path in enumerate(poly.get_paths()):
        r, c = divmod(e, case.shape[1])
        corners = [(r, c), (r, c + 1), (r + 1, c + 1), (r + 1, c)]
        expected = np.array([(xd[i, j], yd[i, j]) for i, j in corners])
        np.testing.assert_allclose(path.vertices[:4], expected, atol=1e-9)
    (arrow,) = ax.texts
    direction = np.subtract(arrow.xy, arrow.xyann)
    np.testing.assert_allclose(direction / np.linalg.norm(direction), gravity[::-1], atol=1e-12)
    check_png(plotting.save_figure(fig, tmp_path / "disp.png"))


def test_plot_leaderboard_orders_models_and_skips_missing(tmp_path):
    rows = [{"model": "a", "topology_score": 0.4}, {"model": "b", "topology_score": 0.9},
            {"model": "c", "topology_score": None}, {"model": "d", "topology_score": 0.6}]
    fig = plotting.plot_leaderboard(rows)
    ax = fig.axes[0]
    widths = [p.get_width() for p in ax.patches]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert widths == [0.4, 0.6, 0.9] and labels == ["a", "d", "b"]  # best drawn on top
    check_png(plotting.save_figure(fig, tmp_path / "lb.png"))
    with pytest.raises(ValueError, match="topology_score"):
        plotting.plot_leaderboard([{"model": "c", "topology_score": None}])


VALIDATION = {
    "subject": "full_easy", "samples": 4, "beaten": 0,
    "rows": [
        {"probe": "dataset answer", "topology_score": 0.97, "structural_efficiency": 0.97,
         "material_efficiency": 1.0, "compliance_efficiency_vs_ground_truth": 1.0,
         "volume_ratio": 1.0, "load_carrying": 1.0},
        {"probe": "all solid", "topology_score": 0.3, "structural_efficiency": 1.0,
         "material_efficiency": 0.3, "compliance_efficiency_vs_ground_truth": 1.0,
         "volume_ratio": 3.3, "load_carrying": 1.0},
    ],
}
LEADERBOARD = {"rows": [{"model": "m1", "topology_score": 0.5},
                        {"model": "m2", "topology_score": 0.7}]}


@pytest.mark.parametrize("content, direct", [
    (VALIDATION, lambda: plotting.plot_validation(VALIDATION)),
    (LEADERBOARD, lambda: plotting.plot_leaderboard(LEADERBOARD["rows"])),
])
def test_render_file_detects_validation_and_leaderboard(tmp_path, content, direct):
    src = tmp_path / "in.json"
    src.write_text(json.dumps(content))
    out = plotting.render_file(src, tmp_path / "deep" / "out.png")
    check_png(out)
    reference = plotting.save_figure(direct(), tmp_path / "direct.png")
    assert out.read_bytes() == reference.read_bytes()
    assert not [p for p in out.parent.iterdir() if p.name != "out.png"]  # no temp files left


@pytest.mark.parametrize("content, index", [
    ("not json {", 0),
    (json.dumps({"foo": 1}), 0),
    (json.dumps([1, 2]), 0),
    (json.dumps({"rows": []}), 0),
    (json.dumps({"rows": [{"x": 1}]}), 0),
    (json.dumps([{"prompt": "", "completion": "0", "ground_truth": "0 0\n0 0"}]), 0),  # no L/S
    (json.dumps([{"completion": "1", "ground_truth": GROUND_TRUTH}]), 3),  # out of range
])
def test_render_file_rejects_bad_files(tmp_path, content, index):
    src = tmp_path / "bad.json"
    src.write_text(content)
    with pytest.raises(ValueError):
        plotting.render_file(src, tmp_path / "out.png", index=index)
    assert not (tmp_path / "out.png").exists()


def test_render_file_results_record(tmp_path, rng, monkeypatch):
    row = int(rng.integers(1, 9))  # one random design row
    gt_rows = GROUND_TRUTH.split("\n")
    input_rows = list(gt_rows)
    input_rows[row] = " ".join(["V"] * 10)
    completion_rows = list(gt_rows)
    completion_rows[row] = "1 1 1 1 1 1 1 1 1 1"
    prompt = "Fill in the V cells.\n\n" + "\n".join(input_rows) + "\n\nAnswer with the grid only."
    record = {"prompt": prompt, "completion": "```\n" + "\n".join(completion_rows) + "\n```",
              "ground_truth": GROUND_TRUTH, "topology_score": 0.5}
    folder = tmp_path / "toy-model_3_rotations"  # gravity (0, 1) from the folder name
    folder.mkdir()
    src = folder / "full_easy_results.json"
    src.write_text(json.dumps([{"prompt": "", "completion": "", "ground_truth": ""}, record]))

    figures = []
    monkeypatch.setattr(plotting, "save_figure",
                        lambda fig, path, save=plotting.save_figure: (figures.append(fig),
                                                                      save(fig, path))[1])
    light = StrongOptions(polish_starts=0, tabu_passes=0, extra_chain_radius=None)
    out = plotting.render_file(src, tmp_path / "rec.png", index=1,
                               cache=optimum.OptimumCache(options=light))
    check_png(out)
    (fig,) = figures
    comp_ax, gt_ax, opt_ax, disp_ax = fig.axes[:4]
    assert "topology_score 0.5" in fig.get_suptitle()

    case = load_case_from_grid(GROUND_TRUTH, "\n".join(input_rows), (0.0, 1.0))
    completion = solid_bc(case, np.where(np.arange(10)[:, None] == row, 1.0, case.pinned))
    np.testing.assert_array_equal(np.asarray(comp_ax.images[0].get_array()), completion)
    np.testing.assert_array_equal(np.asarray(gt_ax.images[0].get_array()), case.pinned)

    # The optimum: pinned cells kept, within budget, between the exhaustive
    # optimum of the masked row and the dataset answer.
    best = np.asarray(opt_ax.images[0].get_array())
    off = np.arange(10) != row
    np.testing.assert_array_equal(best[off], np.asarray(case.pinned)[off])
    assert best.sum() <= np.asarray(case.pinned).sum() + 1e-9
    solid = int(np.asarray(case.pinned)[row].sum())
    designs = []
    for k in range(solid + 1):
        for cells in itertools.combinations(range(10), k):
            d = np.array(case.pinned)
            d[row] = 0.0
            d[row, list(cells)] = 1.0
            designs.append(d)
    # The exhaustive search scores with the library's (separately tested) FEA.
    exhaustive = float(np.min(jax.jit(fea.compliance)(case, np.stack(designs))))
    c_best = numpy_compliance(case, best)
    c_gt = numpy_compliance(case, np.asarray(case.pinned))
    assert exhaustive * (1 - 1e-9) <= c_best <= c_gt * (1 + 1e-9)

    # Panel compliances agree with the dense NumPy solve.
    assert f"c = {numpy_compliance(case, completion):.4g}" in comp_ax.get_title()
    assert f"c = {c_gt:.4g}" in gt_ax.get_title()
    assert f"c = {c_best:.4g}" in opt_ax.get_title()
    # The displacement panel points the load along +x (the folder's gravity).
    arrow = [t for t in disp_ax.texts if hasattr(t, "xyann")][0]
    direction = np.subtract(arrow.xy, arrow.xyann)
    np.testing.assert_allclose(direction / np.linalg.norm(direction), (1.0, 0.0), atol=1e-12)
