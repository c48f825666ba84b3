"""The evaluation harness: ask a model every sample, keep every answer, score them in batches.

*Tasks.*  A subject's tasks are its records in the published order (shuffled
once with ``random.Random(seed)``, the first ``sample_count`` kept;
:func:`~sphyr_jax.evaluation.prompts.sample_order`), turned clockwise
``spec.rotations`` times with their load direction, each with its prompt
(:func:`~sphyr_jax.evaluation.prompts.build_prompt`; few-shot examples come
from the subject's other records, turned alike).  :func:`replay_tasks` serves
the records of a stored run instead: its prompts and answers exactly as
stored, so a new model is measured on the very samples of a published column.

*Runner.*  :func:`run_tasks` keeps up to ``concurrency`` model calls in flight
(a fixed pool of workers over one queue, subject after subject).  A call that
gives no answer is retried by the :class:`RetryPolicy` (exponential backoff
with jitter, never sooner than the server's ``Retry-After``); a sample that
still fails is reported (:attr:`RunSummary.failures`) and never stored, so the
next run asks it again.  Answers are scored in batches as they arrive
(:func:`_score`, the batched scorer, in a worker thread while calls go on).

*Files.*  ``<results_root>/<model with '/' and ':' replaced by '_'><suffix>/``
holds ``<subject>_results.json`` (a JSON list of records: ``subject``,
``prompt``, ``ground_truth``, ``completion``, ``model``, ``index`` and
``gravity_dir`` when known, and every metric field of
:class:`~sphyr_jax.scoring.metrics.StructuralMetrics`) and, once every sample
of the subject is answered and scored, ``<subject>_aggregated_results.json``
(``total_<metric>`` sums, ``evaluated_samples``, the yardstick's name).  The
suffix is the experiment's (``_<N>_rotations``, ``_few_shot_<K>``,
``_physics_enhanced_prompt``, ...; :attr:`PromptSpec.suffix`).

*Nothing lost.*  Every answer is written the moment it arrives (unscored),
and again with its metrics once scored; writes are atomic (a temporary file
renamed over the old one), coalesced while one is under way, so a process
killed at any instant loses at most the answers of calls still in flight.  A
rerun reads the file back, skips every stored sample (its prompt and answer:
two samples may share a prompt), scores stored records that have no metrics
yet, and asks only what is missing.  A second process on the same folder is
refused (an advisory lock).

The per-sample step is reusable on its own (:func:`run_sample`: prompt ->
completion with retries -> record; :func:`ask`, :func:`make_record`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import pathlib
import random
import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence

from sphyr_jax.data.datasets import list_subjects, load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation import prompts
from sphyr_jax.evaluation.backends import (
    Backend,
    BackendError,
    Pool,
    Query,
    as_backend,
    make_backend,
)
from sphyr_jax.evaluation.prompts import (
    DEFAULT_SAMPLE_COUNT,
    DEFAULT_SEED,
    PromptSpec,
    build_prompt,
    few_shot_examples,
    rotate,
    sample_order,
)
from sphyr_jax.io import CorruptFileError, atomic_write_json, atomic_write_text, read_json
from sphyr_jax.problem.grids import as_grid, extract_grid, grid_ndim, grid_to_text
from sphyr_jax.problem.loadcase import DEFAULT_GRAVITY, gravity_from_folder
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.metrics import ScoreItem, score_batch
from sphyr_jax.scoring.results import AGGREGATED_SUFFIX, RESULTS_SUFFIX, aggregate

SCORED_FIELD = "topology_score"  # a record holding it has been scored
DEFAULT_SCORE_BATCH = 64  # answers gathered before a scoring batch starts
DEFAULT_SCORE_WAIT = 10.0  # seconds an answer waits for its batch to fill
LOCK_FILE = ".evaluate.lock"
_DOWN = (1, 0)
DEFAULT_SPEC = PromptSpec()  # the published prompt, no rotation, zero-shot
_SUFFIX = re.compile(r"(?:_[0-3]_rotations)?(?:_few_shot_\d+)?"
                     r"(?:_(?:physics_enhanced|physics_neutral|load_direction|custom)_prompt)?$")


# --------------------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """One sample to ask: what the model is shown and the answer it is scored against.

    Attributes:
        query: the prompt and what it was made from (see
            :class:`~sphyr_jax.evaluation.backends.Query`).
        ground_truth: the dataset answer as text (rows on lines), turned like
            the query.
        position: rank in the subject's published order (0-based).
        grid_in_prompt: whether the last grid of the prompt is the masked grid
            (else records also store ``input_grid``, e.g. for a custom template).
    """

    query: Query
    ground_truth: str
    position: int
    grid_in_prompt: bool = True

    @property
    def subject(self) -> str:
        return self.query.subject

    @property
    def prompt(self) -> str:
        return self.query.prompt


def _direction(value) -> tuple | None:
    if value is None:
        return None
    return tuple(int(v) if float(v).is_integer() else float(v) for v in value)


def subject_tasks(records: Sequence[dict], subject: str, spec: PromptSpec = DEFAULT_SPEC,
                  sample_count: int | None = DEFAULT_SAMPLE_COUNT,
                  seed: int = DEFAULT_SEED) -> list[Task]:
    """The tasks of one subject, in the published order.

    Args:
        records: the subject's dataset records (``input_grid``, ``ground_truth``,
            optional ``index`` and ``gravity_dir``), in stored order.
        subject: the subject name.
        spec: prompt style, template, rotations and few-shot count.
        sample_count: samples kept after the shuffle (None: all).
        seed: the shuffle's seed (42 in the published runs).

    Returns:
        ``min(sample_count, len(records))`` tasks.  ``random.Random(seed).shuffle``
        permutes by length alone, so the order equals
        ``sample_order(records, sample_count, seed)``.
    """
    turned = tuple(rotate(records, spec.rotations))  # few-shot examples and retrieval see the turn
    order = sample_order(list(range(len(turned))), sample_count, seed)
    tasks = []
    for rank, i in enumerate(order):
        record = turned[i]
        gravity = _direction(record.get("gravity_dir"))
        examples = few_shot_examples(turned, record, spec.few_shot, seed)
        prompt = build_prompt(record["input_grid"], subject, spec, examples, gravity or _DOWN)
        query = Query(prompt=prompt, subject=subject, input_grid=record["input_grid"],
                      gravity_dir=gravity, index=record.get("index"), pool=Pool(turned, i))
        shown = spec.template is None or _last_grid_is(prompt, record["input_grid"])
        answer = record["ground_truth"]
        if not (isinstance(answer, list) and all(isinstance(r, list) for r in answer)):
            answer = as_grid(answer)  # the loaders already give token rows
        tasks.append(Task(query, grid_to_text(answer), rank, shown))
    return tasks


def _last_grid_is(prompt: str, grid) -> bool:
    grid = as_grid(grid)
    return extract_grid(prompt, ndim=grid_ndim(grid)) == grid


def _stored_records(path: pathlib.Path) -> list[dict]:
    records = read_json(path)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise CorruptFileError(f"{path}: expected a JSON list of records (objects)", path)
    return records


def replay_tasks(results_file, sample_count: int | None = None) -> list[Task]:
    """The samples of a stored run: prompts and answers exactly as stored.

    Args:
        results_file: ``<folder>/<subject>_results.json`` of any model; the
            load direction is a record's ``gravity_dir``, else the folder's
            rotation tag (``*_1_rotations`` ...), else down.
        sample_count: keep the first N records (None: all).

    Raises:
        CorruptFileError: the file is not a list of records holding a prompt
            with a grid and a ground truth.
    """
    path = pathlib.Path(results_file)
    subject = path.name[: -len(RESULTS_SUFFIX)] if path.name.endswith(RESULTS_SUFFIX) else path.stem
    stored = _stored_records(path)
    if sample_count is not None:
        stored = stored[: int(sample_count)]
    folder_gravity = gravity_from_folder(path.parent.name)
    folder_gravity = None if tuple(folder_gravity) == DEFAULT_GRAVITY else folder_gravity
    rows = []
    for i, record in enumerate(stored):
        prompt, answer = record.get("prompt"), record.get("ground_truth")
        if not isinstance(prompt, str) or not isinstance(answer, str):
            raise CorruptFileError(f"{path}: record {i} has no prompt or ground_truth text", path)
        ndim = grid_ndim(as_grid(answer)) if extract_grid(answer) is not None else 2
        grid = extract_grid(prompt, ndim=ndim)
        if grid is None:
            raise CorruptFileError(f"{path}: record {i}: no grid in its prompt", path)
        rows.append((record, prompt, answer, grid))
    pool = tuple({"index": r.get("index", i), "input_grid": grid, "ground_truth": answer}
                 for i, (r, _, answer, grid) in enumerate(rows))
    tasks = []
    for i, (record, prompt, answer, grid) in enumerate(rows):
        gravity = _direction(record.get("gravity_dir") or folder_gravity)
        query = Query(prompt=prompt, subject=subject, input_grid=grid, gravity_dir=gravity,
                      index=record.get("index"), pool=Pool(pool, i))
        tasks.append(Task(query, answer, i))
    return tasks


def replay_suffix(folder) -> str:
    """The experiment suffix of a stored run's folder name (``_3_rotations`` ...; '' for none)."""
    return _SUFFIX.search(pathlib.Path(folder).name).group(0)


