"""Rescoring stored benchmark results: ``<root>/<model>/<subject>_results.json``.

Every record's completion, prompt (holding the masked input grid) and ground
truth are read from its text; every published metric is added to the record
(the structural ones and the twelve static ones, :data:`RECORD_METRIC_KEYS`)
and every other field is left as it was.  The neighbouring
``<subject>_aggregated_results.json`` gets ``total_<metric>`` (sums over the
records) for every key of :data:`AGGREGATE_KEYS` and ``evaluated_samples``;
other fields of an existing aggregated file (an older tree's totals) are kept.
All records of all files are scored together (in bounded chunks), so the
reference optimum of a sample is computed once however many models completed
it.  Records are read and scored by :func:`sphyr_jax.scoring.records.score_records`
(the scoring step every layer shares; importable from here too), with the
direction a folder's name gives for records without ``gravity_dir``.

Nothing is lost: files are replaced atomically, a file that is not valid JSON
(or not a list of records) is reported by name and left byte-for-byte
untouched, and a hostile completion only makes its own record invalid.

Yardsticks are never mixed silently: the aggregated file records which one
produced the figures (``"optimum": "reference"`` or ``"strong"``), and
rescoring a file that an earlier run scored with the other yardstick says so
(in the summary's ``switched`` list and through ``log``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from collections import defaultdict

from sphyr_jax.io import CorruptFileError, atomic_write_files, read_json
from sphyr_jax.problem.loadcase import gravity_from_folder
from sphyr_jax.scoring.metrics import STRUCTURAL_METRIC_KEYS
from sphyr_jax.scoring.records import RECORD_METRIC_KEYS as RECORD_METRIC_KEYS
from sphyr_jax.scoring.records import score_records
from sphyr_jax.scoring.static import STATIC_METRIC_KEYS
from sphyr_jax.sharding import device_count
from sphyr_jax.topopt.optimum import OptimumCache, cache_for
from sphyr_jax.topopt.options import Yardstick

RESULTS_SUFFIX = "_results.json"
AGGREGATED_SUFFIX = "_aggregated_results.json"
DEFAULT_CHUNK = 4096  # records scored per batch (bounds memory)
AGGREGATE_KEYS = STATIC_METRIC_KEYS + STRUCTURAL_METRIC_KEYS
"""Metrics summed into ``total_<metric>`` of the aggregated files (and reported)."""
LEADERBOARD_KEYS = (
    "topology_score",
    "structural_efficiency",
    "material_efficiency",
    "compliance_efficiency_vs_ground_truth",
    "load_carrying",
)


@dataclasses.dataclass(frozen=True)
class ResultFile:
    """One stored results file."""

    path: pathlib.Path
    model: str
    subject: str
    gravity_dir: tuple

    @property
    def aggregated_path(self) -> pathlib.Path:
        return self.path.with_name(self.subject + AGGREGATED_SUFFIX)


@dataclasses.dataclass
class RescoreSummary:
    """What a rescore did."""

    files: int = 0
    records: int = 0
    invalid_records: int = 0
    written: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)  # (path, reason): left untouched
    invalid: list = dataclasses.field(default_factory=list)  # (path, record index, reason)
    leaderboard: list = dataclasses.field(default_factory=list)
    per_file: list = dataclasses.field(default_factory=list)
    optimisations: int = 0
    cache_hits: int = 0
    devices: int = 1
    seconds: float = 0.0
    optimum: str = "reference"
    switched: list = dataclasses.field(default_factory=list)  # (path, previous yardstick)

    def line(self) -> str:
        """The closing one-line summary."""
        return (f"rescored {self.records} records in {self.files} files in "
                f"{self.seconds:.1f} s: optimum={self.optimum} "
                f"switched={len(self.switched)} optimisations={self.optimisations} "
                f"cache_hits={self.cache_hits} invalid={self.invalid_records} "
                f"skipped={len(self.skipped)} devices={self.devices}")

    def report(self) -> str:
        """One line per skipped file and per record whose own fields are unusable."""
        lines = [f"skipped (left untouched): {path}: {reason}" for path, reason in self.skipped]
        lines += [f"invalid record: {path} [{index}]: {reason}"
                  for path, index, reason in self.invalid]
        return "\n".join(lines)


def find_result_files(results_root, skipped: list | None = None) -> list[ResultFile]:
    """Every ``<model>/<subject>_results.json`` under the root, sorted.

    Symbolic links are followed, but a folder or file reached twice (the same
    real path under two names) is listed once, under its first name, and a
    link that loops or points nowhere is never followed: such entries, and
    anything named ``*_results.json`` that is not a readable file, are added to
    ``skipped`` as ``(path, reason)`` instead.

    Raises:
        FileNotFoundError: the root is not a folder.
    """
    root = pathlib.Path(results_root)
    if not root.is_dir():
        raise FileNotFoundError(f"results root not found: {root}")
    skipped = [] if skipped is None else skipped
    found, seen_dirs, seen_files = [], set(), set()
    for model_dir in sorted(root.iterdir()):
        try:
            if not model_dir.is_dir() or model_dir.name == "plots":
                continue
            real_dir = model_dir.resolve(strict=True)
        except (OSError, RuntimeError) as exc:  # a loop or a dangling link
            skipped.append((str(model_dir), f"unreadable link: {exc}"))
            continue
        if real_dir in seen_dirs:
            skipped.append((str(model_dir), "same folder as another model folder (a link); "
                                             "scored once"))
            continue
        seen_dirs.add(real_dir)
        gravity = gravity_from_folder(model_dir.name)
        for path in sorted(model_dir.glob("*" + RESULTS_SUFFIX)):
            if path.name.endswith(AGGREGATED_SUFFIX):
                continue
            try:
                real = path.resolve(strict=True)
            except (OSError, RuntimeError) as exc:
                skipped.append((str(path), f"unreadable link: {exc}"))
                continue
            if not real.is_file():
                skipped.append((str(path), "not a regular file"))
                continue
            if real in seen_files:
                skipped.append((str(path), "same file as another results file (a link); "
                                           "scored once"))
                continue
            seen_files.add(real)
            subject = path.name[: -len(RESULTS_SUFFIX)]
            found.append(ResultFile(path, model_dir.name, subject, gravity))
    return found


def read_results(path) -> list[dict]:
    """The records of a results file (a JSON list of objects).

    Raises:
        FileNotFoundError: no such file.
        CorruptFileError: it cannot be read, is not valid JSON, or is not a
            list of records; the message starts with the path, and the file
            is left as it is.
    """
    try:
        records = read_json(path)
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise CorruptFileError(f"{path}: cannot be read ({exc.__class__.__name__})",
                               path) from exc
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise CorruptFileError(f"{path}: expected a JSON list of records (objects)", path)
    return records


def _writable(path: pathlib.Path) -> bool:
    """Whether a results file may be replaced: its target and folder are writable.

    A file without any write permission bit counts as read-only even for a
    superuser, whom ``os.access`` would let through.
    """
    target = path.resolve()
    mode = target.stat().st_mode
    return (bool(mode & 0o222) and os.access(target, os.W_OK)
            and os.access(target.parent, os.W_OK))


_RECORD_FIELD_REASONS = ("gravity_dir", "ground truth", "too large")


def _means(records: list[dict], keys) -> dict:
    n = max(len(records), 1)
    return {key: sum(float(r.get(key) or 0.0) for r in records) / n for key in keys}


def aggregate(records: list[dict], existing: dict | None = None, *,
              optimum: Yardstick | None = None) -> dict:
    """``total_<metric>`` sums and ``evaluated_samples``, merged into ``existing``;
    ``optimum`` (when given) names the yardstick behind the figures."""
    out = dict(existing or {})
    for key in AGGREGATE_KEYS:
        out[f"total_{key}"] = sum(float(r.get(key) or 0.0) for r in records)
    out["evaluated_samples"] = len(records)
    if optimum is not None:
        out["optimum"] = optimum
    return out


def leaderboard(per_file: list[dict]) -> list[dict]:
    """Per model: mean over its subjects of the per-file means, best first."""
    by_model: dict[str, list[dict]] = defaultdict(list)
    for row in per_file:
        by_model[row["model"]].append(row)
    rows = []
    for model, files in by_model.items():
        row = {"model": model, "subjects": len(files),
               "records": sum(f["records"] for f in files)}
        for key in LEADERBOARD_KEYS:
            row[key] = sum(f[key] for f in files) / len(files)
        rows.append(row)
    rows.sort(key=lambda r: (-r["topology_score"], r["model"]))
    return rows


def format_leaderboard(rows: list[dict]) -> str:
    """The leaderboard as a text table."""
    width = max([len("model")] + [len(r["model"]) for r in rows])
    header = (f"{'model':{width}s} {'topo':>6s} {'struct':>7s} {'material':>9s} "
              f"{'vs GT':>7s} {'carrying':>9s}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['model']:{width}s} {r['topology_score']:6.3f} "
            f"{r['structural_efficiency']:7.3f} {r['material_efficiency']:9.3f} "
            f"{r['compliance_efficiency_vs_ground_truth']:7.3f} {r['load_carrying']:9.3f}")
    return "\n".join(lines)


def previous_optimum(rf: ResultFile) -> str | None:
    """The yardstick named in a file's aggregated results (None: none recorded)."""
    try:
        existing = read_json(rf.aggregated_path) if rf.aggregated_path.exists() else None
    except (CorruptFileError, OSError):
        return None
    value = existing.get("optimum") if isinstance(existing, dict) else None
    return value if isinstance(value, str) else None


