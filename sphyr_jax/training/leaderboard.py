"""One model scored on every subject and load direction of a dataset: the leaderboard.

A *group* is the records of one subject in one load direction from one source
(a dataset folder, or the records of a stored results tree with the stored
model completions beside them).  :func:`build_leaderboard` completes every group's
inputs with the model, adds the empty and solid baselines (every ``V`` cell
``0`` / ``1``) and any stored completions, and scores all of it in one batched
:func:`~sphyr_jax.scoring.records.score_records` call (so every sample's
reference optimum is computed once, and an ``OptimumCache`` with a directory
makes re-scoring cheap).  :func:`leaderboard_markdown` and
:func:`plot_leaderboard` render the result.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Callable, Sequence

import numpy as np

from sphyr_jax.problem.grids import extract_grid
from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY_3D, gravity_from_folder, normalise_gravity
from sphyr_jax.problem.symmetry import AXIS_DIRECTIONS, ROTATION_TAGS, turn_records
from sphyr_jax.progress import Progress
from sphyr_jax.scoring.records import score_records
from sphyr_jax.training.config import DIRECTION_NAMES
from sphyr_jax.training.evaluation import complete_records, fill_masked

BASELINES = ("empty", "solid")
METRICS = ("topology_score", "load_carrying")
_RESULTS_SUFFIX = "_results.json"


def direction_name(gravity_dir) -> str:
    """``"down"``/``"right"``/``"up"``/``"left"`` for an axis direction, else ``"(r, c)"``.

    A voxel direction (layer, row, col) is ``"down"`` for (1, 0, 0), else its steps.
    """
    if np.size(gravity_dir) == 3:
        g = normalise_gravity(gravity_dir, ndim=3)
        return "down" if np.allclose(g, DEFAULT_GRAVITY_3D, atol=1e-12) else (
            "(" + ", ".join(f"{v:.3g}" for v in g) + ")")
    g = normalise_gravity(gravity_dir)
    for name, d in zip(DIRECTION_NAMES, AXIS_DIRECTIONS, strict=True):
        if np.allclose(g, d, atol=1e-12):
            return name
    return f"({g[0]:.3g}, {g[1]:.3g})"


def _strip_rotation_tag(name: str) -> str:
    for tag in ROTATION_TAGS.values():
        name = name.replace(f"_{tag}", "").replace(tag, "")
    return name or "dataset"


@dataclasses.dataclass
class EvalGroup:
    """The records of one subject in one load direction from one source.

    Attributes:
        source: label of the data (a dataset folder name without its rotation
            tag, or ``results:<model>``).
        subject: SPhyR subject name (its format decides the completions').
        direction: load direction name (see :func:`direction_name`).
        records: ``{"input_grid", "ground_truth", "gravity_dir"}`` records.
        others: stored completions to score beside the model, ``{name: [one
            completion per record]}``.
    """

    source: str
    subject: str
    direction: str
    records: list
    others: dict = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.source, self.subject, self.direction


def _with_gravity(records: Sequence[dict], folder_name: str) -> list[dict]:
    default = list(gravity_from_folder(folder_name))
    return [{**r, "gravity_dir": list(r.get("gravity_dir") or default)} for r in records]


def _split_by_direction(source, subject, records, others=None) -> list[EvalGroup]:
    by_dir: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_dir.setdefault(direction_name(r["gravity_dir"]), []).append(i)
    return [EvalGroup(source, subject, d, [records[i] for i in idx],
                      {n: [c[i] for i in idx] for n, c in (others or {}).items()})
            for d, idx in by_dir.items()]


def add_turned_groups(groups: Sequence[EvalGroup], turns: Sequence[int] = (1, 2, 3)
                      ) -> list[EvalGroup]:
    """The groups plus copies of their records turned by each quarter-turn count.

    A copy whose (source, subject, direction) already exists is skipped (data
    stored on disk wins).  Stored completions are not carried over (they
    answer the original orientation only).
    """
    out = list(groups)
    seen = {g.key for g in out}
    for g in groups:
        for k in turns:
            turned = turn_records(g.records, k)
            for new in _split_by_direction(g.source, g.subject, turned):
                if new.key not in seen:
                    seen.add(new.key)
                    out.append(new)
    return out


def load_dataset_groups(sources: Sequence, subjects: Sequence[str] | None = None,
                        limit: int | None = None) -> list[EvalGroup]:
    """Groups of dataset folders or subject files.

    A folder contributes every subject it holds (of ``subjects``, default all
    16 and their 16 voxel ``_3d`` twins); a ``<subject>.jsonl``/``.json`` file
    its subject.  The load direction
    is a record's ``gravity_dir`` or else the folder name's rotation tag
    (``..._3_rotations`` -> right, see :func:`sphyr_jax.problem.loadcase.gravity_from_folder`);
    folders differing only by that tag share a source label.

    Args:
        sources: folders or files.
        subjects: subjects to load (None: all available).
        limit: first N records of each subject.
    """
    from sphyr_jax.data.datasets import DatasetError, list_subjects, load_subject

    groups = []
    for src in sources:
        path = pathlib.Path(src)
        if path.is_file():
            names, folder = [path.stem], path.parent
        else:
            names, folder = list(subjects or list_subjects(2) + list_subjects(3)), path
        label = _strip_rotation_tag(folder.name)
        for subject in names:
            if subjects and subject not in subjects:
                continue
            try:
                records = load_subject(str(path), subject, limit=limit)
            except DatasetError:
                continue
            groups.extend(_split_by_direction(label, subject, _with_gravity(records, folder.name)))
    return groups


def load_results_groups(results_root, subjects: Sequence[str] | None = None,
                        limit: int | None = None) -> list[EvalGroup]:
    """Groups made of the records of a stored results tree, with the stored completions.

    Every ``<model>/<subject>_results.json`` gives the records (input grid read
    back from the ``prompt``, ``ground_truth``, direction from the record or
    the folder name) and the model's completions as ``others[<model>]``;
    folders that differ only by their rotation tag are one source.  Unreadable
    records are skipped.
    """
    from sphyr_jax.data.datasets import list_subjects

    groups = []
    wanted = set(subjects or list_subjects())
    for path in sorted(pathlib.Path(results_root).glob(f"*/*{_RESULTS_SUFFIX}")):
        subject = path.name[: -len(_RESULTS_SUFFIX)]
        if subject not in wanted:
            continue
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        model = path.parent.name
        records, completions = [], []
        for rec in stored[:limit] if limit else stored:
            grid = extract_grid(rec.get("prompt")) if isinstance(rec, dict) else None
            if grid is None or rec.get("ground_truth") is None:
                continue
            records.append({"input_grid": grid, "ground_truth": rec["ground_truth"],
                            "gravity_dir": rec.get("gravity_dir")})
            completions.append(rec.get("completion") or "")
        label = f"results:{_strip_rotation_tag(model)}"
        groups.extend(_split_by_direction(label, subject, _with_gravity(records, model),
                                          {_strip_rotation_tag(model): completions}))
    return groups


def build_leaderboard(model, groups: Sequence[EvalGroup], cache=None,
                      num_devices: int | None = None, *,
                      log: Callable[[str], None] | None = None,
                      progress: Progress | None = None) -> dict:
    """Score a model, the baselines and stored completions on every group, in one batched call.

    Args:
        model: a :class:`~sphyr_jax.training.model.DensityNet`.
        groups: see :func:`load_dataset_groups`, :func:`load_results_groups`,
            :func:`add_turned_groups`.
        cache: :class:`~sphyr_jax.topopt.optimum.OptimumCache` (one per yardstick).
        num_devices: devices scoring is split over (None: all local).
        log: optional callable receiving a line before the scoring starts.
        progress: optional ``(stage, done, total)`` callback of the scoring
            (:mod:`sphyr_jax.progress`).

    Returns:
        ``{"rows": [{"source", "subject", "direction", "samples",
        "<entry>": {"topology_score", "load_carrying"} for the entries
        "model", "empty", "solid" and every stored model}], "entries": [...]}``
        plus ``"completions"``: the model's token grids per group.
    """
    from sphyr_jax.data.datasets import is_hard

    say = log or (lambda line: None)
    records, completions, owners = [], [], []
    model_completions = []
    for gi, g in enumerate(groups):
        done = complete_records(model, g.records, hard=is_hard(g.subject))
        model_completions.append(done)
        empty, solid = ("0.0", "1.0") if is_hard(g.subject) else ("0", "1")
        entries = {"model": done,
                   "empty": [fill_masked(r["input_grid"], empty) for r in g.records],
                   "solid": [fill_masked(r["input_grid"], solid) for r in g.records],
                   **g.others}
        for name, comps in entries.items():
            records.extend(g.records)
            completions.extend(comps)
            owners.extend((gi, name) for _ in comps)
    say(f"scoring {len(completions)} completions of {sum(len(g.records) for g in groups)} "
        f"records in {len(groups)} groups")
    per = score_records([{**r, "completion": c} for r, c in zip(records, completions, strict=True)],
                        cache=cache, num_devices=num_devices, progress=progress)
    sums: dict[tuple[int, str], list] = {}
    for (gi, name), m in zip(owners, per, strict=True):
        sums.setdefault((gi, name), []).append([float(m[k]) for k in METRICS])
    entries = ["model", *BASELINES]
    for g in groups:
        entries.extend(n for n in g.others if n not in entries)
    rows = []
    for gi, g in enumerate(groups):
        row = {"source": g.source, "subject": g.subject, "direction": g.direction,
               "samples": len(g.records)}
        for name in entries:
            if (gi, name) in sums:
                means = np.mean(np.asarray(sums[(gi, name)]), axis=0)
                row[name] = {k: float(v) for k, v in zip(METRICS, means, strict=True)}
        rows.append(row)
    return {"rows": rows, "entries": entries, "completions": model_completions}


def _order(rows):
    from sphyr_jax.data.datasets import list_subjects

    subj = {s: i for i, s in enumerate(list_subjects())}
    dirs = {d: i for i, d in enumerate(DIRECTION_NAMES)}
    return sorted(rows, key=lambda r: (r["source"], subj.get(r["subject"], 99), r["subject"],
                                       dirs.get(r["direction"], 9), r["direction"]))


def summary(board: dict) -> dict:
    """Means over groups per source and entry, and where the model does not beat an entry.

    Returns:
        ``{source: {"mean": {entry: {metric: mean over its groups}},
        "model_not_above": {entry: [(subject, direction, model score, entry
        score), ...]}}}``: groups where the model's mean topology score is not
        strictly above the entry's.
    """
    out = {}
    for row in board["rows"]:
        src = out.setdefault(row["source"], {"mean": {}, "model_not_above": {}, "_n": {}})
        for name in board["entries"]:
            if name not in row:
                continue
            acc = src["mean"].setdefault(name, {k: 0.0 for k in METRICS})
            src["_n"][name] = src["_n"].get(name, 0) + 1
            for k in METRICS:
                acc[k] += row[name][k]
            if name != "model" and "model" in row:
                ms, es = row["model"]["topology_score"], row[name]["topology_score"]
                if not ms > es:
                    src["model_not_above"].setdefault(name, []).append(
                        (row["subject"], row["direction"], ms, es))
    for src in out.values():
        for name, acc in src["mean"].items():
            for k in METRICS:
                acc[k] /= src["_n"][name]
        del src["_n"]
    return out


def _cell(entry: dict | None) -> str:
    if entry is None:
        return ""
    return f"{entry['topology_score']:.3f} ({100 * entry['load_carrying']:.0f}%)"


def leaderboard_markdown(board: dict) -> str:
    """Markdown tables per source and entry: subject x direction, "score (load carrying)"."""
    lines = []
    rows = _order(board["rows"])
    for source in dict.fromkeys(r["source"] for r in rows):
        srows = [r for r in rows if r["source"] == source]
        dirs = [d for d in DIRECTION_NAMES if any(r["direction"] == d for r in srows)]
        dirs += sorted({r["direction"] for r in srows} - set(dirs))
        for name in board["entries"]:
            if not any(name in r for r in srows):
                continue
            lines += [f"### {source}: {name}", "",
                      "| subject | " + " | ".join(dirs) + " |",
                      "|---|" + "---|" * len(dirs)]
            for subject in dict.fromkeys(r["subject"] for r in srows):
                cells = {r["direction"]: r.get(name) for r in srows if r["subject"] == subject}
                lines.append(f"| {subject} | " + " | ".join(_cell(cells.get(d)) for d in dirs)
                             + " |")
            lines.append("")
    lines.append("Cells: mean topology score (share of load-carrying completions).")
    return "\n".join(lines) + "\n"


def plot_leaderboard(board: dict, path, source: str | None = None):
    """Heat maps (subject x direction) of the mean topology score of every entry; saves ``path``.

    Needs matplotlib.  ``source`` picks one source (default: the first).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _order(board["rows"])
    source = source or rows[0]["source"]
    rows = [r for r in rows if r["source"] == source]
    subjects = list(dict.fromkeys(r["subject"] for r in rows))
    dirs = [d for d in DIRECTION_NAMES if any(r["direction"] == d for r in rows)]
    names = [n for n in board["entries"] if any(n in r for r in rows)]
    fig, axes = plt.subplots(1, len(names), figsize=(2.2 + 1.6 * len(names) * max(len(dirs), 1) / 2,
                                                     0.38 * len(subjects) + 1.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        grid = np.full((len(subjects), len(dirs)), np.nan)
        carry = np.full_like(grid, np.nan)
        for r in rows:
            if name in r and r["direction"] in dirs:
                i, j = subjects.index(r["subject"]), dirs.index(r["direction"])
                grid[i, j] = r[name]["topology_score"]
                carry[i, j] = r[name]["load_carrying"]
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if math.isfinite(v):
                ax.text(j, i, f"{v:.2f}\n{100 * carry[i, j]:.0f}%", ha="center", va="center",
                        fontsize=6, color="white" if v < 0.6 else "black")
        ax.set_xticks(range(len(dirs)), dirs, fontsize=7)
        ax.set_yticks(range(len(subjects)), subjects if ax is axes[0][0] else [], fontsize=7)
        ax.set_title(name, fontsize=9)
    fig.suptitle(f"{source}: topology score (load carrying)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return pathlib.Path(path)


def write_leaderboard(board: dict, directory, plot: bool = True) -> dict:
    """Write ``leaderboard.json`` (rows, entries, summary), ``leaderboard.md`` and, with
    matplotlib, ``leaderboard_<source>.png`` per source; returns ``{kind: path}``."""
    from sphyr_jax.io import atomic_write_json, atomic_write_text

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {"json": directory / "leaderboard.json", "markdown": directory / "leaderboard.md"}
    atomic_write_json(out["json"], {"rows": _order(board["rows"]), "entries": board["entries"],
                                    "summary": summary(board)})
    atomic_write_text(out["markdown"], leaderboard_markdown(board))
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return out
        for source in dict.fromkeys(r["source"] for r in board["rows"]):
            safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in source)
            out[f"plot:{source}"] = plot_leaderboard(board, directory / f"leaderboard_{safe}.png",
                                                     source)
    return out