def replay_subjects(folder) -> list[str]:
    """Subjects with a results file in a stored run's folder, sorted."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"no such results folder: {folder}")
    return sorted(p.name[: -len(RESULTS_SUFFIX)] for p in folder.glob("*" + RESULTS_SUFFIX)
                  if not p.name.endswith(AGGREGATED_SUFFIX))


def dataset_subjects(source) -> list[str]:
    """Subjects present in a local dataset folder (all 16 2D ones for a hub source or a file)."""
    root = pathlib.Path(source)
    if not root.is_dir():
        return list_subjects()
    found = [s for s in list_subjects() + list_subjects(3)
             if any((root / f"{s}{ext}").exists() for ext in (".jsonl", ".json", ".parquet",
                                                              ".arrow", ""))]
    if not found:
        raise UserInputError(f"{root}: no subject files (<subject>.jsonl or <subject>.json)")
    return found


def model_folder_name(model: str) -> str:
    """A model name as a folder name: '/' and ':' become '_' (the published layout)."""
    return model.replace("/", "_").replace(":", "_")


def results_folder(results_root, model: str, suffix: str = "") -> pathlib.Path:
    """``<results_root>/<model folder name><suffix>``."""
    return pathlib.Path(results_root) / (model_folder_name(model) + suffix)


# --------------------------------------------------------------------------- one sample


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """When to ask a model again after a call that gave no answer.

    The wait after failed attempt ``a`` (0-based) is
    ``d_a = min(max_delay, initial_delay * multiplier**a) * (1 - jitter * U)``,
    ``U ~ Uniform[0, 1)``, and never less than the server's ``Retry-After``
    (capped at ``max_retry_after``).  Only retryable errors are retried.

    Attributes:
        max_retries: further attempts after the first (0: ask once).
        initial_delay: seconds before the first retry (before jitter).
        max_delay: cap of the exponential part.
        multiplier: growth per attempt.
        jitter: fraction of the wait drawn at random (spreads out clients that
            failed together).
        max_retry_after: cap on a server's ``Retry-After``.
    """

    max_retries: int = 6
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_retry_after: float = 300.0

    def __post_init__(self):
        if self.max_retries < 0 or self.initial_delay < 0 or self.max_delay < 0:
            raise UserInputError("retry counts and delays must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise UserInputError(f"jitter must be in [0, 1], got {self.jitter}")

    def delay(self, attempt: int, retry_after: float | None = None, rng=random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based)."""
        wait = min(self.max_delay, self.initial_delay * self.multiplier ** int(attempt))
        wait *= 1.0 - self.jitter * rng.random()
        if retry_after is not None and math.isfinite(retry_after):
            wait = max(wait, min(float(retry_after), self.max_retry_after))
        return wait