def rescore_tree(
    results_root,
    *,
    dry_run: bool = False,
    design_efficiency: bool = False,
    cache: OptimumCache | None = None,
    num_devices: int | None = None,
    progress=None,
    chunk: int = DEFAULT_CHUNK,
    log=None,
    optimum: Yardstick | None = None,
) -> RescoreSummary:
    """Add every published metric (static and structural) to every results file under a root.

    Args:
        results_root: folder of ``<model>/<subject>_results.json`` files.
        dry_run: compute everything, write nothing.
        design_efficiency: also optimise at each completion's own budget.
        cache: optimum cache (give it a directory to persist optima).
        num_devices: devices batches are split over (None: all local).
        progress: optional callable(stage, done, total).
        chunk: records scored per batch.
        log: optional callable(str) for warnings (corrupt files, a change of
            yardstick).
        optimum: ``"reference"`` (the published optimum, default) or
            ``"strong"`` (stricter); None: the cache's, else ``"reference"``.

    Returns:
        A :class:`RescoreSummary`.

    Raises:
        ValueError: ``optimum`` is unknown or differs from the cache's.
    """
    start = time.perf_counter()
    cache = cache_for(cache, optimum, num_devices)
    hits0, computed0 = cache.hits, cache.computed
    summary = RescoreSummary(devices=device_count(num_devices), optimum=cache.yardstick)

    def skip(path, reason):
        summary.skipped.append((str(path), reason))
        if log is not None:
            log(f"skipped (left untouched): {path}: {reason}")

    loaded = _load_tree(results_root, skip)
    _note_switched(loaded, cache.yardstick, summary, log)
    _score_tree(loaded, cache, summary, design_efficiency=design_efficiency,
                num_devices=num_devices, progress=progress, chunk=chunk, log=log)
    for rf, records in loaded:
        row = {"model": rf.model, "subject": rf.subject, "records": len(records),
               **_means(records, LEADERBOARD_KEYS)}
        if not dry_run:
            written = _write_pair(rf, records, cache.yardstick, skip)
            if not written:
                continue
            summary.written.extend(written)
        summary.files += 1
        summary.records += len(records)
        summary.per_file.append(row)
    summary.leaderboard = leaderboard(summary.per_file)
    summary.optimisations = cache.computed - computed0
    summary.cache_hits = cache.hits - hits0
    summary.seconds = time.perf_counter() - start
    return summary


