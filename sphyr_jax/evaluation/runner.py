"""Running an evaluation's tasks: ask the model, store every answer, score them in batches.

:func:`run_tasks` keeps up to ``concurrency`` model calls in flight (a fixed
pool of workers over one queue, subject after subject; each call retried by
a :class:`~sphyr_jax.evaluation.retry.RetryPolicy`).  A sample that still
fails is reported (:attr:`RunSummary.failures`) and never stored, so the next
run asks it again.  Answers are scored in batches as they arrive
(:func:`sphyr_jax.scoring.records.score_records`, in a worker thread while
calls go on), each with the masked grid of its task.

*Nothing lost.*  Every answer is written the moment it arrives (unscored),
and again with its metrics once scored; writes are atomic (a temporary file
renamed over the old one), coalesced while one is under way, so a process
killed at any instant loses at most the answers of calls still in flight.  A
rerun reads the file back, skips every stored sample (its prompt and answer:
two samples may share a prompt), scores stored records that have no metrics
yet, and asks only what is missing.  A second process on the same folder is
refused (:func:`sphyr_jax.io.exclusive_lock` on ``.evaluate.lock``, removed
when the run ends).

Three loops share the event loop: the askers (:class:`_Asker`), the scorer
(:class:`_Scorer`) and the writer (:class:`_Writer`); :class:`_Subject` holds
one results file's records while they fill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import random
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence

from sphyr_jax.evaluation.backends import Backend, BackendError
from sphyr_jax.evaluation.retry import DEFAULT_POLICY, RetryPolicy, SampleFailed, ask
from sphyr_jax.evaluation.storage import SCORED_FIELD, encode_record, file_text, make_record
from sphyr_jax.evaluation.tasks import Task
from sphyr_jax.io import (
    CorruptFileError,
    atomic_write_json,
    atomic_write_text,
    exclusive_lock,
    read_json,
)
from sphyr_jax.scoring.records import score_records
from sphyr_jax.scoring.results import AGGREGATED_SUFFIX, RESULTS_SUFFIX, aggregate, read_results
from sphyr_jax.topopt.optimum import OptimumCache

DEFAULT_SCORE_BATCH = 64  # answers gathered before a scoring batch starts
DEFAULT_SCORE_WAIT = 10.0  # seconds an answer waits for its batch to fill
LOCK_FILE = ".evaluate.lock"


async def run_sample(backend: Backend, task: Task, policy: RetryPolicy = DEFAULT_POLICY,
                     model: str | None = None, **ask_options) -> dict:
    """Prompt -> completion (with retries) -> unscored record; raises
    :class:`~sphyr_jax.evaluation.retry.SampleFailed`."""
    completion = await ask(backend, task.query, policy, **ask_options)
    return make_record(task, completion, model or backend.name)


def _score(records: Sequence[dict], grids: Sequence, cache: OptimumCache, *,
           design_efficiency: bool = False, num_devices: int | None = None) -> list[dict]:
    """Every metric field of results records, in one batched call.

    ``grids`` holds each record's masked grid when its task is known (it is the
    prompt's last grid, so scoring need not read it back from the prompt), else
    None; a record's own ``input_grid`` still wins
    (:func:`~sphyr_jax.scoring.records.record_item`).
    """
    view = [r if g is None or r.get("input_grid") is not None else {**r, "input_grid": g}
            for r, g in zip(records, grids, strict=True)]
    return score_records(view, cache=cache, design_efficiency=design_efficiency,
                         num_devices=num_devices)


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
    """The records of one subject's results file while a run fills it.

    ``slots`` holds the record of each task (None: not answered yet),
    ``extra`` the stored records of samples this run does not ask; files are
    written newest-first only (``version`` is bumped on every change,
    ``written`` is the version on disk).
    """

    def __init__(self, subject: str, tasks: Sequence[Task], folder: pathlib.Path):
        self.name = subject
        self.tasks = list(tasks)
        self.path = folder / f"{subject}{RESULTS_SUFFIX}"
        self.aggregated_path = folder / f"{subject}{AGGREGATED_SUFFIX}"
        self.slots: list[dict | None] = [None] * len(self.tasks)
        self.extra: list[dict] = []
        self.report = SubjectReport(subject, str(self.path), len(self.tasks))
        self.version = 0
        self.written = 0
        self.unscored = 0
        self._encoded: dict[int, str] = {}  # id(record) -> its JSON text
        self._position: dict[int, int] = {}  # id(record) -> its task

    def records(self) -> list[dict]:
        return [r for r in self.slots if r is not None] + self.extra

    def place(self, position: int, record: dict) -> None:
        """Put the record of task ``position`` in its slot."""
        self.slots[position] = record
        self._position[id(record)] = position

    def masked_grid(self, record: dict):
        """The masked grid of the record's task (None for a record of no task)."""
        position = self._position.get(id(record))
        return None if position is None else self.tasks[position].query.input_grid

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
        return file_text(pieces)

    def missing(self) -> list[int]:
        return [i for i, r in enumerate(self.slots) if r is None]

    def load(self, optimum: str) -> tuple[list[dict], str | None]:
        """Read the stored file; returns (records needing scores, previous yardstick)."""
        if not self.path.exists():
            return [], None
        stored = read_results(self.path)
        free: dict[tuple, deque] = defaultdict(deque)  # two samples may share a prompt
        for task in self.tasks:
            free[(task.prompt, task.ground_truth)].append(task.position)
        for record in stored:
            positions = free.get((record.get("prompt"), record.get("ground_truth")))
            if positions:
                self.place(positions.popleft(), record)
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