class SampleFailed(Exception):
    """A sample whose model calls all failed; ``attempts`` calls were made."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


async def ask(backend: Backend, query: Query, policy: RetryPolicy = RetryPolicy(), *,
              rng=None, sleep=asyncio.sleep,
              on_retry: Callable[[BackendError, float], None] | None = None) -> str:
    """The model's reply to one query, retried by ``policy``.

    Raises:
        SampleFailed: a non-retryable error, or retries exhausted (the message
            is the last error's).
    """
    rng = rng if rng is not None else random.Random()
    for attempt in range(policy.max_retries + 1):
        try:
            return await backend.complete(query)
        except BackendError as exc:
            if not exc.retryable or attempt == policy.max_retries:
                raise SampleFailed(str(exc), attempt + 1) from None
            wait = policy.delay(attempt, exc.retry_after, rng)
            if on_retry is not None:
                on_retry(exc, wait)
            await sleep(wait)
    raise AssertionError("unreachable")


def make_record(task: Task, completion: str, model: str) -> dict:
    """The results record of one answered task (no metrics yet)."""
    query = task.query
    record = {"subject": task.subject, "prompt": query.prompt,
              "ground_truth": task.ground_truth, "completion": completion, "model": model}
    if query.index is not None:
        record["index"] = query.index
    if query.gravity_dir is not None:
        record["gravity_dir"] = list(query.gravity_dir)
    if not task.grid_in_prompt:  # e.g. a custom template: scoring must not guess the grid
        record["input_grid"] = grid_to_text(as_grid(query.input_grid))
    return record


async def run_sample(backend: Backend, task: Task, policy: RetryPolicy = RetryPolicy(),
                     model: str | None = None, **ask_options) -> dict:
    """Prompt -> completion (with retries) -> unscored record; raises :class:`SampleFailed`."""
    completion = await ask(backend, task.query, policy, **ask_options)
    return make_record(task, completion, model or backend.name)


def encode_record(record: dict) -> str:
    """One record as ``json.dumps(records, indent=2)`` prints it inside the list.

    Scalars go through the C encoder, so a results file is joined from cached
    pieces instead of re-encoded in Python on every save (byte-equal to
    ``json.dumps(records, indent=2, ensure_ascii=False)``).
    """
    if not record:
        return "  {}"
    fields = []
    for key, value in record.items():
        text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
        fields.append(f"    {json.dumps(key, ensure_ascii=False)}: "
                      + text.replace("\n", "\n    "))
    return "  {\n" + ",\n".join(fields) + "\n  }"


def _file_text(pieces: Sequence[str]) -> str:
    return ("[\n" + ",\n".join(pieces) + "\n]\n") if pieces else "[]\n"


_GRID_START, _GRID_AFTER = prompts._GRID.split("{GRID}")
_GRID_END = _GRID_AFTER + prompts._CLOSING.split("{FILL}")[0]
_PLAIN = frozenset("LSV0123456789.")


def _plain_rows(text: str):
    """Token rows of a clean text grid (rows on lines, cells by spaces; L/S/V and
    plain numbers only), or None: then the general reader must look at it."""
    rows = [line.split() for line in text.strip().split("\n")]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        return None
    if any(not _PLAIN.issuperset(t) for r in rows for t in r):
        return None
    return rows


def _prompt_grid(prompt):
    """The masked grid of a prompt: read straight from between the markers of the
    project's prompts (the published one and every style), else the prompt itself
    (whose last grid the scorer finds).  Either way the same grid."""
    if isinstance(prompt, str):
        start = prompt.rfind(_GRID_START)
        end = prompt.find(_GRID_END, start) if start >= 0 else -1
        if end >= 0:
            rows = _plain_rows(prompt[start + len(_GRID_START): end])
            if rows is not None:
                return rows
    return prompt


def _answer_grid(text):
    rows = _plain_rows(text) if isinstance(text, str) else None
    return text if rows is None else rows


def _score(records: Sequence[dict], cache=None, design_efficiency: bool = False,
           num_devices: int | None = None) -> list[dict]:
    """Every metric field of results records (physics and static), in one batched call.

    The input grid is the record's ``input_grid``, else the last grid of its
    prompt; the load direction its ``gravity_dir``, else down.  Grids the
    project wrote itself (prompt grids, dataset answers) are split into tokens
    directly; completions go through the general reader.
    """
    items = [ScoreItem(r.get("completion"), _answer_grid(r.get("ground_truth")),
                       _answer_grid(r.get("input_grid")) or _prompt_grid(r.get("prompt")),
                       tuple(r.get("gravity_dir") or DEFAULT_GRAVITY)) for r in records]
    return [m.as_dict() for m in score_batch(items, cache, design_efficiency, num_devices,
                                             static=True)]


# --------------------------------------------------------------------------- reports


@dataclasses.dataclass(frozen=True)
class Failure:
    """A sample whose calls all failed (asked again by the next run)."""

    subject: str
    position: int
    index: int | None
    attempts: int
    error: str


@dataclasses.dataclass
class SubjectReport:
    """One subject of a run."""

    subject: str
    path: str
    samples: int
    stored_before: int = 0
    answered: int = 0
    failed: int = 0
    rescored: int = 0
    complete: bool = False
    records: int = 0
    topology_score: float | None = None
    load_carrying: float | None = None


@dataclasses.dataclass
class RunSummary:
    """What a run did; ``failures`` holds every sample left unanswered."""

    model: str
    folder: str
    subjects: list = dataclasses.field(default_factory=list)
    failures: list = dataclasses.field(default_factory=list)
    retries: int = 0
    scored: int = 0
    score_batches: int = 0
    seconds: float = 0.0
    optimum: str = "reference"

    @property
    def answered(self) -> int:
        return sum(s.answered for s in self.subjects)

    @property
    def first_error(self) -> str | None:
        return self.failures[0].error if self.failures else None

    def line(self) -> str:
        """The closing one-line summary."""
        done = sum(s.complete for s in self.subjects)
        return (f"evaluated {self.model}: {self.answered} new answers, "
                f"{len(self.failures)} failed, {self.retries} retries, {self.scored} scored in "
                f"{self.score_batches} batches, {done}/{len(self.subjects)} subjects complete, "
                f"{self.seconds:.1f} s, optimum={self.optimum} -> {self.folder}")

    def table(self) -> str:
        """Per subject: samples, answers, failures, mean topology score, share load carrying."""
        width = max([len("subject")] + [len(s.subject) for s in self.subjects])
        head = (f"{'subject':{width}s} {'samples':>7s} {'stored':>6s} {'new':>4s} "
                f"{'failed':>6s} {'topo':>6s} {'carrying':>8s}")
        lines = [head, "-" * len(head)]
        for s in self.subjects:
            topo = "" if s.topology_score is None else f"{s.topology_score:.3f}"
            carry = "" if s.load_carrying is None else f"{s.load_carrying:.2f}"
            lines.append(f"{s.subject:{width}s} {s.samples:7d} {s.stored_before:6d} "
                         f"{s.answered:4d} {s.failed:6d} {topo:>6s} {carry:>8s}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- the runner


class _Subject:
    """The records of one subject's results file while a run fills it."""

    def __init__(self, subject: str, tasks: Sequence[Task], folder: pathlib.Path):
        self.name = subject
        self.tasks = list(tasks)
        self.path = folder / f"{subject}{RESULTS_SUFFIX}"
        self.aggregated_path = folder / f"{subject}{AGGREGATED_SUFFIX}"
        self.slots: list[dict | None] = [None] * len(self.tasks)
        self.extra: list[dict] = []  # stored records of samples this run does not ask
        self.report = SubjectReport(subject, str(self.path), len(self.tasks))
        self.version = 0  # bumped on every change; files are written newest-first only
        self.written = 0
        self.unscored = 0
        self._encoded: dict[int, str] = {}  # id(record) -> its JSON text

    def records(self) -> list[dict]:
        return [r for r in self.slots if r is not None] + self.extra

    def forget(self, record: dict) -> None:
        """Drop the cached text of a record about to change."""
        self._encoded.pop(id(record), None)

    def text(self) -> str:
        """The results file's text (records encoded once per change)."""
        pieces = []
        for record in self.records():
            key = id(record)
            if key not in self._encoded:
                self._encoded[key] = encode_record(record)
            pieces.append(self._encoded[key])
        return _file_text(pieces)

    def missing(self) -> list[int]:
        return [i for i, r in enumerate(self.slots) if r is None]

    def load(self, optimum: str) -> tuple[list[dict], str | None]:
        """Read the stored file; returns (records needing scores, previous yardstick)."""
        if not self.path.exists():
            return [], None
        stored = _stored_records(self.path)
        free: dict[tuple, deque] = defaultdict(deque)  # two samples may share a prompt
        for task in self.tasks:
            free[(task.prompt, task.ground_truth)].append(task.position)
        for record in stored:
            positions = free.get((record.get("prompt"), record.get("ground_truth")))
            if positions:
                self.slots[positions.popleft()] = record
            else:
                self.extra.append(record)
        self.report.stored_before = len(stored) - len(self.extra)
        previous = None
        if self.aggregated_path.exists():
            with contextlib.suppress(CorruptFileError):
                agg = read_json(self.aggregated_path)
                previous = agg.get("optimum") if isinstance(agg, dict) else None
        switched = isinstance(previous, str) and previous != optimum
        todo = [r for r in self.records() if switched or SCORED_FIELD not in r]
        return todo, (previous if switched else None)

    def complete(self) -> bool:
        return all(r is not None for r in self.slots) and self.unscored == 0


class _Run:
    def __init__(self, backend: Backend, subjects: list[_Subject], *, model: str,
                 concurrency: int, policy: RetryPolicy, cache, design_efficiency: bool,
                 num_devices, score_batch_size: int, score_wait: float, progress, log, rng):
        self.backend = backend
        self.subjects = subjects
        self.model = model
        self.concurrency = max(1, int(concurrency))
        self.policy = policy
        self.cache = cache
        self.design_efficiency = design_efficiency
        self.num_devices = num_devices
        self.score_batch_size = max(1, int(score_batch_size))
        self.score_wait = float(score_wait)
        self.progress = progress
        self.log = log
        self.rng = rng
        self.unscored: list[tuple[_Subject, dict]] = []
        self.unscored_since = 0.0
        self.asking_done = False
        self.scoring_done = False
        self.failures: list[Failure] = []
        self.retries = 0
        self.scored = 0
        self.batches = 0
        self.to_ask = 0
        self.asked = 0
        self._write_lock = threading.Lock()
        self.wake_scorer = asyncio.Event()  # bound to the running loop on first use
        self.wake_writer = asyncio.Event()

    # ---- bookkeeping (event-loop thread only)

    def _changed(self, st: _Subject) -> None:
        st.version += 1
        self.wake_writer.set()

    def _queue_scoring(self, st: _Subject, record: dict) -> None:
        if not self.unscored:
            self.unscored_since = time.monotonic()
        self.unscored.append((st, record))
        st.unscored += 1
        self.wake_scorer.set()

    def _report(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None and total > 0:
            self.progress(stage, done, total)

    def _on_retry(self, exc: BackendError, wait: float) -> None:
        self.retries += 1
        if self.log is not None and self.retries <= 3:
            self.log(f"retrying in {wait:.1f} s: {exc}")

    # ---- the three loops

    async def _worker(self, queue: deque) -> None:
        while queue:
            st, position = queue.popleft()
            task = st.tasks[position]
            try:
                completion = await ask(self.backend, task.query, self.policy, rng=self.rng,
                                       on_retry=self._on_retry)
            except SampleFailed as exc:
                self.failures.append(Failure(st.name, position, task.query.index,
                                             exc.attempts, str(exc)))
                st.report.failed += 1
                if self.log is not None and len(self.failures) == 1:
                    self.log(f"{st.name} sample {position} failed after {exc.attempts} "
                             f"attempts: {exc}")
            else:
                record = make_record(task, completion, self.model)
                st.slots[position] = record
                st.report.answered += 1
                self._changed(st)
                self._queue_scoring(st, record)
            self.asked += 1
            self._report("answers", self.asked, self.to_ask)

    async def _wait(self, event: asyncio.Event, timeout: float | None) -> None:
        event.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def _scorer(self) -> None:
        while True:
            if not self.unscored:
                if self.asking_done:
                    return
                await self._wait(self.wake_scorer, None)
                continue
            if len(self.unscored) < self.score_batch_size and not self.asking_done:
                left = self.unscored_since + self.score_wait - time.monotonic()
                if left > 0:
                    await self._wait(self.wake_scorer, left)
                    continue
            batch = self.unscored[: self.score_batch_size]  # even batches: few compiled sizes
            del self.unscored[: len(batch)]
            if self.unscored:
                self.unscored_since = time.monotonic()
            metrics = await asyncio.to_thread(_score, [r for _, r in batch], self.cache,
                                              self.design_efficiency, self.num_devices)
            for (st, record), fields in zip(batch, metrics, strict=True):
                st.forget(record)
                record.update(fields)
                st.unscored -= 1
                self._changed(st)
            self.scored += len(batch)
            self.batches += 1
            pending = len(self.unscored) + (self.to_ask - self.asked)
            self._report("scored", self.scored, self.scored + pending)

    def _snapshot(self) -> list[tuple]:
        """Write jobs (file texts, made in the loop thread) for every changed subject."""
        jobs = []
        for st in self.subjects:
            if st.version > st.written:
                agg = None
                if st.complete():  # every sample answered and scored: (re)write the totals
                    existing = None
                    if st.aggregated_path.exists():
                        with contextlib.suppress(CorruptFileError):
                            existing = read_json(st.aggregated_path)
                    agg = aggregate(st.records(), existing if isinstance(existing, dict) else None,
                                    optimum=getattr(self.cache, "yardstick", None))
                jobs.append((st, st.version, st.text(), agg))
        return jobs

    def _write(self, jobs: list[tuple]) -> None:
        """Write snapshots (any thread); an older snapshot never replaces a newer one."""
        with self._write_lock:
            for st, version, text, agg in jobs:
                if version <= st.written:
                    continue
                atomic_write_text(st.path, text)
                if agg is not None:
                    atomic_write_json(st.aggregated_path, agg, indent=2)
                st.written = version

    async def _writer(self) -> None:
        while True:
            jobs = self._snapshot()
            if not jobs:
                if self.scoring_done:
                    return
                await self._wait(self.wake_writer, None)
                continue
            await asyncio.to_thread(self._write, jobs)

    async def run(self) -> None:
        queue = deque((st, i) for st in self.subjects for i in st.missing())
        self.to_ask = len(queue)
        self._report("answers", 0, self.to_ask)  # the stage shows from its start
        workers = [asyncio.ensure_future(self._worker(queue))
                   for _ in range(min(self.concurrency, len(queue)))]
        scorer = asyncio.ensure_future(self._scorer())
        writer = asyncio.ensure_future(self._writer())
        try:
            await asyncio.gather(*workers)
            self.asking_done = True
            self.wake_scorer.set()
            await scorer
            self.scoring_done = True
            self.wake_writer.set()
            await writer
        finally:
            pending = [t for t in (*workers, scorer, writer) if not t.done()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._write(self._snapshot())  # whatever is left, also on errors and cancellation
            await self.backend.aclose()


@contextlib.contextmanager
def _folder_lock(folder: pathlib.Path):
    """An advisory lock: one run per results folder at a time (released when the process dies)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    handle = open(folder / LOCK_FILE, "a")  # noqa: SIM115
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise UserInputError(f"{folder} is being written by another evaluate run") from exc
        yield
    finally:
        handle.close()


async def run_tasks(backend: Backend, tasks: Mapping[str, Sequence[Task]], folder, *,
                    model: str | None = None, concurrency: int = 8,
                    policy: RetryPolicy = RetryPolicy(), cache=None,
                    design_efficiency: bool = False, num_devices: int | None = None,
                    score_batch_size: int = DEFAULT_SCORE_BATCH,
                    score_wait: float = DEFAULT_SCORE_WAIT, progress=None,
                    log: Callable[[str], None] | None = None, seed: int | None = None
                    ) -> RunSummary:
    """Ask, store and score every task not yet stored in ``folder`` (resumable).

    Args:
        backend: the model.
        tasks: ``{subject: tasks}`` (see :func:`subject_tasks`, :func:`replay_tasks`).
        folder: the results folder (created if needed).
        model: the name written into records (default ``backend.name``).
        concurrency: model calls in flight.
        policy: retries of calls that give no answer.
        cache: an :class:`~sphyr_jax.topopt.optimum.OptimumCache` (default: a
            fresh in-memory ``reference`` one; give it a folder to keep optima).
        design_efficiency: also score at each completion's own budget.
        num_devices: devices scoring is split over (None: all local).
        score_batch_size: records per scoring batch: a batch starts when this
            many answers are waiting, when an answer has waited ``score_wait``
            seconds, or when every call is done; batches never hold more (every
            batch size compiles once, so sizes stay few; the optimum cache
            optimises at most 64 samples at a time anyway).
        score_wait: see ``score_batch_size``.
        progress: optional callable(stage, done, total).
        log: optional callable(str) for retries, failures and yardstick changes.
        seed: seed of the retry jitter (None: random).

    Returns:
        A :class:`RunSummary`; failed samples are in ``failures`` and not stored.

    Raises:
        CorruptFileError: a stored results file is not a list of records (it is
            left untouched).
    """
    from sphyr_jax.topopt.optimum import OptimumCache

    start = time.perf_counter()
    cache = cache if cache is not None else OptimumCache(num_devices=num_devices)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = model or backend.name
    with _folder_lock(folder):
        subjects = [_Subject(name, subject_list, folder) for name, subject_list in tasks.items()]
        run = _Run(backend, subjects, model=model, concurrency=concurrency, policy=policy,
                   cache=cache, design_efficiency=design_efficiency, num_devices=num_devices,
                   score_batch_size=score_batch_size, score_wait=score_wait,
                   progress=progress, log=log, rng=random.Random(seed))
        for st in subjects:
            todo, previous = st.load(cache.yardstick)
            if previous is not None and log is not None:
                log(f"{st.path}: its figures came from the {previous!r} yardstick; "
                    f"rescoring with {cache.yardstick!r}")
            st.report.rescored = len(todo)
            for record in todo:
                run._queue_scoring(st, record)
            if st.complete() and not st.aggregated_path.exists():
                st.version += 1  # write the aggregated file of a subject completed earlier
        run.unscored_since = time.monotonic()
        await run.run()
    summary = RunSummary(model=model, folder=str(folder), failures=run.failures,
                         retries=run.retries, scored=run.scored, score_batches=run.batches,
                         optimum=cache.yardstick)
    for st in subjects:
        records = st.records()
        scored = [r for r in records if SCORED_FIELD in r]
        st.report.records = len(records)
        st.report.complete = st.complete()
        if scored:
            st.report.topology_score = sum(float(r.get("topology_score") or 0.0)
                                           for r in scored) / len(scored)
            carrying = sum(bool(r.get("load_carrying")) for r in scored)
            st.report.load_carrying = carrying / len(scored)
        summary.subjects.append(st.report)
    summary.seconds = time.perf_counter() - start
    return summary


def load_tasks(dataset, subjects: Sequence[str] | None = None, spec: PromptSpec = DEFAULT_SPEC,
               sample_count: int | None = DEFAULT_SAMPLE_COUNT, seed: int = DEFAULT_SEED
               ) -> dict[str, list[Task]]:
    """``{subject: tasks}`` of a dataset (folder, file or hub name; see
    :func:`sphyr_jax.data.datasets.load_subject`); all subjects present when
    ``subjects`` is None."""
    names = list(subjects) if subjects else dataset_subjects(dataset)
    return {s: subject_tasks(load_subject(dataset, s), s, spec, sample_count, seed)
            for s in names}


def evaluate(model, *, results_root, dataset=None, subjects: Sequence[str] | None = None,
             spec: PromptSpec = DEFAULT_SPEC, sample_count: int | None = DEFAULT_SAMPLE_COUNT,
             seed: int = DEFAULT_SEED, replay_from=None, backend_options: dict | None = None,
             **run_options) -> RunSummary:
    """Run a model on SPhyR subjects and store its scored answers (the library call).

    Turns float64 on before any work (the scoring needs it).

    Args:
        model: a spec string for :func:`~sphyr_jax.evaluation.backends.make_backend`
            (an OpenAI-compatible model name, ``baseline:<kind>``,
            ``checkpoint:<dir>``, ``python:<module>:<function>``), a
            :class:`~sphyr_jax.evaluation.backends.Backend`, or any callable
            ``prompt -> text``.
        results_root: results go to ``<results_root>/<model><suffix>/``.
        dataset: dataset folder, subject file or hub name (not with ``replay_from``).
        subjects: subject names (default: every subject present).
        spec: prompt style, template, rotations, few-shot count (not with
            ``replay_from``, whose prompts are stored).
        sample_count: samples per subject after the published shuffle (None: all).
        seed: the shuffle's seed (42: the published order).
        replay_from: a stored run's folder: ask its prompts, score against its
            answers; the new folder takes its suffix.
        backend_options: options for ``make_backend`` (``base_url``, ``timeout`` ...).
        **run_options: see :func:`run_tasks` (``concurrency``, ``policy``,
            ``cache``, ``progress``, ``log`` ...).

    Returns:
        The :class:`RunSummary`.

    Example::

        from sphyr_jax.data import embedded
        from sphyr_jax.evaluation.harness import evaluate

        summary = evaluate("qwen2.5:7b", dataset=embedded("dataset"), results_root="results",
                           backend_options={"base_url": "http://127.0.0.1:11434/v1"})
        print(summary.table())
    """
    enable_x64()  # an entry point: float64 before any work
    if isinstance(model, str):
        backend = make_backend(model, **(backend_options or {}))
    else:
        backend = as_backend(model)
    if replay_from is not None:
        if spec != DEFAULT_SPEC:
            raise UserInputError("replayed runs use their stored prompts: drop the prompt "
                                 "style, template, rotations and few-shot options")
        folder = pathlib.Path(replay_from)
        names = list(subjects) if subjects else replay_subjects(folder)
        if not names:
            raise UserInputError(f"{folder}: no <subject>_results.json files")
        tasks = {}
        for s in names:
            path = folder / f"{s}{RESULTS_SUFFIX}"
            if not path.is_file():
                raise UserInputError(f"{folder}: no stored results for subject {s!r}")
            tasks[s] = replay_tasks(path, sample_count)
        suffix = replay_suffix(folder)
    else:
        if dataset is None:
            raise UserInputError("evaluate needs a dataset (or replay_from)")
        tasks = load_tasks(dataset, subjects, spec, sample_count, seed)
        suffix = spec.suffix
    out = results_folder(results_root, backend.name, suffix)
    return asyncio.run(run_tasks(backend, tasks, out, **run_options))
