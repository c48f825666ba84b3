"""Figures of SPhyR grids, designs, displacement fields and scores.

matplotlib is imported lazily (``import sphyr_jax`` works without it); figures
are :class:`matplotlib.figure.Figure` objects on the Agg canvas, never made
through ``pyplot``, so no global figure state is created or leaked.  Every
plotting function returns its Figure; those taking ``ax`` draw into it instead.

Conventions: cell (row r, column c) is centred at (c, r), row 0 at the top;
density 0 is white, 1 black.  Node (i, j) (DOFs ``2n``, ``2n + 1``,
``n = i * (nelx + 1) + j``) sits at the cell corner (j - 0.5, i - 0.5).
Displacements need float64 (:func:`sphyr_jax.enable_x64`).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pathlib
import stat
import tempfile

import jax
import numpy as np

from sphyr_jax.errors import UserInputError
from sphyr_jax.fem import fea
from sphyr_jax.io import read_json
from sphyr_jax.problem.grids import (
    as_grid,
    check_rectangular,
    densities_from_grid,
    extract_grid,
    token_masks,
)
from sphyr_jax.problem.loadcase import LoadCase, load_case_from_grid, record_gravity

LOAD_COLOUR = "#d62728"
SUPPORT_COLOUR = "#1f77b4"
PROBE_METRICS = (
    "topology_score",
    "structural_efficiency",
    "material_efficiency",
    "compliance_efficiency_vs_ground_truth",
    "volume_ratio",
    "load_carrying",
)
_PANEL_KEYS = ("compliance", "ground_truth_compliance", "optimal_compliance")
# Compiled once per grid shape (op-by-op execution of the solvers is slow).
_solve = jax.jit(fea.solve)


def _new_figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself to the figure
    return fig


def _axes(ax, figsize=(4.0, 4.0)):
    fig = ax.figure if ax is not None else _new_figure(figsize)
    return fig, ax if ax is not None else fig.add_subplot()


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return f"{float(value):.4g}" if math.isfinite(float(value)) else "inf"
    return str(value)


def _layers(grid_or_densities, ndim: int | None = None):
    """(densities, load, support, masked) arrays of a grid or density array (2D or 3D)."""
    if hasattr(grid_or_densities, "shape") and hasattr(grid_or_densities, "dtype"):
        rho = np.asarray(grid_or_densities, dtype=np.float64)
        if rho.ndim not in (2, 3):
            raise ValueError(f"densities must be 2-D or 3-D, got shape {rho.shape}")
        empty = np.zeros(rho.shape, bool)
        return rho, empty, empty, empty
    tokens = as_grid(grid_or_densities, ndim=ndim) if ndim else as_grid(grid_or_densities)
    check_rectangular(tokens)
    return (densities_from_grid(tokens)[0],) + token_masks(tokens)


def plot_layers(grid_or_densities, title=None, columns: int = 5, ndim: int | None = None):
    """A 3D grid as its layers side by side, layer 0 (the top) first.

    Each panel is :func:`plot_grid` of one layer (rows and columns as printed),
    with its ``L``/``S``/``V`` cells marked.

    Args:
        grid_or_densities: 3D grid text (``ndim=3``) or nested token lists
            ``[layer][row][column]``, or an (nz, ny, nx) array.
        title: figure title.
        columns: panels per row of the figure.
    """
    rho, load, support, masked = _layers(grid_or_densities, ndim or 3)
    if rho.ndim != 3:
        raise ValueError(f"plot_layers needs a 3-D grid, got shape {rho.shape}")
    nz = rho.shape[0]
    cols = max(1, min(columns, nz))
    rows = -(-nz // cols)
    fig = _new_figure((2.2 * cols, 2.3 * rows + (0.4 if title else 0.0)))
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, ax in enumerate(axes.ravel()):
        if k >= nz:
            ax.set_axis_off()
            continue
        plot_grid(rho[k], ax=ax, title=f"layer {k}", load_mask=load[k],
                  support_mask=support[k], masked_mask=masked[k])
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _style_cells(ax, shape) -> None:
    nely, nelx = shape
    ax.set_xticks(np.arange(-0.5, nelx, 1.0), minor=True)
    ax.set_yticks(np.arange(-0.5, nely, 1.0), minor=True)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(which="minor", color="0.75", linewidth=0.5)
    ax.tick_params(which="both", length=0)


def plot_grid(grid_or_densities, ax=None, title=None, load_mask=None, support_mask=None,
              masked_mask=None):
    """Heat map of a token grid or density array (white 0 -> black 1).

    The image data is exactly the density field; ``L``/``S`` cells are drawn
    as red/blue squares with their letter, ``V`` cells as hatched grey.

    Args:
        grid_or_densities: grid text or token lists, or a (nely, nelx) array;
            a 3-D grid or (nz, ny, nx) array is drawn by :func:`plot_layers`.
        ax: axes to draw into (default: a new figure).
        title: axes title.
        load_mask: (nely, nelx) bool, replaces the grid's own ``L`` cells.
        support_mask: (nely, nelx) bool, replaces the grid's own ``S`` cells.
        masked_mask: (nely, nelx) bool, replaces the grid's own ``V`` cells.
    """
    from matplotlib.patches import Rectangle

    rho, load, support, masked = _layers(grid_or_densities)
    if rho.ndim == 3:
        if ax is not None:
            raise ValueError("a 3-D grid needs a figure of its own: use plot_layers")
        return plot_layers(grid_or_densities, title)
    load = load if load_mask is None else np.asarray(load_mask, bool)
    support = support if support_mask is None else np.asarray(support_mask, bool)
    masked = masked if masked_mask is None else np.asarray(masked_mask, bool)
    fig, ax = _axes(ax)
    ax.imshow(rho, cmap="gray_r", vmin=0.0, vmax=1.0, interpolation="nearest")
    for r, c in zip(*np.nonzero(masked), strict=True):
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor="0.85", edgecolor="0.55",
                               hatch="///", linewidth=0.0))
    for mask, letter, colour in ((load, "L", LOAD_COLOUR), (support, "S", SUPPORT_COLOUR)):
        for r, c in zip(*np.nonzero(mask), strict=True):
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor=colour, alpha=0.85,
                                   linewidth=0.0))
            ax.text(c, r, letter, ha="center", va="center", color="white",
                    fontsize=8, fontweight="bold")
    _style_cells(ax, rho.shape)
    if title:
        ax.set_title(title, fontsize=9)
    return fig


def _draw_comparison(axes, completion, ground_truth, optimum, titles, metrics) -> None:
    metrics = metrics or {}
    gt = as_grid(ground_truth)
    load, support, _ = token_masks(gt)
    panels = [completion, gt] + ([] if optimum is None else [optimum])
    for k, (ax, design) in enumerate(zip(axes, panels, strict=False)):
        title = titles[k] if k < len(titles) else ""
        if k < len(_PANEL_KEYS) and _PANEL_KEYS[k] in metrics:
            title = f"{title}\nc = {_fmt(metrics[_PANEL_KEYS[k]])}"
        grid = design if hasattr(design, "shape") else extract_grid(design)
        try:
            shape = _layers(grid)[0].shape if grid is not None else None
        except ValueError:  # includes InvalidProblemError (ragged, empty)
            shape = None
        if shape is None:
            ax.text(0.5, 0.5, "no readable grid", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
            ax.set_title(title, fontsize=9)
            continue
        same = shape == load.shape
        plot_grid(grid, ax=ax, title=title, load_mask=load if same else None,
                  support_mask=support if same else None)


def _summary(metrics, per_line: int = 3) -> str:
    parts = [f"{k} {_fmt(metrics[k])}" for k in PROBE_METRICS if k in (metrics or {})]
    return "\n".join(" | ".join(parts[i:i + per_line]) for i in range(0, len(parts), per_line))


def plot_comparison(completion, ground_truth, optimum=None,
                    titles=("completion", "dataset answer", "optimum"), metrics=None):
    """Side by side: completion, dataset answer and (optionally) the optimum.

    L and S cells are marked from the ground truth.  Compliances in
    ``metrics`` (``compliance``, ``ground_truth_compliance``,
    ``optimal_compliance``) go under the matching panel titles, scores such as
    ``topology_score`` into the figure title.

    Args:
        completion: raw model output, a token grid or densities.
        ground_truth: the dataset answer (text or tokens).
        optimum: optional (nely, nelx) densities or grid.
        titles: panel titles.
        metrics: optional dict of metric values (e.g. ``StructuralMetrics.as_dict()``).
    """
    n = 2 if optimum is None else 3
    fig = _new_figure((3.2 * n, 3.6))
    axes = fig.subplots(1, n)
    _draw_comparison(axes, completion, ground_truth, optimum, titles, metrics)
    if _summary(metrics):
        fig.suptitle(_summary(metrics), fontsize=9)
    return fig


def _solution(load_case: LoadCase, densities, penal=3.0):
    """(displacements (..., nely + 1, nelx + 1, 2), compliance (...)), L/S made solid."""
    rho = np.array(densities, dtype=np.float64)
    rho[..., np.asarray(load_case.load_mask | load_case.support_mask)] = 1.0
    sol = _solve(load_case, rho, penal=penal)
    nely, nelx = load_case.shape
    u = np.asarray(sol.displacements).reshape(rho.shape[:-2] + (nely + 1, nelx + 1, 2))
    return u, np.asarray(sol.compliance)


def nodal_displacements(load_case: LoadCase, densities, penal=3.0) -> np.ndarray:
    """Nodal displacements of designs (..., nely, nelx) as (..., nely + 1, nelx + 1, 2).

    Load and support cells are made solid first (as in the metrics); component
    0 is x (along increasing columns), component 1 is y (down the rows).
    """
    return _solution(load_case, densities, penal)[0]


def deformed_nodes(displacements: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Plot coordinates (X, Y), each (nely + 1, nelx + 1), of the deformed nodes."""
    ny, nx = displacements.shape[:2]
    x, y = np.meshgrid(np.arange(nx) - 0.5, np.arange(ny) - 0.5)
    return x + scale * displacements[..., 0], y + scale * displacements[..., 1]