@dataclasses.dataclass(frozen=True)
class _Settings:
    """What a run was asked to do (fixed for its life; see :func:`run_tasks`)."""

    model: str
    cache: OptimumCache
    design_efficiency: bool
    num_devices: int | None
    score_batch_size: int
    score_wait: float
    progress: Callable | None
    log: Callable[[str], None] | None

    def report(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None and total > 0:
            self.progress(stage, done, total)


@dataclasses.dataclass
class _Counts:
    """What a run has done so far (event-loop thread only)."""

    to_ask: int = 0
    asked: int = 0
    retries: int = 0
    scored: int = 0
    batches: int = 0
    failures: list[Failure] = dataclasses.field(default_factory=list)


async def _wait(event: asyncio.Event, timeout: float | None) -> None:
    event.clear()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


class _Writer:
    """Writes the files of every changed subject, in a worker thread; an older
    snapshot never replaces a newer one."""

    def __init__(self, subjects: list[_Subject], yardstick: str):
        self.subjects = subjects
        self.yardstick = yardstick
        self.wake = asyncio.Event()  # bound to the running loop on first use
        self.done = False  # set when nothing will change any more
        self._lock = threading.Lock()

    def changed(self, st: _Subject) -> None:
        st.version += 1
        self.wake.set()

    def snapshot(self) -> list[tuple]:
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
                                    optimum=self.yardstick)
                jobs.append((st, st.version, st.text(), agg))
        return jobs

    def write(self, jobs: list[tuple]) -> None:
        """Write snapshots (any thread)."""
        with self._lock:
            for st, version, text, agg in jobs:
                if version <= st.written:
                    continue
                atomic_write_text(st.path, text)
                if agg is not None:
                    atomic_write_json(st.aggregated_path, agg, indent=2)
                st.written = version

    async def loop(self) -> None:
        while True:
            jobs = self.snapshot()
            if not jobs:
                if self.done:
                    return
                await _wait(self.wake, None)
                continue
            await asyncio.to_thread(self.write, jobs)


