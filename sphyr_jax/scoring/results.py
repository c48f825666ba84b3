"""Rescoring stored benchmark results: ``<root>/<model>/<subject>_results.json``.

Every record's completion, prompt (holding the masked input grid) and ground
truth are read from its text; the structural metrics are added to the record
and every other field is left as it was.  The neighbouring
``<subject>_aggregated_results.json`` gets ``total_<metric>`` (sums over the
records) and ``evaluated_samples``.  All records of all files are scored
together (in bounded chunks), so the reference optimum of a sample is computed
once however many models completed it.

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
import pathlib
import time
from collections import defaultdict

from sphyr_jax.io import CorruptFileError, atomic_write_json, read_json
from sphyr_jax.problem.grids import InvalidProblemError
from sphyr_jax.problem.loadcase import gravity_from_folder, record_gravity
from sphyr_jax.scoring.metrics import STRUCTURAL_METRIC_KEYS, ScoreItem, score_batch
from sphyr_jax.sharding import device_count
from sphyr_jax.topopt.optimum import OptimumCache, optimum_name, optimum_options

RESULTS_SUFFIX = "_results.json"
AGGREGATED_SUFFIX = "_aggregated_results.json"
DEFAULT_CHUNK = 4096  # records scored per batch (bounds memory)
UNUSABLE_GRAVITY = (float("nan"), float("nan"))  # a malformed gravity_dir: the record is invalid
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
    corrupt: list = dataclasses.field(default_factory=list)  # (path, reason)
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
                f"corrupt={len(self.corrupt)} devices={self.devices}")


def find_result_files(results_root) -> list[ResultFile]:
    """Every ``<model>/<subject>_results.json`` under the root, sorted."""
    root = pathlib.Path(results_root)
    if not root.is_dir():
        raise FileNotFoundError(f"results root not found: {root}")
    found = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if model_dir.name == "plots":
            continue
        gravity = gravity_from_folder(model_dir.name)
        for path in sorted(model_dir.glob("*" + RESULTS_SUFFIX)):
            if path.name.endswith(AGGREGATED_SUFFIX):
                continue
            subject = path.name[: -len(RESULTS_SUFFIX)]
            found.append(ResultFile(path, model_dir.name, subject, gravity))
    return found


def _read_records(path: pathlib.Path) -> list[dict]:
    records = read_json(path)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise CorruptFileError("expected a JSON list of records (objects)", path)
    return records


def _item(record: dict, folder: str) -> ScoreItem:
    prompt = record.get("prompt")
    input_grid = prompt if prompt is not None else record.get("input_grid")
    try:  # the record's own gravity_dir, else its folder's rotation, else down
        gravity = record_gravity(record, folder, ndim=None)
    except InvalidProblemError:
        gravity = UNUSABLE_GRAVITY
    return ScoreItem(record.get("completion"), record.get("ground_truth"), input_grid, gravity)


def _means(records: list[dict], keys) -> dict:
    n = max(len(records), 1)
    return {key: sum(float(r.get(key) or 0.0) for r in records) / n for key in keys}


def aggregate(records: list[dict], existing: dict | None = None,
              optimum: str | None = None) -> dict:
    """``total_<metric>`` sums and ``evaluated_samples``, merged into ``existing``;
    ``optimum`` (when given) names the yardstick behind the figures."""
    out = dict(existing or {})
    for key in STRUCTURAL_METRIC_KEYS:
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
    except CorruptFileError:
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
    optimum: str | None = None,
) -> RescoreSummary:
    """Add the structural metrics to every stored results file under a root.

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
    if cache is None:
        cache = OptimumCache(optimum=optimum or "reference", num_devices=num_devices)
    elif optimum is not None and optimum_name(optimum_options(optimum)) != cache.optimum:
        raise ValueError(f"optimum={optimum!r} but the cache holds {cache.optimum!r} optima")
    hits0, computed0 = cache.hits, cache.computed
    summary = RescoreSummary(devices=device_count(num_devices), optimum=cache.optimum)
    loaded: list[tuple[ResultFile, list[dict]]] = []
    for rf in find_result_files(results_root):
        try:
            loaded.append((rf, _read_records(rf.path)))
        except CorruptFileError as exc:
            summary.corrupt.append((str(rf.path), str(exc)))
            if log is not None:
                log(f"skipped (left untouched): {exc}")
    for rf, _ in loaded:
        previous = previous_optimum(rf)
        if previous is not None and previous != cache.optimum:
            summary.switched.append((str(rf.path), previous))
            if log is not None:
                log(f"{rf.path}: its figures came from the {previous!r} yardstick; "
                    f"rescoring with {cache.optimum!r}")
    flat = [(k, rec) for k, (rf, recs) in enumerate(loaded) for rec in recs]
    items = [_item(rec, loaded[k][0].model) for k, rec in flat]
    for lo in range(0, len(items), max(1, chunk)):
        scored = score_batch(items[lo: lo + chunk], cache, design_efficiency, num_devices,
                             progress)
        for (_, rec), metrics in zip(flat[lo: lo + chunk], scored, strict=True):
            rec.update(metrics.as_dict())
            summary.invalid_records += not metrics.physically_valid
        if progress is not None:
            progress("records", min(lo + chunk, len(items)), len(items))

    for rf, records in loaded:
        summary.files += 1
        summary.records += len(records)
        summary.per_file.append({"model": rf.model, "subject": rf.subject,
                                 "records": len(records),
                                 **_means(records, LEADERBOARD_KEYS)})
        if dry_run:
            continue
        existing = None
        agg_path = rf.aggregated_path
        if agg_path.exists():
            try:
                existing = read_json(agg_path)
                if not isinstance(existing, dict):
                    raise CorruptFileError("expected a JSON object", agg_path)
            except CorruptFileError as exc:
                summary.corrupt.append((str(agg_path), str(exc)))
                if log is not None:
                    log(f"aggregates not updated (file left untouched): {exc}")
                existing = False
        # Fields we did not compute are written back as read (NaN included).
        atomic_write_json(rf.path, records, indent=2, allow_nan=True)
        summary.written.append(str(rf.path))
        if existing is not False:
            atomic_write_json(agg_path, aggregate(records, existing, cache.optimum), indent=2)
            summary.written.append(str(agg_path))
    summary.leaderboard = leaderboard(summary.per_file)
    summary.optimisations = cache.computed - computed0
    summary.cache_hits = cache.hits - hits0
    summary.seconds = time.perf_counter() - start
    return summary