def plot_displacement(load_case: LoadCase, densities, scale=None, ax=None, *,
                      displacements=None):
    """Deformed mesh of a design, coloured by nodal displacement magnitude.

    Each element is drawn at its deformed position, coloured by the mean
    displacement magnitude of its nodes and as opaque as its density, over the
    faint undeformed design; the load direction is a red arrow from the load
    cells, supports are blue squares.

    Args:
        load_case: one sample's boundary conditions.
        densities: (nely, nelx) design (L/S cells are made solid).
        scale: displacement magnification (default: the largest displacement
            drawn as 10% of the grid size).
        ax: axes to draw into (default: a new figure).
        displacements: precomputed :func:`nodal_displacements` (skips the solve).
    """
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    nely, nelx = load_case.shape
    rho = np.clip(np.asarray(densities, dtype=np.float64), 0.0, 1.0)
    u = nodal_displacements(load_case, rho) if displacements is None else displacements
    mag = np.hypot(u[..., 0], u[..., 1])
    umax = float(mag.max())
    if scale is None:
        scale = 0.1 * max(nely, nelx) / umax if 0.0 < umax < math.inf else 0.0
    xd, yd = deformed_nodes(u, scale)
    corners = ((0, 0), (0, 1), (1, 1), (1, 0))  # TL, TR, BR, BL
    polys = np.stack([np.stack([xd[dr:dr + nely, dc:dc + nelx], yd[dr:dr + nely, dc:dc + nelx]],
                               axis=-1) for dr, dc in corners], axis=2).reshape(-1, 4, 2)
    elem_mag = np.mean([mag[dr:dr + nely, dc:dc + nelx] for dr, dc in corners], axis=0)
    norm = Normalize(0.0, umax if umax > 0 else 1.0)
    colours = colormaps["viridis"](norm(elem_mag.reshape(-1)))
    solid = np.where(np.asarray(load_case.load_mask | load_case.support_mask), 1.0, rho)
    colours[:, 3] = 0.08 + 0.92 * solid.reshape(-1)

    fig, ax = _axes(ax, (4.6, 4.0))
    ax.imshow(solid, cmap="gray_r", vmin=0.0, vmax=1.0, alpha=0.2, interpolation="nearest")
    ax.add_collection(PolyCollection(polys, facecolors=colours, edgecolors=(0, 0, 0, 0.25),
                                     linewidths=0.3))
    for r, c in zip(*np.nonzero(np.asarray(load_case.support_mask)), strict=True):
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False,
                               edgecolor=SUPPORT_COLOUR, linewidth=1.5))
    load_rc = np.argwhere(np.asarray(load_case.load_mask))
    lo = np.array([min(-0.5, xd.min()), min(-0.5, yd.min())]) - 0.5
    hi = np.array([max(nelx - 0.5, xd.max()), max(nely - 0.5, yd.max())]) + 0.5
    if len(load_rc):
        start = load_rc.mean(axis=0)[::-1]  # (x, y) = (col, row)
        end = start + 0.25 * max(nely, nelx) * np.asarray(load_case.gravity, np.float64)[::-1]
        ax.annotate("", xy=tuple(end), xytext=tuple(start),
                    arrowprops={"arrowstyle": "-|>", "color": LOAD_COLOUR, "linewidth": 2.0})
        lo, hi = np.minimum(lo, end - 0.5), np.maximum(hi, end + 0.5)
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(hi[1], lo[1])  # rows grow downwards
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.colorbar(ScalarMappable(norm=norm, cmap="viridis"), ax=ax, shrink=0.8, label="|u|")
    ax.set_title(f"displacement (x{scale:.3g}), max |u| = {_fmt(umax)}", fontsize=9)
    return fig