class _Scorer:
    """Scores answers in batches as they arrive: a batch starts when
    ``score_batch_size`` answers wait, when one has waited ``score_wait``
    seconds, or when asking is over; batches never hold more (few batch
    sizes: few compiled programs)."""

    def __init__(self, settings: _Settings, counts: _Counts, writer: _Writer):
        self.settings = settings
        self.counts = counts
        self.writer = writer
        self.pending: list[tuple[_Subject, dict]] = []
        self.since = 0.0  # when the oldest pending answer arrived
        self.wake = asyncio.Event()
        self.asking_done = False

    def add(self, st: _Subject, record: dict) -> None:
        if not self.pending:
            self.since = time.monotonic()
        self.pending.append((st, record))
        st.unscored += 1
        self.wake.set()

    def finish_asking(self) -> None:
        self.asking_done = True
        self.wake.set()

    async def loop(self) -> None:
        settings, counts = self.settings, self.counts
        while True:
            if not self.pending:
                if self.asking_done:
                    return
                await _wait(self.wake, None)
                continue
            if len(self.pending) < settings.score_batch_size and not self.asking_done:
                left = self.since + settings.score_wait - time.monotonic()
                if left > 0:
                    await _wait(self.wake, left)
                    continue
            batch = self.pending[: settings.score_batch_size]
            del self.pending[: len(batch)]
            if self.pending:
                self.since = time.monotonic()
            metrics = await asyncio.to_thread(
                _score, [r for _, r in batch], [st.masked_grid(r) for st, r in batch],
                settings.cache, design_efficiency=settings.design_efficiency,
                num_devices=settings.num_devices)
            for (st, record), fields in zip(batch, metrics, strict=True):
                st.forget(record)
                record.update(fields)
                st.unscored -= 1
                self.writer.changed(st)
            counts.scored += len(batch)
            counts.batches += 1
            waiting = len(self.pending) + (counts.to_ask - counts.asked)
            settings.report("scored", counts.scored, counts.scored + waiting)


class _Asker:
    """Asks the model every missing sample (a pool of workers over one queue);
    an answer is stored and queued for scoring, a failure reported."""

    def __init__(self, backend: Backend, policy: RetryPolicy, rng: random.Random,
                 settings: _Settings, counts: _Counts, scorer: _Scorer, writer: _Writer):
        self.backend = backend
        self.policy = policy
        self.rng = rng
        self.settings = settings
        self.counts = counts
        self.scorer = scorer
        self.writer = writer

    def on_retry(self, exc: BackendError, wait: float) -> None:
        self.counts.retries += 1
        if self.settings.log is not None and self.counts.retries <= 3:
            self.settings.log(f"retrying in {wait:.1f} s: {exc}")

    def fail(self, st: _Subject, position: int, exc: SampleFailed) -> None:
        task = st.tasks[position]
        self.counts.failures.append(Failure(st.name, position, task.query.index,
                                            exc.attempts, str(exc)))
        st.report.failed += 1
        if self.settings.log is not None and len(self.counts.failures) == 1:
            self.settings.log(f"{st.name} sample {position} failed after {exc.attempts} "
                              f"attempts: {exc}")

    async def worker(self, queue: deque) -> None:
        while queue:
            st, position = queue.popleft()
            task = st.tasks[position]
            try:
                completion = await ask(self.backend, task.query, self.policy, rng=self.rng,
                                       on_retry=self.on_retry)
            except SampleFailed as exc:
                self.fail(st, position, exc)
            else:
                record = make_record(task, completion, self.settings.model)
                st.place(position, record)
                st.report.answered += 1
                self.writer.changed(st)
                self.scorer.add(st, record)
            self.counts.asked += 1
            self.settings.report("answers", self.counts.asked, self.counts.to_ask)


