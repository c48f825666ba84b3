"""Training corpora: SPhyR-v2 problems at any scale, the same bytes on any engine.

A corpus is a v2 generation (:mod:`~sphyr_jax.data.generate_v2`'s problems,
answers and masks) meant for training, held apart from the benchmark, whose
records each carry their own optimum.  :func:`build_corpus` writes one; the
same :class:`CorpusSpec` gives the same bytes whether the tasks ran in this
process or on a Ray cluster of any size, in any order
(:mod:`~sphyr_jax.data.engines`).

**Candidates.**  Candidate *i* is drawn by :class:`~sphyr_jax.data.generate_v2.V2Rules`
from its own generator, ``numpy.random.default_rng([seed, i])``, so it does
not depend on any other candidate.  Candidates are taken in index order:

1. *screened* on the driver: a failed draw (``supports``), no budget left
   (``budget``), a layout too close to an excluded (benchmark) sample's
   (``excluded_layout``: closer than the exclusion index's distance, the v2
   sets' 6 cells), or within ``min_layout`` cells of an accepted sample or of a
   candidate admitted before it in the last ``window`` solve batches
   (``layout``) is refused; the others are *admitted*, ``batch_size`` to a
   solve batch (batch *k* is admitted only once every batch before *k* -
   ``window`` + 1 is judged, so what a batch holds is fixed by the spec);
2. *solved* in batches, one task per batch (:func:`solve_task`; batches may
   be solved ahead, in parallel, in any order);
3. *judged* in index order: a degenerate optimum (``degenerate``), an easy
   answer too close to an excluded sample's (``excluded_structure``: the v2
   sets' 8 cells) or within ``min_structure`` cells of an accepted sample's
   (``structure``) is refused, the others accepted until ``num_samples`` are.

The v2 distances (layouts 6 cells apart) leave room for only so many samples
on a grid: about a thousand layouts on 10x10 and several thousand on 20x20
(``benchmarks/corpus.py --capacity``); a larger corpus lowers ``min_layout``
and ``min_structure`` between its own samples, never the distance to the
benchmark.

A candidate refused because of an admitted rival stays refused if the rival
is dropped later (as in the v2 sets).  The layout and structure checks compare
packed bitsets (:class:`~sphyr_jax.data.exclusion.SampleIndex`), so they stay
a small part of the run at 100,000 samples.

**Records.**  Sample *k* (the *k*-th accepted candidate, *i*) gives a record
in each of the 16 subjects: its masks come from
``subject_rng(seed, subject, i)``, one stream per subject and candidate, and
every record carries ``optimum``: the reference yardstick's optimum of that
record's own masked problem, keyed by :func:`~sphyr_jax.topopt.optimum.optimum_key`
(the problem, the answer it is seeded with, and the yardstick with its
version), so a scorer uses it only while the key is the record's.  Optima are
computed ``optima_samples`` samples (16 records each) per task
(:func:`optima_task`).

**Files.**  ``format="parquet"`` writes the Hugging Face layout:
``<subject>/train-00000-of-000NN.parquet`` (``file_samples`` samples a file)
and a dataset card ``README.md`` whose ``configs`` name one configuration per
subject, so ``datasets.load_dataset(folder, name=subject)`` (streaming or
not) reads it; records are streamed to the files, so memory does not grow
with ``num_samples``.  ``format="jsonl"`` writes the 16 ``<subject>.jsonl``
files of the v2 sets (the records held until the end: for small sets).
``corpus.json`` records the spec and the finished files; every solve and
optima result is kept under ``.corpus-work/`` until the corpus is complete, so
a killed run started again skips the finished files and redoes no task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import pathlib
import shutil
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from sphyr_jax.data.convert import render_subject
from sphyr_jax.data.datasets import list_subjects, subject_rng
from sphyr_jax.data.engines import Engine, LocalEngine
from sphyr_jax.data.exclusion import (
    LAYOUT,
    MIN_LAYOUT_DISTANCE,
    MIN_STRUCTURE_DISTANCE,
    STRUCTURE,
    BenchmarkIndex,
    SampleIndex,
    layout_bits,
    layout_hamming,
    load_exclusion_index,
    pack_cells,
)
from sphyr_jax.data.generate_v2 import (
    DEFAULT_V2_OPTIONS,
    MIN_GRID_SIZE,
    V2Candidate,
    V2Options,
    V2Rules,
    hard_tokens,
    optimise_v2,
    v2_mask,
)
from sphyr_jax.data.generation import (
    GenerationError,
    check_num_samples,
    design_tokens,
    device_name,
)
from sphyr_jax.fem import fea
from sphyr_jax.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from sphyr_jax.problem.grids import MASK
from sphyr_jax.problem.loadcase import (
    record_gravity,
)
from sphyr_jax.scoring.records import optimum_fields
from sphyr_jax.topopt.optimum import OptimumCache
from sphyr_jax.topopt.options import yardstick_options

Format = Literal["parquet", "jsonl"]
FORMATS = ("parquet", "jsonl")
PARQUET_ABOVE = 1000
"""``num_samples`` above which the default format is parquet."""
MANIFEST = "corpus.json"
WORK = ".corpus-work"
CORPUS_VERSION = 1
REASONS = ("supports", "budget", LAYOUT, "layout", "degenerate", STRUCTURE, "structure")
"""Why candidates are refused, in the summary's order."""
_ADMITTED, _ACCEPTED, _UNUSED = 100, 101, 102  # codes beside the reasons' positions
_CHUNK = 256  # candidates drawn and screened together
_FILE_CELLS = 500_000  # cells per subject file (samples x cells per grid), about 5 MB
_ROW_GROUP_CELLS = 25_600  # cells per parquet row group