def _load_tree(results_root, skip) -> list[tuple[ResultFile, list[dict]]]:
    """Every readable results file under the root with its records; ``skip(path,
    reason)`` for the rest (links seen twice, unreadable or corrupt files)."""
    found = find_result_files(results_root, skipped := [])
    for path, reason in skipped:
        skip(path, reason)
    loaded = []
    for rf in found:
        try:
            loaded.append((rf, read_results(rf.path)))
        except CorruptFileError as exc:
            skip(rf.path, str(exc).replace(f"{rf.path}: ", ""))
    return loaded


def _note_switched(loaded, yardstick: str, summary: RescoreSummary, log) -> None:
    """Files whose figures came from another yardstick, listed in ``summary.switched``."""
    for rf, _ in loaded:
        previous = previous_optimum(rf)
        if previous is not None and previous != yardstick:
            summary.switched.append((str(rf.path), previous))
            if log is not None:
                log(f"{rf.path}: its figures came from the {previous!r} yardstick; "
                    f"rescoring with {yardstick!r}")


def _in_folder(record, rf: ResultFile):
    """The record as scored: a record without ``gravity_dir`` takes its folder's direction."""
    if isinstance(record, dict) and record.get("gravity_dir") is None:
        return {**record, "gravity_dir": rf.gravity_dir}
    return record