def plot_leaderboard(rows, metric="topology_score", ax=None):
    """Horizontal bar chart of models' mean ``metric``, best at the top.

    Rows are dicts with ``"model"`` and ``metric`` keys; rows without a finite
    value are left out, and a ValueError is raised if none is left.
    """
    items = []
    for row in rows:
        value = row.get(metric) if isinstance(row, dict) else None
        if "model" in (row or {}) and isinstance(value, (int, float)) and math.isfinite(value):
            items.append((str(row["model"]), float(value)))
    if not items:
        raise ValueError(f"no leaderboard row has a finite {metric!r} value")
    items.sort(key=lambda item: item[1])  # barh draws bottom-up: best last
    fig, ax = _axes(ax, (6.0, 0.8 + 0.4 * len(items)))
    values = [v for _, v in items]
    bars = ax.barh(range(len(items)), values, color="#4c72b0")
    ax.set_yticks(range(len(items)), [m for m, _ in items], fontsize=8)
    ax.bar_label(bars, labels=[f"{v:.3f}" for v in values], padding=3, fontsize=8)
    ax.set_xlim(min(0.0, min(values)), max(1.0, max(values)) * 1.15)
    ax.set_xlabel(metric)
    ax.set_title(f"leaderboard: mean {metric}", fontsize=10)
    return fig