class CorpusError(GenerationError):
    """A corpus that cannot be made or resumed."""


class OptimumMismatchError(CorpusError):
    """A stored optimum that differs from its recomputation (:func:`verify_optima`)."""


def default_format(num_samples: int) -> Format:
    """``"parquet"`` above :data:`PARQUET_ABOVE` samples, else ``"jsonl"``."""
    return "parquet" if num_samples > PARQUET_ABOVE else "jsonl"


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """Everything a corpus's bytes depend on (with the excluded samples).

    Attributes:
        num_samples: samples to accept.
        grid_size: n of the n x n grid.
        seed: the candidates' and masks' seed.
        options: the v2 optimiser's settings.
        yardstick: the yardstick of the stored optima (``"reference"``).
        format: ``"parquet"`` or ``"jsonl"`` (default: by ``num_samples``,
            :func:`default_format`).
        batch_size: candidates admitted to one solve task.
        window: solve batches whose admitted candidates screen each other's
            layouts (also the most batches solved ahead of the judging).
        optima_samples: samples (16 records each) per optima task.
        file_samples: samples per parquet file (default: about 500,000 cells
            per subject file, a multiple of ``optima_samples``).
        min_layout: least layout distance between accepted samples.
        min_structure: least easy-answer distance between accepted samples.
        max_attempts: bound on candidates drawn (default ``1000 *
            num_samples + 100_000``; drawing and screening are cheap next to
            solving).
    """

    num_samples: int
    grid_size: int = 10
    seed: int = 0
    options: V2Options = DEFAULT_V2_OPTIONS
    yardstick: str = "reference"
    format: Format | None = None
    batch_size: int = 16
    window: int = 16
    optima_samples: int = 4
    file_samples: int | None = None
    min_layout: int = MIN_LAYOUT_DISTANCE
    min_structure: int = MIN_STRUCTURE_DISTANCE
    max_attempts: int | None = None

    def __post_init__(self):
        check_num_samples(self.num_samples)
        if (isinstance(self.grid_size, bool) or not isinstance(self.grid_size, int)
                or self.grid_size < MIN_GRID_SIZE):
            raise ValueError(f"grid_size must be an integer >= {MIN_GRID_SIZE}, "
                             f"got {self.grid_size!r}")
        if self.yardstick != "reference":
            raise ValueError("a corpus stores reference-yardstick optima; got yardstick="
                             f"{self.yardstick!r}")
        for name in ("batch_size", "window", "optima_samples"):
            _positive(name, getattr(self, name))
        if self.format is None:
            object.__setattr__(self, "format", default_format(self.num_samples))
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        if self.file_samples is None:
            per_file = max(1, _FILE_CELLS // self.grid_size ** 2 // self.optima_samples)
            object.__setattr__(self, "file_samples", per_file * self.optima_samples)
        _positive("file_samples", self.file_samples)
        if self.file_samples % self.optima_samples:
            raise ValueError(f"file_samples ({self.file_samples}) must be a multiple of "
                             f"optima_samples ({self.optima_samples})")
        if self.max_attempts is not None:
            _positive("max_attempts", self.max_attempts)

    @property
    def attempts(self) -> int:
        """The bound on drawn candidates."""
        return self.max_attempts or 1000 * self.num_samples + 100_000

    @property
    def samples_per_file(self) -> int:
        """Samples in each data file (jsonl: all of them in one)."""
        return self.file_samples if self.format == "parquet" else self.num_samples

    @property
    def file_count(self) -> int:
        return math.ceil(self.num_samples / self.samples_per_file)

    def rules(self) -> V2Rules:
        return V2Rules(grid_size=self.grid_size, options=self.options, num_devices=1)

    def key(self, exclusion: SampleIndex | None = None) -> dict:
        """What the bytes depend on, JSON-ready (the manifest's record of the corpus)."""
        spec = dataclasses.asdict(self)
        spec.pop("max_attempts")  # bounds the work, not what is written
        spec["options"] = json.loads(json.dumps(dataclasses.asdict(self.options)))
        spec["optimum"] = yardstick_options(self.yardstick).key()
        spec["excluded"] = exclusion_digest(exclusion)
        return {"corpus_version": CORPUS_VERSION, **spec}


def exclusion_digest(index: SampleIndex | None) -> str | None:
    """A digest of the samples and distances an index excludes (None: no index)."""
    if index is None:
        return None
    h = hashlib.sha256()
    h.update(json.dumps([index.shape, index.min_layout, index.min_structure]).encode())
    h.update(np.ascontiguousarray(index.layouts).tobytes())
    h.update(b"|")
    h.update(np.ascontiguousarray(index.structures).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------
# The shard functions (run by any engine).


def draw_candidate(spec: CorpusSpec, index: int) -> V2Candidate | str:
    """Candidate ``index`` of a corpus: drawn from ``default_rng([seed, index])``
    (or ``"supports"`` for a failed draw)."""
    return spec.rules().draw(np.random.default_rng([int(spec.seed), int(index)]))


def solve_task(spec: CorpusSpec, indices: Sequence[int]) -> dict:
    """The answers of one solve batch: candidates ``indices``, optimised together.

    Returns:
        NumPy arrays, one row per candidate: ``easy`` (K, n, n) uint8 0/1,
        ``hard`` (K, n, n) uint8 tenths, ``degenerate`` (K,) bool,
        ``easy_compliance``, ``hard_compliance``, ``optimum_compliance`` (K,).
    """
    candidates = [draw_candidate(spec, i) for i in indices]
    answers = optimise_v2(candidates, spec.options, num_devices=1)
    return {"indices": np.asarray(indices, np.int64),
            "easy": (answers.easy >= 0.5).astype(np.uint8),
            "hard": np.rint(np.asarray(answers.hard) * 10).astype(np.uint8),
            "degenerate": np.asarray(answers.degenerate(), bool),
            "easy_compliance": np.asarray(answers.easy_compliance, np.float64),
            "hard_compliance": np.asarray(answers.hard_compliance, np.float64),
            "optimum_compliance": np.asarray(answers.optimum_compliance, np.float64)}


def optima_task(yardstick: str, rows: Sequence[tuple]) -> list[dict | None]:
    """The ``optimum`` fields of records, one batch: each row is ``(ground_truth,
    input_grid, gravity_dir)``.

    The records are read and keyed exactly as scoring reads them
    (:func:`sphyr_jax.scoring.records.optimum_fields`), and optimised together
    on one device, so the fields are the same whatever engine ran the task.

    Returns:
        One field per row (:func:`~sphyr_jax.topopt.optimum.stored_optimum`:
        ``{"yardstick", "key", "compliance", "densities", "iterations",
        "converged"}``), None for a record that is not a problem.
    """
    records = [{"ground_truth": g, "input_grid": i, "gravity_dir": d} for g, i, d in rows]
    cache = OptimumCache(yardstick=yardstick, num_devices=1, max_batch=max(1, len(rows)))
    return optimum_fields(records, cache=cache)


def sample_records(spec: CorpusSpec, sample: int, candidate_index: int,
                   candidate: V2Candidate, easy, hard_tenths) -> dict[str, dict]:
    """The 16 records of one accepted sample (without their optima), by subject.

    Masks are drawn from ``subject_rng(seed, subject, candidate_index)``.
    """
    truths = {"easy": design_tokens(candidate, easy),
              "hard": hard_tokens(candidate, np.asarray(hard_tenths, np.float64) / 10.0)}
    free = ~(candidate.load_mask | candidate.support_mask)
    records = {}
    for name in list_subjects():
        variant, _, level = name.rpartition("_")
        mask = v2_mask(variant, free, subject_rng(spec.seed, name, candidate_index))
        answer = truths[level]
        records[name] = {"index": int(sample),
                         "input_grid": np.where(mask, MASK, np.asarray(answer, object)).tolist(),
                         "ground_truth": answer,
                         "gravity_dir": list(candidate.gravity_dir)}
    return records


# ----------------------------------------------------------------------------
# Files.


def _parquet_schema():
    import pyarrow as pa

    grid = pa.list_(pa.list_(pa.string()))
    optimum = pa.struct([("yardstick", pa.string()), ("key", pa.string()),
                         ("compliance", pa.float64()),
                         ("densities", pa.list_(pa.list_(pa.float64()))),
                         ("iterations", pa.int64()), ("converged", pa.bool_())])
    return pa.schema([("index", pa.int64()), ("input_grid", grid), ("ground_truth", grid),
                      ("gravity_dir", pa.list_(pa.int64())), ("optimum", optimum)])


def data_file(spec: CorpusSpec, subject: str, file: int) -> str:
    """The path of one data file, relative to the corpus folder."""
    if spec.format == "jsonl":
        return f"{subject}.jsonl"
    return f"{subject}/train-{file:05d}-of-{spec.file_count:05d}.parquet"


def dataset_card(spec: CorpusSpec, summary: dict, exclusion: SampleIndex | None = None) -> str:
    """The corpus's ``README.md``: ``configs`` front matter (one per subject) and its making."""
    lines = ["---", "configs:"]
    for name in list_subjects():
        path = f"{name}/train-*.parquet" if spec.format == "parquet" else f"{name}.jsonl"
        lines += [f"- config_name: {name}", "  data_files:", "  - split: train",
                  f"    path: {path}"]
    lines += ["---", "", "# SPhyR-v2 training corpus", "",
              f"{spec.num_samples} samples on a {spec.grid_size}x{spec.grid_size} grid, "
              f"seed {spec.seed}, in each of the 16 SPhyR subjects (one configuration per "
              "subject, one `train` split).  Made with `sphyr_jax` "
              "(`python -m sphyr_jax generate --dataset_version=v2`); training data: its samples "
              f"differ in at least {spec.min_layout} layout cells and {spec.min_structure} "
              "answer cells from each other" + (
                  "." if exclusion is None else
                  f", and in at least {exclusion.min_layout} and {exclusion.min_structure} from "
                  f"each of {len(exclusion)} excluded (benchmark) layouts."), "",
              "Each record: `index`, `input_grid` (the masked grid, `V` to fill), "
              "`ground_truth`, `gravity_dir` (row, col) and `optimum`: the reference "
              "yardstick's optimum of the record's own masked problem, with the key a scorer "
              "checks before using it (`yardstick`, `key`, `compliance`, `densities`, "
              "`iterations`, `converged`).", "",
              "| candidates drawn | " + " | ".join(f"rejected: {r}" for r in REASONS) + " |",
              "|---:|" + "---:|" * len(REASONS),
              f"| {summary['drawn']} | "
              + " | ".join(str(summary["rejected"][r]) for r in REASONS) + " |", ""]
    return "\n".join(lines)


class _Files:
    """The data files of a corpus, written in sample order, one file at a time."""

    def __init__(self, spec: CorpusSpec, output: pathlib.Path, work: pathlib.Path):
        self.spec = spec
        self.output = output
        self.partial = work / "partial"
        self.rows = max(1, _ROW_GROUP_CELLS // spec.grid_size ** 2)
        self._buffers: dict[str, list[dict]] = {name: [] for name in list_subjects()}
        self._writers: dict[str, Any] = {}

    def add(self, records: dict[str, list[dict]]) -> None:
        """Append records (by subject, in sample order)."""
        for name, rows in records.items():
            self._buffers[name].extend(rows)
            if self.spec.format == "parquet":
                while len(self._buffers[name]) >= self.rows:
                    self._write_rows(name, self.rows)

    def _write_rows(self, name: str, count: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows, self._buffers[name] = self._buffers[name][:count], self._buffers[name][count:]
        if name not in self._writers:
            self.partial.mkdir(parents=True, exist_ok=True)
            self._writers[name] = pq.ParquetWriter(self.partial / f"{name}.parquet",
                                                   _parquet_schema())
        self._writers[name].write_table(pa.Table.from_pylist(rows, schema=_parquet_schema()))

    def finish(self, file: int) -> None:
        """Write out the current file (every subject) under its final names."""
        if self.spec.format == "jsonl":
            from sphyr_jax.io import commit_files

            commit_files({self.output / data_file(self.spec, name, file):
                          render_subject(rows, "jsonl") for name, rows in self._buffers.items()})
        else:
            for name in list_subjects():
                if self._buffers[name]:
                    self._write_rows(name, len(self._buffers[name]))
                self._writers.pop(name).close()
            for name in list_subjects():
                target = self.output / data_file(self.spec, name, file)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.partial / f"{name}.parquet", target)
        self._buffers = {name: [] for name in list_subjects()}

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


def _save_arrays(path: pathlib.Path, arrays: dict) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())


def _load_arrays(path: pathlib.Path) -> dict | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, KeyError):  # a cache file cut short: solve again
        return None


def _pack_optima(fields: list[dict | None]) -> dict:
    """:func:`optima_task` fields as plain arrays (every record of a corpus is a problem)."""
    if any(f is None for f in fields):
        raise CorpusError("a generated record is not a readable problem")
    return {"yardstick": np.array([f["yardstick"] for f in fields]),
            "key": np.array([f["key"] for f in fields]),
            "compliance": np.array([np.nan if f["compliance"] is None else f["compliance"]
                                    for f in fields], np.float64),
            "densities": np.array([f["densities"] for f in fields], np.float64),
            "iterations": np.array([f["iterations"] for f in fields], np.int64),
            "converged": np.array([f["converged"] for f in fields], bool)}


def _unpack_optima(arrays: dict) -> list[dict]:
    return [{"yardstick": str(arrays["yardstick"][k]), "key": str(arrays["key"][k]),
             "compliance": None if np.isnan(arrays["compliance"][k])
             else float(arrays["compliance"][k]),
             "densities": arrays["densities"][k].tolist(),
             "iterations": int(arrays["iterations"][k]),
             "converged": bool(arrays["converged"][k])} for k in range(len(arrays["key"]))]


# ----------------------------------------------------------------------------
# The driver.


@dataclasses.dataclass
class _Batch:
    indices: list[int]
    layouts: np.ndarray  # (K, 2W) packed
    candidates: list[V2Candidate]


@dataclasses.dataclass
class _Sample:
    candidate_index: int
    candidate: V2Candidate
    easy: np.ndarray
    hard: np.ndarray


class _Run:
    """One run of the driver over a corpus folder (see :func:`build_corpus`)."""

    def __init__(self, spec: CorpusSpec, output: pathlib.Path, exclusion: SampleIndex | None,
                 engine: Engine, report: Callable):
        self.spec = spec
        self.output = output
        self.exclusion = exclusion
        self.engine = engine
        self.report = report
        self.work = output / WORK
        self.rules = spec.rules()
        shape = (spec.grid_size, spec.grid_size)
        self.accepted = SampleIndex(shape, min_layout=spec.min_layout,
                                    min_structure=spec.min_structure)
        self.reasons = np.zeros(1024, np.int16)  # per candidate: a reason's position or a code
        self.cursor = 0  # next candidate to draw
        self.queue: deque = deque()  # drawn candidates that passed the screens of their own
        self.batches: dict[int, _Batch] = {}
        self.formed = 0
        self.judged = 0
        self.solved: dict[int, dict] = {}
        self.samples: list[_Sample | None] = []  # accepted, by sample index (None: written)
        self.last_accepted = -1
        self.optima: dict[int, dict] = {}
        self.groups_sent = 0
        self.groups_written = 0
        self.first_group = 0  # groups before it are in finished files
        self.in_flight: dict = {}
        self.tasks = {"solve": 0, "optima": 0}
        self.files = _Files(spec, output, self.work)

    # -- bookkeeping -------------------------------------------------------

    def _mark(self, index: int, code: int) -> None:
        if index >= len(self.reasons):
            grown = np.zeros(max(2 * len(self.reasons), index + 1), np.int16)
            grown[: len(self.reasons)] = self.reasons
            self.reasons = grown
        self.reasons[index] = code

    def _refuse(self, index: int, reason: str) -> None:
        self._mark(index, REASONS.index(reason) + 1)

    @property
    def group_count(self) -> int:
        return math.ceil(self.spec.num_samples / self.spec.optima_samples)

    def _group_range(self, group: int) -> range:
        lo = group * self.spec.optima_samples
        return range(lo, min(lo + self.spec.optima_samples, self.spec.num_samples))

    def _groups_per_file(self) -> int:
        return math.ceil(self.spec.samples_per_file / self.spec.optima_samples)

    # -- screening and batches ---------------------------------------------

    def _draw_chunk(self) -> None:
        """Draw the next candidates and apply the screens that need no accepted sample."""
        count = min(_CHUNK, self.spec.attempts - self.cursor)
        start = self.cursor
        self.cursor += count
        kept = []
        for i in range(start, start + count):
            candidate = draw_candidate(self.spec, i)
            if isinstance(candidate, str):
                self._refuse(i, "supports")
            elif candidate.solid_cells - int((candidate.load_mask
                                              | candidate.support_mask).sum()) < 1:
                self._refuse(i, "budget")
            else:
                kept.append((i, candidate))
        if not kept:
            return
        bits = layout_bits(np.stack([c.load_mask for _, c in kept]),
                           np.stack([c.support_mask for _, c in kept]))
        excluded = (self.exclusion.layout_too_close(bits) if self.exclusion is not None
                    else np.zeros(len(kept), bool))
        for (i, candidate), row, bad in zip(kept, bits, excluded, strict=True):
            if bad:
                self._refuse(i, LAYOUT)
            else:
                self.queue.append((i, candidate, row))

    def _can_form(self) -> bool:
        if self.formed > self.judged + self.spec.window - 1:
            return False  # its screen needs batches not judged yet
        pending = sum(len(self.batches[k].indices) for k in range(self.judged, self.formed))
        if len(self.samples) + pending >= self.spec.num_samples:
            return False  # enough candidates on their way (more if some are refused)
        return bool(self.queue) or self.cursor < self.spec.attempts

    def _form(self) -> _Batch:
        """Admit the next batch (see the module docstring)."""
        k = self.formed
        lo = max(0, k - self.spec.window + 1)
        rivals = [self.batches[j].layouts for j in range(lo, k) if len(self.batches[j].indices)]
        indices, rows, candidates = [], [], []
        checked: dict[int, bool] = {}
        while len(indices) < self.spec.batch_size:
            if not self.queue:
                if self.cursor >= self.spec.attempts:
                    break
                self._draw_chunk()
                continue
            if not checked:  # one vectorised screen of the queue against the accepted samples
                waiting = np.stack([row for _, _, row in self.queue])
                close = self.accepted.layout_too_close(waiting)
                checked = {i: bool(c) for (i, _, _), c in zip(self.queue, close, strict=True)}
            i, candidate, row = self.queue.popleft()
            near = checked.pop(i, None)
            if near is None:  # drawn after the vectorised screen
                near = bool(self.accepted.layout_too_close(row[None])[0])
            if not near:
                for other in rivals + ([np.stack(rows)] if rows else []):
                    if layout_hamming(other, row).min() < self.spec.min_layout:
                        near = True
                        break
            if near:
                self._refuse(i, "layout")
                continue
            self._mark(i, _ADMITTED)
            indices.append(i)
            rows.append(row)
            candidates.append(candidate)
        width = 2 * self.accepted.width
        batch = _Batch(indices, np.stack(rows) if rows else np.zeros((0, width), np.uint64),
                       candidates)
        self.batches[k] = batch
        self.formed += 1
        return batch

    def _judge(self, k: int) -> None:
        """Keep or refuse the candidates of batch ``k`` in order."""
        batch, result = self.batches[k], self.solved.pop(k)
        for j, i in enumerate(batch.indices):
            if len(self.samples) >= self.spec.num_samples:
                self._mark(i, _UNUSED)
                continue
            easy = result["easy"][j]
            solid = pack_cells(easy.astype(bool))
            if result["degenerate"][j]:
                self._refuse(i, "degenerate")
            elif (self.exclusion is not None
                  and self.exclusion.structure_too_close(solid[None])[0]):
                self._refuse(i, STRUCTURE)
            elif self.accepted.structure_too_close(solid[None])[0]:
                self._refuse(i, "structure")
            else:
                self._mark(i, _ACCEPTED)
                self.accepted.add_packed(layouts=batch.layouts[j], structures=solid)
                written = len(self.samples) < self.first_group * self.spec.optima_samples
                self.samples.append(None if written else _Sample(
                    i, batch.candidates[j], easy, result["hard"][j]))
                self.last_accepted = i
        if k >= self.spec.window:  # no batch to come screens against it any more
            self.batches.pop(k - self.spec.window, None)
        self.judged += 1
        self.report("accepted", len(self.samples), self.spec.num_samples)

    # -- tasks -------------------------------------------------------------

    def _submit(self, kind: str, index: int, fn, *args) -> None:
        self.in_flight[self.engine.submit(fn, *args)] = (kind, index)
        self.tasks[kind] += 1

    def _dispatch(self) -> bool:
        """Start what can start (cached results count as finished); True if anything did."""
        moved = False
        while len(self.in_flight) < self.engine.slots:
            g = self.groups_sent
            if g < self.group_count and self._group_range(g)[-1] < len(self.samples):
                self.groups_sent += 1
                moved = True
                if g < self.first_group:
                    continue  # its file is written
                cached = _load_arrays(self.work / "optima" / f"{g:06d}.npz")
                if cached is not None:
                    self.optima[g] = _unpack_optima(cached)
                    continue
                rows = [(r["ground_truth"], r["input_grid"], r["gravity_dir"])
                        for s in self._group_range(g) for r in self._records(s).values()]
                self._submit("optima", g, optima_task, self.spec.yardstick, rows)
                continue
            if not self._can_form():
                break
            k = self.formed
            batch = self._form()
            moved = True
            if not batch.indices:
                self.solved[k] = {}
                continue
            cached = _load_arrays(self.work / "solve" / f"{k:06d}.npz")
            if cached is not None and list(cached["indices"]) == batch.indices:
                self.solved[k] = cached
            else:
                self._submit("solve", k, solve_task, self.spec, batch.indices)
        return moved

    def _records(self, s: int) -> dict[str, dict]:
        sample = self.samples[s]
        return sample_records(self.spec, s, sample.candidate_index, sample.candidate,
                              sample.easy, sample.hard)

    def _collect(self, handle) -> None:
        kind, index = self.in_flight.pop(handle)
        value = self.engine.result(handle)
        if kind == "solve":
            _save_arrays(self.work / "solve" / f"{index:06d}.npz", value)
            self.solved[index] = value
        else:
            _save_arrays(self.work / "optima" / f"{index:06d}.npz", _pack_optima(value))
            self.optima[index] = value

    def _advance(self) -> bool:
        """Judge and write whatever is ready, in order; True if anything was."""
        moved = False
        while self.judged < self.formed and self.judged in self.solved:
            if not self.solved[self.judged]:
                self.solved.pop(self.judged)
                self.judged += 1
            else:
                self._judge(self.judged)
            moved = True
        while self.groups_written < self.group_count:
            g = self.groups_written
            if g < self.first_group:
                self.groups_written += 1
                continue
            if g not in self.optima:
                break
            fields = iter(self.optima.pop(g))
            records: dict[str, list[dict]] = {name: [] for name in list_subjects()}
            for s in self._group_range(g):
                for name, record in self._records(s).items():
                    records[name].append({**record, "optimum": next(fields)})
                self.samples[s] = None  # written: let it go
            self.files.add(records)
            self.groups_written += 1
            moved = True
            done = self._group_range(g)[-1] + 1
            self.report("samples", done, self.spec.num_samples)
            if done % self.spec.samples_per_file == 0 or done == self.spec.num_samples:
                self._finish_file((done - 1) // self.spec.samples_per_file)
        return moved

    def _finish_file(self, file: int) -> None:
        self.files.finish(file)
        self.manifest["files_done"] = file + 1
        atomic_write_json(self.output / MANIFEST, self.manifest)
        per_file = self._groups_per_file()
        for g in range(file * per_file, (file + 1) * per_file):
            (self.work / "optima" / f"{g:06d}.npz").unlink(missing_ok=True)

    # -- the run -----------------------------------------------------------

    def _open(self) -> dict | None:
        """Read or start the manifest; the summary when the corpus is already complete."""
        path = self.output / MANIFEST
        key = self.spec.key(self.exclusion)
        if path.exists():
            manifest = read_json(path)
            if manifest.get("key") != key:
                raise CorpusError(f"{self.output} holds another corpus ({MANIFEST} differs "
                                  "from this run's settings); use another output folder")
            if manifest.get("complete"):
                return manifest["summary"]
        else:
            existing = [name for name in list_subjects()
                        if (self.output / f"{name}.jsonl").exists()
                        or (self.output / name).exists()]
            if existing:
                raise CorpusError(f"{self.output} already holds subject files ({existing[0]}, "
                                  "...) that are not this corpus's; use another output folder")
            manifest = {"key": key, "files_done": 0, "complete": False}
            self.output.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, manifest)
        self.manifest = manifest
        shutil.rmtree(self.work / "partial", ignore_errors=True)
        self.first_group = manifest["files_done"] * self._groups_per_file()
        self.groups_written = 0
        return None

    def run(self) -> dict:
        start = time.perf_counter()
        done = self._open()
        if done is not None:
            return {**done, "resumed": True}
        resumed = self.manifest["files_done"]
        self.report("accepted", 0, self.spec.num_samples)
        # Samples written by an earlier run: shown, but not part of this run's rate.
        self.report("samples", min(resumed * self.spec.samples_per_file, self.spec.num_samples),
                    self.spec.num_samples)
        try:
            while self._unfinished():
                while self._advance() | self._dispatch():
                    pass
                if not self._unfinished():
                    break
                if not self.in_flight:
                    raise self._shortfall()
                for handle in self.engine.wait(list(self.in_flight)):
                    self._collect(handle)
        finally:
            self.files.close()
        summary = self._summary(time.perf_counter() - start, resumed)
        atomic_write_text(self.output / "README.md",
                          dataset_card(self.spec, summary, self.exclusion))
        self.manifest.update(complete=True, summary=summary)
        atomic_write_json(self.output / MANIFEST, self.manifest)
        shutil.rmtree(self.work, ignore_errors=True)
        return summary

    def _unfinished(self) -> bool:
        return (self.groups_written < self.group_count
                or len(self.samples) < self.spec.num_samples)

    def _counts(self, upto: int) -> dict[str, int]:
        codes = self.reasons[:upto]
        return {reason: int(np.count_nonzero(codes == k + 1)) for k, reason in enumerate(REASONS)}

    def _shortfall(self) -> CorpusError:
        return CorpusError(
            f"kept only {len(self.samples)} of {self.spec.num_samples} samples after "
            f"{self.cursor} draws (rejected: {self._counts(self.cursor)}); raise max_attempts, "
            "lower the distances, or use a larger grid (a grid holds only so many layouts "
            f"{self.spec.min_layout} cells apart)")

    def _summary(self, seconds: float, resumed_files: int) -> dict:
        drawn = self.last_accepted + 1
        codes = self.reasons[:drawn]
        made = self.spec.num_samples - resumed_files * self.spec.samples_per_file
        return {
            "output_dir": os.fspath(self.output), "dataset_version": "v2",
            "grid_size": self.spec.grid_size, "seed": self.spec.seed,
            "format": self.spec.format, "files": self.spec.file_count,
            "kept": self.spec.num_samples, "drawn": drawn,
            "solved": int(np.count_nonzero(codes == _ACCEPTED)) + sum(
                int(np.count_nonzero(codes == REASONS.index(r) + 1))
                for r in ("degenerate", STRUCTURE, "structure")),
            "unused": int(np.count_nonzero(self.reasons == _UNUSED)),
            "rejected": self._counts(drawn), "batches": self.judged,
            "tasks": dict(self.tasks), "seconds": seconds,
            "samples_per_second": made / seconds if seconds > 0 else float("inf"),
            "records_per_sample": len(list_subjects()),
            "device": device_name(),
            "subjects": dict.fromkeys(list_subjects(), self.spec.num_samples),
        }


def build_corpus(spec: CorpusSpec, output_dir, *, engine: Engine | None = None,
                 exclusion: BenchmarkIndex | SampleIndex | None = None,
                 exclude_defaults: bool = True, progress=None) -> dict:
    """Generate (or finish) a corpus in ``output_dir``; see the module docstring.

    Args:
        spec: the corpus.
        output_dir: its folder (created if missing).  A folder holding this
            corpus unfinished is finished; holding it complete, left as is.
        engine: where tasks run (default: this process, one at a time).
        exclusion: samples to hold the corpus apart from (default: the
            shipped benchmark sets of the grid size,
            :func:`~sphyr_jax.data.exclusion.load_exclusion_index`).
        exclude_defaults: with ``exclusion`` None, False excludes nothing.
        progress: optional callable(stage, done, total); stages ``"accepted"``
            and ``"samples"`` (written; a resumed run's first ``"samples"``
            report counts the samples an earlier run wrote).

    Returns:
        The summary: ``kept``, ``drawn`` (candidates up to the last accepted
        one), ``rejected`` (by reason, :data:`REASONS`), ``solved``, ``unused``
        (solved after the last sample was accepted), ``tasks`` run, ``seconds``,
        ``samples_per_second``, ``files``...  (``resumed`` when the corpus was
        already complete.)

    Raises:
        CorpusError: too few samples within ``spec.max_attempts`` draws, or the
            folder holds something else.
    """
    fea.require_x64()
    if exclusion is None and exclude_defaults:
        exclusion = load_exclusion_index(spec.grid_size)
    if exclusion is not None and exclusion.shape != (spec.grid_size, spec.grid_size):
        raise ValueError(f"the exclusion index is {exclusion.shape}, the corpus "
                         f"{spec.grid_size}x{spec.grid_size}")
    own = engine is None
    engine = engine or LocalEngine()
    report = progress or (lambda stage, done, total: None)
    try:
        return _Run(spec, pathlib.Path(output_dir), exclusion, engine, report).run()
    finally:
        if own:
            engine.close()


# ----------------------------------------------------------------------------
# Reading a corpus back, and checking its optima.


def is_corpus(folder) -> bool:
    """Whether a folder holds a corpus written by :func:`build_corpus` (its manifest)."""
    return (pathlib.Path(folder) / MANIFEST).is_file()


def read_corpus_subject(folder, subject: str) -> list[dict]:
    """Every record of one subject of a corpus, ``optimum`` included, in sample order."""
    folder = pathlib.Path(folder)
    spec_key = read_json(folder / MANIFEST)["key"]
    if spec_key["format"] == "jsonl":
        return [json.loads(line) for line in
                (folder / f"{subject}.jsonl").read_text().splitlines() if line.strip()]
    import pyarrow.parquet as pq

    records: list[dict] = []
    for path in sorted((folder / subject).glob("train-*.parquet")):
        records.extend(pq.read_table(path).to_pylist())
    return records


def verify_optima(folder, count: int, *, seed: int = 0, engine: Engine | None = None,
                  rtol: float = 1e-9) -> dict:
    """Recompute the optima of ``count`` random records of a corpus and compare.

    The records are drawn with ``default_rng([seed, 1])`` over every subject
    and sample; each is recomputed from its ground truth, masked input and
    direction (a batch of its own), and its key, compliance (relative) and
    densities (absolute) must agree to ``rtol``.

    Returns:
        ``{"checked": count, "largest_difference": float}``.

    Raises:
        OptimumMismatchError: a stored optimum differs from its recomputation
            (the message names the subject and sample).
    """
    folder = pathlib.Path(folder)
    spec_key = read_json(folder / MANIFEST)["key"]
    total = int(spec_key["num_samples"])
    subjects = list_subjects()
    rng = np.random.default_rng([int(seed), 1])
    picks = sorted({(subjects[int(rng.integers(len(subjects)))], int(rng.integers(total)))
                    for _ in range(count)})
    by_subject: dict[str, list[int]] = {}
    for name, s in picks:
        by_subject.setdefault(name, []).append(s)
    chosen = []
    for name, samples in by_subject.items():
        records = read_corpus_subject(folder, name)
        chosen += [(name, s, records[s]) for s in samples]
    own = engine is None
    engine = engine or LocalEngine()
    try:
        handles = [engine.submit(optima_task, spec_key["yardstick"],
                                 [(r["ground_truth"], r["input_grid"], r["gravity_dir"])])
                   for _, _, r in chosen]
        fresh = [engine.result(h)[0] for h in handles]
    finally:
        if own:
            engine.close()
    largest = 0.0
    for (name, s, record), new in zip(chosen, fresh, strict=True):
        stored = record.get("optimum") or {}
        if new is None or stored.get("key") != new["key"]:
            raise OptimumMismatchError(f"{name} sample {s}: the stored optimum's key is not "
                                       "the record's")
        a = np.asarray(stored["densities"], np.float64)
        b = np.asarray(new["densities"], np.float64)
        c_old = math.inf if stored["compliance"] is None else stored["compliance"]
        c_new = math.inf if new["compliance"] is None else new["compliance"]
        diff = float(np.max(np.abs(a - b))) if a.shape == b.shape else math.inf
        rel = abs(c_old - c_new) / abs(c_new) if math.isfinite(c_new) and c_new else (
            0.0 if c_old == c_new else math.inf)
        largest = max(largest, diff, rel)
        if not (diff <= rtol and rel <= rtol):
            raise OptimumMismatchError(f"{name} sample {s}: the stored optimum differs from its "
                              f"recomputation (compliance {c_old!r} vs {c_new!r}, densities "
                              f"up to {diff:.3g} apart)")
    return {"checked": len(chosen), "largest_difference": largest}


# ----------------------------------------------------------------------------
# Optima beside an existing set.

SIDECAR_BATCH = 64
"""Records per optima task of :func:`add_optima` (the yardstick's largest compiled batch)."""


def add_optima(dataset_dir, *, engine: Engine | None = None, yardstick: str = "reference",
               subjects: Sequence[str] | None = None, progress=None) -> dict:
    """Write the optimum of every record of a dataset folder beside it.

    A record's load direction is its ``gravity_dir``, else the one its
    folder's name gives (``dataset_1_rotations``: left), else down
    (:func:`~sphyr_jax.problem.loadcase.record_gravity`).

    Each subject's optima go to ``<dataset_dir>/optima/<subject>.jsonl``
    (:func:`~sphyr_jax.data.datasets.sidecar_path`), one line ``{"index",
    "optimum"}`` per record in the records' order; the records themselves are
    not touched.  :func:`~sphyr_jax.data.datasets.load_subject` then gives each
    record its ``optimum``, which a scorer uses while its key is the record's.
    Records are optimised :data:`SIDECAR_BATCH` at a time, one task each.

    Args:
        dataset_dir: a local dataset folder (any layout
            :func:`~sphyr_jax.data.datasets.load_subject` reads).
        engine: where tasks run (default: this process).
        yardstick: ``"reference"`` or ``"strong"``.
        subjects: the subjects (default: every subject the folder holds).
        progress: optional callable(stage, done, total); stage ``"optima"``.

    Returns:
        ``{subject: records}`` counts and the files written.
    """
    from sphyr_jax.data.datasets import DatasetError, load_subject, sidecar_path
    from sphyr_jax.data.exclusion import subjects_in
    from sphyr_jax.io import commit_files

    folder = pathlib.Path(dataset_dir)
    if not folder.is_dir():
        raise DatasetError(f"no such dataset folder: {os.fspath(dataset_dir)!r}")
    names = list(subjects) if subjects is not None else subjects_in(folder)
    if not names:
        raise DatasetError(f"{folder}: no subject files")
    report = progress or (lambda stage, done, total: None)
    tables = {name: load_subject(folder, name) for name in names}
    jobs = [(name, lo) for name, records in tables.items()
            for lo in range(0, len(records), SIDECAR_BATCH)]
    total = sum(len(r) for r in tables.values())
    own = engine is None
    engine = engine or LocalEngine()
    fields: dict[tuple, list] = {}
    try:
        pending = {}
        queue = deque(jobs)
        done = 0
        report("optima", 0, total)
        while queue or pending:
            while queue and len(pending) < engine.slots:
                name, lo = queue.popleft()
                rows = [(r["ground_truth"], r["input_grid"], record_gravity(r, folder, ndim=None))
                        for r in tables[name][lo: lo + SIDECAR_BATCH]]
                pending[engine.submit(optima_task, yardstick, rows)] = (name, lo)
            for handle in engine.wait(list(pending)):
                key = pending.pop(handle)
                fields[key] = engine.result(handle)
                done += len(fields[key])
                report("optima", done, total)
    finally:
        if own:
            engine.close()
    files = {}
    for name, records in tables.items():
        ordered = [f for lo in range(0, len(records), SIDECAR_BATCH) for f in fields[(name, lo)]]
        files[sidecar_path(folder, name)] = "".join(
            json.dumps({"index": r["index"], "optimum": f}) + "\n"
            for r, f in zip(records, ordered, strict=True))
    commit_files(files)
    return {"dataset_dir": os.fspath(folder), "yardstick": yardstick,
            "records": {name: len(r) for name, r in tables.items()},
            "files": [os.fspath(p) for p in files]}
