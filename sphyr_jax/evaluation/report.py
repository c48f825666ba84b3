"""The paper's tables from any results tree: one leaderboard per experiment and metric.

A results tree is ``<root>/<folder>/<subject>_results.json`` (records) with
``<subject>_aggregated_results.json`` (``total_<metric>`` sums) beside it.  A
folder is a model run, named ``<model><suffix>``: no suffix for the main
experiment, ``_<N>_rotations``, ``_few_shot_<K>`` and ``_<style>_prompt``
(``physics_enhanced``, ``physics_neutral``, ...) for the others, in that order
when combined (:func:`split_folder`).  Every experiment gets a leaderboard per
metric of :data:`sphyr_jax.scoring.results.AGGREGATE_KEYS`: subjects as rows
(easy ones, then hard ones, then any others), models as columns, then an easy
average, a hard average and an overall row.

A cell is the mean per record of a metric for one model and subject: the
aggregated file's ``total_<metric>`` over its ``evaluated_samples`` (or over the
records of the results file), else the mean of the records' own field (an older
tree without the total).  A subject a model lacks is *missing* (``—`` in
Markdown, ``--`` in LaTeX), never zero; an average over fewer subjects than its
group has is marked ``*`` and takes no part in choosing the best.  In each row
the best value is bold (the highest, the lowest for cluster counts, the
closest to 1 for the volume ratio; ties are all bold); the difficulty score
describes the samples, not the models, and has no best.  Ratios and shares
are shown in percent.

:func:`write_report` writes ``<experiment>.md`` and ``<experiment>.tex`` (a
standalone document with one ``booktabs`` table per metric), ``report.json``
(every cell, ``null`` where missing) and, with ``figures=True``, a bar chart per
metric and difficulty as PNG and PDF (:mod:`sphyr_jax.evaluation.figures`).
Files are written atomically; unreadable input files are reported and skipped,
never changed.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from collections.abc import Callable, Sequence

from sphyr_jax.data.datasets import DIFFICULTIES, VARIANTS, is_hard
from sphyr_jax.errors import UserInputError
from sphyr_jax.io import CorruptFileError, atomic_write_json, atomic_write_text, read_json
from sphyr_jax.scoring.results import AGGREGATE_KEYS, AGGREGATED_SUFFIX, RESULTS_SUFFIX

MAIN = "main"
MISSING_MD = "—"
MISSING_TEX = "--"
PARTIAL_MARK = "*"


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """How a metric is shown.

    Attributes:
        key: the record field (``total_<key>`` in aggregated files).
        label: a heading.
        better: ``"higher"``, ``"lower"``, ``"one"`` (closest to 1) or None
            (no best).
        percent: shown as a percentage (ratios and shares of records).
    """

    key: str
    label: str
    better: str | None = "higher"
    percent: bool = True


_SPECS = {
    "valid_output_grid": MetricSpec("valid_output_grid", "Valid output grid"),
    "exact_match": MetricSpec("exact_match", "Exact match"),
    "difference_ratio": MetricSpec("difference_ratio", "Difference ratio"),
    "relative_difference_ratio": MetricSpec("relative_difference_ratio",
                                            "Relative difference ratio"),
    "penalized_difference_ratio": MetricSpec("penalized_difference_ratio",
                                             "Penalized difference ratio"),
    "load_support_connected": MetricSpec("load_support_connected",
                                         "Load-support connectivity"),
    "load_support_connected_force_directional": MetricSpec(
        "load_support_connected_force_directional", "Load-support directional connectivity"),
    "isolated_clusters_count": MetricSpec("isolated_clusters_count",
                                          "Isolated clusters per record", "lower", False),
    "force_path_cost_average_efficiency_ratio": MetricSpec(
        "force_path_cost_average_efficiency_ratio", "Force path cost efficiency ratio"),
    "difficulty_score": MetricSpec("difficulty_score", "Difficulty score", None, False),
    "difficulty_weighted_difference_ratio": MetricSpec(
        "difficulty_weighted_difference_ratio", "Difficulty-weighted difference ratio",
        "higher", False),
    "difficulty_weighted_relative_difference_ratio": MetricSpec(
        "difficulty_weighted_relative_difference_ratio",
        "Difficulty-weighted relative difference ratio", "higher", False),
    "topology_score": MetricSpec("topology_score", "Topology score"),
    "structural_efficiency": MetricSpec("structural_efficiency", "Structural efficiency"),
    "material_efficiency": MetricSpec("material_efficiency", "Material efficiency"),
    "compliance_efficiency_vs_ground_truth": MetricSpec(
        "compliance_efficiency_vs_ground_truth", "Compliance efficiency vs ground truth"),
    "load_carrying": MetricSpec("load_carrying", "Load carrying"),
    "volume_ratio": MetricSpec("volume_ratio", "Volume ratio", "one", False),
}
METRICS = tuple(_SPECS[key] for key in AGGREGATE_KEYS)
"""How each reported metric is shown, in :data:`AGGREGATE_KEYS` order."""


def metric_spec(key: str) -> MetricSpec:
    """The :class:`MetricSpec` of a reported metric."""
    try:
        return _SPECS[key]
    except KeyError:
        raise UserInputError(
            f"unknown metric {key!r}; reported metrics: {', '.join(AGGREGATE_KEYS)}") from None


# ----------------------------------------------------------------------------
# Folders and subjects.

_ROTATIONS = re.compile(r"_(\d+)_rotations$")
_FEW_SHOT = re.compile(r"_few_shot_(\d+)$")
_STYLES = ("physics_enhanced", "physics_neutral", "load_direction", "custom")
_STYLE = re.compile(r"_([a-z]+)_prompt$")


def split_folder(name: str) -> tuple[str, str]:
    """(model, experiment) of a results folder name.

    ``gpt-4o`` -> (``gpt-4o``, ``main``); ``gpt-4o_3_rotations`` ->
    (``gpt-4o``, ``3_rotations``); ``m_few_shot_1`` -> (``m``, ``few_shot_1``);
    ``m_physics_enhanced_prompt`` -> (``m``, ``physics_enhanced_prompt``);
    combined suffixes (``m_3_rotations_few_shot_1``) name a combined experiment.
    """
    rest = name
    parts: list[str] = []
    for style in _STYLES:
        if rest.endswith(f"_{style}_prompt"):
            parts.append(f"{style}_prompt")
            rest = rest[: -len(f"_{style}_prompt")]
            break
    else:
        found = _STYLE.search(rest)
        if found and found.start() > 0:
            parts.append(f"{found.group(1)}_prompt")
            rest = rest[: found.start()]
    for pattern, label in ((_FEW_SHOT, "few_shot_{}"), (_ROTATIONS, "{}_rotations")):
        found = pattern.search(rest)
        if found and found.start() > 0:
            parts.append(label.format(found.group(1)))
            rest = rest[: found.start()]
    return rest, "_".join(reversed(parts)) if parts else MAIN


def _experiment_order(name: str) -> tuple:
    if name == MAIN:
        return (0, 0, name)
    rotations = re.match(r"(\d+)_rotations$", name)
    if rotations:
        return (1, int(rotations.group(1)), name)
    few = re.match(r"few_shot_(\d+)$", name)
    if few:
        return (2, int(few.group(1)), name)
    return (3, 0, name)


def difficulty_of(subject: str) -> str:
    """``easy``, ``hard`` or ``other`` (a name without the suffix)."""
    try:
        return "hard" if is_hard(subject) else "easy"
    except UserInputError:
        return "other"


def _subject_order(subject: str) -> tuple:
    level = difficulty_of(subject)
    group = DIFFICULTIES.index(level) if level in DIFFICULTIES else len(DIFFICULTIES)
    base = subject[:-3] if subject.endswith("_3d") else subject
    variant = base.rsplit("_", 1)[0] if level != "other" else base
    rank = VARIANTS.index(variant) if variant in VARIANTS else len(VARIANTS)
    return (group, subject.endswith("_3d"), rank, subject)


# ----------------------------------------------------------------------------
# Reading a tree.


@dataclasses.dataclass
class Leaderboard:
    """The cells of one experiment.

    Attributes:
        experiment: ``main``, ``3_rotations``, ``few_shot_1``, ...
        models: model names (columns), sorted.
        folders: model -> results folder name.
        subjects: subject rows, easy ones first (see :func:`difficulty_of`).
        values: metric -> subject -> model -> mean per record (None: missing).
        records: subject -> model -> number of records (None: unknown).
    """

    experiment: str
    models: list[str]
    folders: dict[str, str]
    subjects: list[str]
    values: dict[str, dict[str, dict[str, float | None]]]
    records: dict[str, dict[str, int | None]]

    def groups(self) -> list[tuple[str, list[str]]]:
        """The average rows: (label, the subjects they average)."""
        easy = [s for s in self.subjects if difficulty_of(s) == "easy"]
        hard = [s for s in self.subjects if difficulty_of(s) == "hard"]
        return [("easy average", easy), ("hard average", hard), ("overall", self.subjects)]

    def average(self, metric: str, model: str, subjects: Sequence[str]):
        """(mean over the model's present subjects or None, whether some are missing)."""
        present = [self.values[metric][s][model] for s in subjects]
        present = [v for v in present if v is not None]
        if not present:
            return None, bool(subjects)
        return sum(present) / len(present), len(present) < len(subjects)


def _read(path: pathlib.Path, log) -> object:
    try:
        return read_json(path)
    except CorruptFileError as exc:
        if log is not None:
            log(f"skipped (left untouched): {exc}")
        return None


def _cell(aggregated, records, metric: str) -> float | None:
    count = aggregated.get("evaluated_samples") if isinstance(aggregated, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        count = len(records) if isinstance(records, list) and records else None
    total = aggregated.get(f"total_{metric}") if isinstance(aggregated, dict) else None
    if isinstance(total, (int, float)) and not isinstance(total, bool) and count:
        value = float(total) / count
        return value if math.isfinite(value) else None
    if isinstance(records, list) and records and any(
            isinstance(r, dict) and metric in r for r in records):
        values = [r.get(metric) if isinstance(r, dict) else None for r in records]
        return sum(float(v) for v in values if isinstance(v, (int, float))) / len(records)
    return None


def collect(results_root, metrics: Sequence[str] | None = None,
            log: Callable[[str], None] | None = None) -> list[Leaderboard]:
    """The leaderboards of a results tree, main experiment first.

    Args:
        results_root: folder of ``<folder>/<subject>_results.json`` (and/or
            ``_aggregated_results.json``) files.
        metrics: the metrics to collect (default: all of :data:`METRICS`).
        log: optional callable(str) told about unreadable files.

    Returns:
        One :class:`Leaderboard` per experiment found.

    Raises:
        UserInputError: the root is not a folder, holds no results, or a
            metric is unknown.
    """
    root = pathlib.Path(results_root)
    if not root.is_dir():
        raise UserInputError(f"results root not found: {root}")
    keys = [metric_spec(m).key for m in (metrics or AGGREGATE_KEYS)]
    by_experiment: dict[str, dict[str, pathlib.Path]] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "plots"):
        model, experiment = split_folder(folder.name)
        by_experiment.setdefault(experiment, {})[model] = folder
    boards = []
    for experiment in sorted(by_experiment, key=_experiment_order):
        folders = by_experiment[experiment]
        cells: dict[str, dict[str, tuple]] = {}  # subject -> model -> (aggregated, records)
        for model, folder in folders.items():
            names = {p.name[: -len(AGGREGATED_SUFFIX)]
                     for p in folder.glob("*" + AGGREGATED_SUFFIX)}
            names |= {p.name[: -len(RESULTS_SUFFIX)] for p in folder.glob("*" + RESULTS_SUFFIX)
                      if not p.name.endswith(AGGREGATED_SUFFIX)}
            for subject in names:
                agg_path = folder / f"{subject}{AGGREGATED_SUFFIX}"
                res_path = folder / f"{subject}{RESULTS_SUFFIX}"
                aggregated = _read(agg_path, log) if agg_path.exists() else None
                records = _read(res_path, log) if res_path.exists() else None
                if aggregated is not None or records is not None:
                    cells.setdefault(subject, {})[model] = (aggregated, records)
        if not cells:
            continue
        models = sorted(m for m in folders if any(m in c for c in cells.values()))
        subjects = sorted(cells, key=_subject_order)
        values = {key: {s: {m: (_cell(*cells[s][m], key) if m in cells[s] else None)
                            for m in models} for s in subjects} for key in keys}
        counts = {s: {m: _count(*cells[s][m]) if m in cells[s] else None for m in models}
                  for s in subjects}
        boards.append(Leaderboard(experiment, models,
                                  {m: folders[m].name for m in models}, subjects, values, counts))
    if not boards:
        raise UserInputError(f"no results files under {root}")
    return boards


def _count(aggregated, records) -> int | None:
    if isinstance(records, list):
        return len(records)
    count = aggregated.get("evaluated_samples") if isinstance(aggregated, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


# ----------------------------------------------------------------------------
# Tables.


@dataclasses.dataclass
class _Cell:
    value: float | None
    bold: bool = False
    partial: bool = False


def _best(cells: list[_Cell], better: str | None) -> None:
    """Mark the best complete values of a row bold (all of them on a tie)."""
    scored = [c for c in cells if c.value is not None and not c.partial]
    if better is None or not scored:
        return
    key = {"higher": lambda v: -v, "lower": lambda v: v, "one": lambda v: abs(v - 1.0)}[better]
    best = min(key(c.value) for c in scored)
    for c in scored:
        c.bold = math.isclose(key(c.value), best, rel_tol=1e-12, abs_tol=1e-12)


def table_rows(board: Leaderboard, metric: str) -> list[tuple[str, list[_Cell], bool]]:
    """(label, cells per model, whether it is an average row) for one metric."""
    spec = metric_spec(metric)
    rows = []
    for subject in board.subjects:
        cells = [_Cell(board.values[spec.key][subject][m]) for m in board.models]
        _best(cells, spec.better)
        rows.append((subject, cells, False))
    for label, subjects in board.groups():
        if not subjects:
            continue
        cells = []
        for model in board.models:
            value, partial = board.average(spec.key, model, subjects)
            cells.append(_Cell(value, partial=partial and value is not None))
        _best(cells, spec.better)
        rows.append((label, cells, True))
    return rows


def _number(spec: MetricSpec, value: float) -> str:
    return f"{100.0 * value:.1f}" if spec.percent else f"{value:.3f}"


def _heading(spec: MetricSpec) -> str:
    unit = " (%)" if spec.percent else ""
    best = {"higher": "higher is better", "lower": "lower is better",
            "one": "closest to 1 is best", None: "no best"}[spec.better]
    return f"{spec.label}{unit}: {best}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(board: Leaderboard, metric: str) -> str:
    """One metric's leaderboard as a Markdown table (with a heading line)."""
    spec = metric_spec(metric)
    lines = [f"### {_heading(spec)}", "",
             "| subject | " + " | ".join(_md_escape(m) for m in board.models) + " |",
             "|---|" + "---:|" * len(board.models)]
    for label, cells, _ in table_rows(board, metric):
        texts = []
        for c in cells:
            if c.value is None:
                texts.append(MISSING_MD)
                continue
            text = _number(spec, c.value) + (PARTIAL_MARK if c.partial else "")
            texts.append(f"**{text}**" if c.bold else text)
        lines.append(f"| {_md_escape(label)} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def markdown_report(board: Leaderboard, metrics: Sequence[str] | None = None) -> str:
    """Every metric's table of one experiment as one Markdown document."""
    keys = [metric_spec(m).key for m in (metrics or list(board.values))]
    head = [f"# Leaderboard: {board.experiment}", "",
            f"Models (columns): {', '.join(board.models)}.  Cells: mean per record"
            f" over each subject's records; {MISSING_MD} = missing; {PARTIAL_MARK} = average"
            " over fewer subjects (not ranked); bold = best in the row.", ""]
    return "\n".join(head + [markdown_table(board, k) + "\n" for k in keys])


_TEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                "^": r"\textasciicircum{}"}


def tex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex_table(board: Leaderboard, metric: str) -> str:
    """One metric's leaderboard as a ``table`` environment (needs ``booktabs``)."""
    spec = metric_spec(metric)
    label = re.sub(r"[^a-z0-9]+", "-", f"{board.experiment}-{spec.key}".lower())
    lines = [r"\begin{table}[ht]", r"\centering", r"\small",
             rf"\caption{{{tex_escape(_heading(spec))} ({tex_escape(board.experiment)}); "
             rf"best in bold, {MISSING_TEX} missing, {PARTIAL_MARK} fewer subjects.}}",
             rf"\label{{tab:{label}}}",
             r"\begin{tabular}{l" + "r" * len(board.models) + "}", r"\toprule",
             "Subject & " + " & ".join(tex_escape(m) for m in board.models) + r" \\",
             r"\midrule"]
    first_average = True
    for row_label, cells, average in table_rows(board, metric):
        if average and first_average:
            lines.append(r"\midrule")
            first_average = False
        texts = []
        for c in cells:
            if c.value is None:
                texts.append(MISSING_TEX)
                continue
            text = _number(spec, c.value) + (PARTIAL_MARK if c.partial else "")
            texts.append(rf"\textbf{{{text}}}" if c.bold else text)
        lines.append(tex_escape(row_label.capitalize() if average else row_label)
                     + " & " + " & ".join(texts) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


def latex_document(board: Leaderboard, metrics: Sequence[str] | None = None) -> str:
    """A standalone LaTeX document holding every metric's table of one experiment."""
    keys = [metric_spec(m).key for m in (metrics or list(board.values))]
    body = "\n\n".join(latex_table(board, k) for k in keys)
    return "\n".join([r"\documentclass{article}", r"\usepackage[margin=2cm]{geometry}",
                      r"\usepackage{booktabs}", r"\begin{document}", "", body, "",
                      r"\end{document}", ""])


def report_json(boards: Sequence[Leaderboard]) -> dict:
    """Every cell of every leaderboard, JSON-ready (None for missing)."""
    return {"experiments": [
        {"experiment": b.experiment, "models": b.models, "folders": b.folders,
         "subjects": b.subjects, "records": b.records, "values": b.values}
        for b in boards]}


@dataclasses.dataclass
class ReportSummary:
    """What :func:`write_report` wrote."""

    experiments: list[str]
    files: list[str]
    missing: list[tuple[str, str, str]]  # (experiment, model, subject)
    unscored: list[str] = dataclasses.field(default_factory=list)  # metrics no record holds

    def line(self) -> str:
        return (f"report: {len(self.experiments)} experiments "
                f"({', '.join(self.experiments)}), {len(self.files)} files, "
                f"{len(self.missing)} missing model/subject cells")


def write_report(results_root, output_dir, *, metrics: Sequence[str] | None = None,
                 figures: bool = True, formats: Sequence[str] = ("png", "pdf"),
                 log: Callable[[str], None] | None = None) -> ReportSummary:
    """Write the tables (and figures) of a results tree.

    Args:
        results_root: the results tree.
        output_dir: where to write (created if needed).
        metrics: the metrics to report (default: all of :data:`METRICS`).
        figures: also draw a bar chart per metric and difficulty (needs
            matplotlib).
        formats: figure formats.
        log: optional callable(str) told about unreadable files.

    A metric that no record of an experiment holds (the static metrics of a
    published tree before ``rescore``) gets no table there rather than a table
    of dashes; those held by no record at all are listed in the summary's
    ``unscored``.

    Returns:
        A :class:`ReportSummary`.

    Raises:
        UserInputError: nothing to report, no record holding any reported
            metric (the message names ``rescore``), or an unknown metric.
    """
    boards = collect(results_root, metrics, log)
    held = {b.experiment: [k for k, per in b.values.items()
                           if any(v is not None for row in per.values() for v in row.values())]
            for b in boards}
    unscored = [k for k in boards[0].values if not any(k in keys for keys in held.values())]
    if not any(held.values()):
        raise UserInputError(
            f"{results_root}: no record holds the metrics a report tabulates (a tree before "
            f"scoring?); add them with: python -m sphyr_jax rescore --results_root={results_root}")
    boards = [dataclasses.replace(b, values={k: b.values[k] for k in held[b.experiment]})
              for b in boards if held[b.experiment]]
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    missing = []
    for board in boards:
        for kind, text in (("md", markdown_report(board)), ("tex", latex_document(board))):
            path = out / f"{board.experiment}.{kind}"
            atomic_write_text(path, text)
            files.append(str(path))
        first = next(iter(board.values.values()))
        missing += [(board.experiment, m, s) for s in board.subjects for m in board.models
                    if first[s][m] is None and board.records[s][m] is None]
        if figures:
            from sphyr_jax.evaluation.figures import save_figure, subject_bars

            for key in board.values:
                for level in ("easy", "hard", "other"):
                    subjects = [s for s in board.subjects if difficulty_of(s) == level]
                    if not subjects:
                        continue
                    fig = subject_bars(board, metric_spec(key), subjects, f"{level} subjects")
                    for fmt in formats:
                        path = out / "figures" / board.experiment / f"{key}_{level}.{fmt}"
                        save_figure(fig, path)
                        files.append(str(path))
    path = out / "report.json"
    atomic_write_json(path, report_json(boards), indent=1)
    files.append(str(path))
    return ReportSummary([b.experiment for b in boards], files, missing, unscored)