def plot_validation(report: dict, ax=None):
    """Grouped bar chart of a metric-validation report, one group per probe.

    ``report`` is ``{"subject", "samples", "rows": [{"probe", <metric>: mean...}],
    "beaten"}``; bars show the :data:`PROBE_METRICS` present in the rows.
    """
    rows = report["rows"]
    keys = [k for k in PROBE_METRICS if any(k in row for row in rows)]
    if not rows or not keys:
        raise ValueError("validation report has no probe rows with metric values")
    fig, ax = _axes(ax, (max(6.0, 1.4 * len(rows)), 4.0))
    width = 0.8 / len(keys)
    x = np.arange(len(rows))
    for k, key in enumerate(keys):
        values = [row.get(key) for row in rows]
        values = [float(v) if isinstance(v, (int, float)) else np.nan for v in values]
        ax.bar(x + (k - (len(keys) - 1) / 2) * width, values, width, label=key)
    ax.set_xticks(x, [str(row.get("probe", i)) for i, row in enumerate(rows)],
                  rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("mean value")
    ax.legend(fontsize=7, ncols=2)
    ax.set_title(f"{report.get('subject', '?')}: {report.get('samples', '?')} samples, "
                 f"beaten {report.get('beaten', '?')}", fontsize=10)
    return fig


def save_figure(fig, path) -> pathlib.Path:
    """Write a figure as PNG atomically (temporary sibling, fsync, rename).

    Parent directories are created; readers never see a partial file.  A
    replaced file keeps its permission bits.  Returns the path written.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _results_figure(path: pathlib.Path, records: list, index: int, cache):
    from sphyr_jax.topopt.optimum import OptimumCache

    if not 0 <= index < len(records):
        raise UserInputError(f"{path}: record index {index} is out of range (it holds "
                             f"{len(records)} records: 0 to {len(records) - 1})")
    record = records[index]
    prompt = record.get("prompt")
    input_grid = extract_grid(prompt) if prompt else record.get("input_grid")
    gravity = record_gravity(record, path.resolve().parent.name)
    case = load_case_from_grid(record["ground_truth"], input_grid, gravity)
    if cache is None or isinstance(cache, (str, os.PathLike)):
        cache = OptimumCache(cache)
    # Seeded with the dataset answer, as the metrics do, so their cache entries are shared.
    optimum = cache.get(case, seed=np.asarray(case.pinned))
    completion = extract_grid(record["completion"])
    rho = None
    if completion and [len(r) for r in completion] == [case.shape[1]] * case.shape[0]:
        rho = densities_from_grid(completion)[0]  # L/S are made solid by _solution
    designs = [rho, np.asarray(case.pinned), np.asarray(optimum.densities)]
    u, c = _solution(case, np.stack([designs[1] if rho is None else rho] + designs[1:]))
    computed = [None if rho is None else float(c[0]), float(c[1]), float(c[2])]
    shown = {k: record[k] for k in PROBE_METRICS if k in record}
    for key, value in zip(_PANEL_KEYS, computed, strict=True):
        shown[key] = record.get(key, value) if value is None else value
    fig = _new_figure((13.0, 3.8))
    axes = fig.subplots(1, 4)
    _draw_comparison(axes[:3], record["completion"], record["ground_truth"],
                     designs[2], ("completion", "dataset answer", "optimum"), shown)
    if rho is None:
        axes[3].text(0.5, 0.5, "completion has no grid\nof the right shape",
                     ha="center", va="center", transform=axes[3].transAxes)
        axes[3].set_axis_off()
    else:
        plot_displacement(case, rho, ax=axes[3], displacements=u[0])
    fig.suptitle(f"{path.parent.name}/{path.name} #{index}\n{_summary(shown)}", fontsize=9)
    return fig


def _is_training_board(data) -> bool:
    """A trainer's ``leaderboard.json``: rows per source, subject and direction, one dict
    of means per entry (``model``, ``empty``, ``solid``, stored models)."""
    return (isinstance(data, dict) and isinstance(data.get("entries"), list)
            and isinstance(data.get("rows"), list) and bool(data["rows"])
            and all(isinstance(r, dict) and {"source", "subject", "direction"} <= r.keys()
                    for r in data["rows"]))


def render_file(path, output, index=0, cache=None) -> pathlib.Path:
    """Render a results, validation or leaderboard JSON file to a PNG.

    The kind is detected from the content:

    * a results file ``<model>/<subject>_results.json`` (list of records with
      ``completion`` and ``ground_truth``): record ``index`` as completion /
      dataset answer / reference optimum, plus the completion's displacement
      field; gravity from the record's ``gravity_dir`` or the folder name;
    * a validation report ``{"subject", "samples", "rows": [{"probe", ...}]}``:
      :func:`plot_validation`;
    * a leaderboard ``{"rows": [{"model", ...}]}`` (``rescore --output_json``):
      :func:`plot_leaderboard`;
    * a trainer's ``leaderboard.json`` (``python -m sphyr_jax train``):
      heat maps of every entry, subject by direction, of its first source
      (:func:`sphyr_jax.training.leaderboard.plot_leaderboard`).

    Args:
        path: the JSON file.
        output: PNG to write (parent directories are created).
        index: record of a results file.
        cache: an :class:`~sphyr_jax.topopt.optimum.OptimumCache`, a cache directory,
            or None (a fresh in-memory cache with the default options).

    Returns:
        The output path (a ``pathlib.Path``).

    Raises:
        UserInputError: unreadable JSON, a file of no known kind, an index out
            of range, or a record without usable boundary conditions (all
            ``ValueError`` s).
    """
    path = pathlib.Path(path)
    data = read_json(path)  # CorruptFileError is a UserInputError
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data) and all(
            {"completion", "ground_truth"} <= r.keys() for r in data):
        fig = _results_figure(path, data, int(index), cache)
    elif _is_training_board(data):
        from sphyr_jax.training.leaderboard import plot_leaderboard as plot_training_board

        output = pathlib.Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        return plot_training_board(data, output)
    elif isinstance(data, dict) and isinstance(data.get("rows"), list) and data["rows"] and all(
            isinstance(r, dict) for r in data["rows"]):
        rows = data["rows"]
        if all("probe" in r for r in rows):
            fig = plot_validation(data)
        elif all("model" in r for r in rows):
            fig = plot_leaderboard(rows)
        else:
            raise UserInputError(
                f"{path}: rows are neither validation probes nor leaderboard models")
    elif isinstance(data, dict) and isinstance(data.get("experiments"), list):
        raise UserInputError(
            f"{path} is a report's report.json, which plot does not draw: the report command "
            "draws its bar charts itself (figures/ beside it; --nofigures turns them off)")
    else:
        raise UserInputError(
            f"{path}: not a results file (list of records with 'completion' and "
            "'ground_truth'), a validation report, a rescore leaderboard ({'rows': [...]}) "
            "or a trainer's leaderboard.json"
        )
    return save_figure(fig, output)