def _score_tree(loaded, cache: OptimumCache, summary: RescoreSummary, *,
                design_efficiency: bool, num_devices, progress, chunk: int, log) -> None:
    """Score every record of every file (``chunk`` at a time, files mixed) in place;
    invalid records are counted, and those whose own fields are unusable listed."""
    flat = [(rf, i, rec) for rf, recs in loaded for i, rec in enumerate(recs)]
    step = max(1, chunk)
    if progress is not None and flat:
        progress("records", 0, len(flat))
    for lo in range(0, len(flat), step):
        part = flat[lo: lo + step]
        fields = score_records([_in_folder(rec, rf) for rf, _, rec in part], cache=cache,
                               design_efficiency=design_efficiency, num_devices=num_devices,
                               progress=progress)
        for (rf, i, rec), metrics in zip(part, fields, strict=True):
            rec.update(metrics)
            summary.invalid_records += not metrics["physically_valid"]
            reason = metrics.get("invalid_reason") or ""
            if reason.startswith(_RECORD_FIELD_REASONS):
                summary.invalid.append((str(rf.path), i, reason))
                if log is not None:
                    log(f"invalid record: {rf.path} [{i}]: {reason}")
        if progress is not None:
            progress("records", min(lo + step, len(flat)), len(flat))


def _write_pair(rf: ResultFile, records: list[dict], optimum: str, skip) -> list[str]:
    """Write a results file and its aggregates together, or neither.

    Both go through symbolic links to their targets and are replaced in one
    all-or-nothing step, so the aggregates always describe the records on
    disk.  An existing aggregates file that cannot be read is reported and
    left untouched (only the results file is written).  Returns the paths
    written; when the results file cannot be written, calls ``skip(path,
    reason)`` and returns [] with both files as they were.
    """
    target = rf.path.resolve()
    agg_link = rf.aggregated_path
    try:
        agg_target = agg_link.resolve(strict=False)
        if not _writable(rf.path):
            skip(rf.path, "read-only; not rewritten")
            return []
        existing, problem = None, None
        if agg_link.exists() or agg_link.is_symlink():
            try:
                existing = read_json(agg_link)
                if not isinstance(existing, dict):
                    problem = "aggregates are not a JSON object"
            except (CorruptFileError, OSError) as exc:
                problem = f"aggregates unreadable ({exc.__class__.__name__})"
        if problem is not None:  # never overwrite a file we could not read
            skip(agg_link, f"{problem}; not updated (the results file was)")
        # Fields we did not compute are written back as read (NaN included).
        texts = {
            target: json.dumps(records, indent=2, allow_nan=True, ensure_ascii=False) + "\n"}
        if problem is None:
            texts[agg_target] = json.dumps(aggregate(records, existing, optimum=optimum), indent=2,
                                           ensure_ascii=False) + "\n"
        atomic_write_files(texts)
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        skip(rf.path, f"not written ({exc.__class__.__name__}: {exc}); left as it was")
        return []
    return [str(rf.path)] + ([str(agg_link)] if problem is None else [])