async def _run(asker: _Asker, scorer: _Scorer, writer: _Writer, queue: deque,
               concurrency: int) -> None:
    """The three loops until every task is asked, scored and written (files are
    written last also on errors and cancellation)."""
    asker.settings.report("answers", 0, asker.counts.to_ask)  # the stage shows from its start
    workers = [asyncio.ensure_future(asker.worker(queue))
               for _ in range(min(concurrency, len(queue)))]
    scoring = asyncio.ensure_future(scorer.loop())
    writing = asyncio.ensure_future(writer.loop())
    try:
        await asyncio.gather(*workers)
        scorer.finish_asking()
        await scoring
        writer.done = True
        writer.wake.set()
        await writing
    finally:
        pending = [t for t in (*workers, scoring, writing) if not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        writer.write(writer.snapshot())
        await asker.backend.aclose()


def _summary(settings: _Settings, counts: _Counts, subjects: list[_Subject], folder,
             yardstick: str) -> RunSummary:
    summary = RunSummary(model=settings.model, folder=str(folder), failures=counts.failures,
                         retries=counts.retries, scored=counts.scored,
                         score_batches=counts.batches, optimum=yardstick)
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
    return summary


async def run_tasks(backend: Backend, tasks: Mapping[str, Sequence[Task]], folder, *,
                    model: str | None = None, concurrency: int = 8,
                    policy: RetryPolicy = DEFAULT_POLICY, cache: OptimumCache | None = None,
                    design_efficiency: bool = False, num_devices: int | None = None,
                    score_batch_size: int = DEFAULT_SCORE_BATCH,
                    score_wait: float = DEFAULT_SCORE_WAIT, progress=None,
                    log: Callable[[str], None] | None = None, seed: int | None = None
                    ) -> RunSummary:
    """Ask, store and score every task not yet stored in ``folder`` (resumable).

    Args:
        backend: the model.
        tasks: ``{subject: tasks}`` (see :func:`~sphyr_jax.evaluation.tasks.subject_tasks`,
            :func:`~sphyr_jax.evaluation.tasks.replay_tasks`).
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
            batch size compiles once, so sizes stay few).
        score_wait: see ``score_batch_size``.
        progress: optional callable(stage, done, total).
        log: optional callable(str) for retries, failures and yardstick changes.
        seed: seed of the retry jitter (None: random).

    Returns:
        A :class:`RunSummary`; failed samples are in ``failures`` and not stored.

    Raises:
        CorruptFileError: a stored results file is not a list of records (it is
            left untouched).
        UserInputError: another run is writing the folder.
    """
    start = time.perf_counter()
    cache = cache if cache is not None else OptimumCache(num_devices=num_devices)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    settings = _Settings(model=model or backend.name, cache=cache,
                         design_efficiency=design_efficiency, num_devices=num_devices,
                         score_batch_size=max(1, int(score_batch_size)),
                         score_wait=float(score_wait), progress=progress, log=log)
    with exclusive_lock(folder / LOCK_FILE,
                        busy=f"{folder} is being written by another evaluate run"):
        subjects = [_Subject(name, subject_list, folder) for name, subject_list in tasks.items()]
        counts = _Counts()
        writer = _Writer(subjects, cache.yardstick)
        scorer = _Scorer(settings, counts, writer)
        for st in subjects:
            todo, previous = st.load(cache.yardstick)
            if previous is not None and log is not None:
                log(f"{st.path}: its figures came from the {previous!r} yardstick; "
                    f"rescoring with {cache.yardstick!r}")
            st.report.rescored = len(todo)
            for record in todo:
                scorer.add(st, record)
            if st.complete() and not st.aggregated_path.exists():
                st.version += 1  # write the aggregated file of a subject completed earlier
        scorer.since = time.monotonic()
        queue = deque((st, i) for st in subjects for i in st.missing())
        counts.to_ask = len(queue)
        asker = _Asker(backend, policy, random.Random(seed), settings, counts, scorer, writer)
        await _run(asker, scorer, writer, queue, max(1, int(concurrency)))
    summary = _summary(settings, counts, subjects, folder, cache.yardstick)
    summary.seconds = time.perf_counter() - start
    return summary
