"""Bar charts of report leaderboards: one figure per metric and difficulty.

matplotlib is imported lazily; figures are :class:`matplotlib.figure.Figure`
objects on the Agg canvas, never made through ``pyplot``, so no global figure
state is created.  Bars are grouped by subject, one bar per model; a subject a
model lacks gets no bar and an "n/a" mark at the axis, never a bar of height 0.
"""

from __future__ import annotations

import io
import pathlib
from collections.abc import Sequence

import numpy as np

from sphyr_jax.io import atomic_write_bytes

_FORMATS = ("png", "pdf", "svg")


def _figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def subject_bars(board, spec, subjects: Sequence[str], title: str | None = None):
    """Grouped bars of one metric of a :class:`~sphyr_jax.evaluation.report.Leaderboard`.

    Args:
        board: the leaderboard (``models``, ``experiment`` and
            ``values[metric][subject][model]``, None where missing).
        spec: the metric's :class:`~sphyr_jax.evaluation.report.MetricSpec`
            (its key, label, and whether it is shown in percent).
        subjects: the subjects on the x axis (e.g. the easy ones).
        title: the figure title's suffix.

    Returns:
        The Figure.
    """
    scale = 100.0 if spec.percent else 1.0
    models = board.models
    fig = _figure((max(7.0, 0.9 * len(subjects) * max(1, len(models)) ** 0.5 + 4.0), 4.2))
    ax = fig.add_subplot()
    x = np.arange(len(subjects), dtype=float)
    width = 0.8 / max(1, len(models))
    drawn = False
    for k, model in enumerate(models):
        offset = x + (k - (len(models) - 1) / 2) * width
        values = [board.values[spec.key][s][model] for s in subjects]
        heights = [np.nan if v is None else scale * v for v in values]
        drawn |= any(v is not None for v in values)
        ax.bar(offset, heights, width, label=model)
        for xo, v in zip(offset, values, strict=True):
            if v is None:
                ax.text(xo, 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=6,
                        color="0.4", transform=ax.get_xaxis_transform())
    ax.set_xlim(-0.6, len(subjects) - 0.4)  # missing bars leave NaN data limits
    if not drawn:  # nothing to scale the axis to
        ax.set_ylim(0.0, scale)
    ax.set_xticks(x, subjects, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(spec.label + (" (%)" if spec.percent else ""))
    ax.axhline(0.0, color="0.3", linewidth=0.6)
    ax.grid(True, axis="y", linestyle="--", alpha=0.5)
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    if len(models) > 1:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{spec.label}: {board.experiment}" + (f", {title}" if title else ""),
                 fontsize=10)
    return fig


def save_figure(fig, path) -> pathlib.Path:
    """Write a figure atomically in the format its suffix names (png, pdf, svg).

    Parent folders are created; readers never see a partial file.
    """
    path = pathlib.Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in _FORMATS:
        raise ValueError(f"unknown figure format {path.suffix!r}; use one of {_FORMATS}")
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=150)
    atomic_write_bytes(path, buffer.getvalue())
    return path
