"""The episode state machine of the SPhyR environment, independent of any server.

An episode is one masked sample.  :meth:`TopologyEnvironment.reset` serves the
next sample of the configured subject (shuffled once with
``random.Random(seed)``, seed 42 by default, served in order and wrapping) and
:meth:`TopologyEnvironment.step` scores the submitted grid.  With
``feedback_rounds=K`` the first K steps are revisions: the episode is not
done, the dataset answer is withheld, and the next prompt shows the
simulation's verdict in plain words (:mod:`sphyr_jax.rl.feedback`) with the
original grid and the previous answer; the step after the K-th revision ends
the episode.  Every ``reset`` option is remembered until changed.

Observations are plain dicts with the published environment's field names
(``prompt``, ``grid``, ``subject``, ``sample_index``, ``rows``, ``cols``,
``cell_values``, ``masked_cells``, ``rotation_count``; after a step
``completion``, ``ground_truth``, ``valid_grid``, ``metrics``; and ``reward``,
``done``).  Scoring is a callable ``scorer(records) -> metrics`` so a server can
batch it across sessions; by default :func:`sphyr_jax.scoring.records.score_records`
(an answer's record is :meth:`Episode.answer_record`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import pathlib
import re
import threading
import uuid
from collections.abc import Callable, Sequence

from sphyr_jax.data.datasets import list_subjects, load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.prompts import DEFAULT_SEED, STYLES, PromptSpec
from sphyr_jax.io import read_json
from sphyr_jax.problem.grids import extract_grid, grid_to_text
from sphyr_jax.rl.feedback import revision_prompt
from sphyr_jax.rl.reward import reward_of
from sphyr_jax.rl.samples import Sample, build_samples, replay_samples
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.records import completion_text, score_records
from sphyr_jax.topopt.optimum import OptimumCache

DEFAULT_SUBJECT = "1_random_cell_easy"
MAX_FEEDBACK_ROUNDS = 16
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")

Scorer = Callable[[Sequence[dict]], list[dict]]
"""``scorer(records) -> metrics``: one metrics dict per answer record (see
:func:`sphyr_jax.scoring.records.score_records`)."""


class EpisodeError(UserInputError):
    """A request the environment cannot serve (the message says why)."""


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """What ``reset`` serves: the subject and how its prompts are made.

    Attributes mirror the ``reset`` options of the same names.
    """

    subject: str = DEFAULT_SUBJECT
    sample_count: int | None = None
    rotation_count: int = 0
    few_shot_count: int = 0
    prompt_style: str = "default"
    replay_from: str | None = None
    seed: int = DEFAULT_SEED

    def spec(self) -> PromptSpec:
        """The prompt configuration (a style name, or a template with ``{GRID}``)."""
        if self.prompt_style in STYLES:
            return PromptSpec(style=self.prompt_style, rotations=self.rotation_count,
                              few_shot=self.few_shot_count)
        return PromptSpec(template=self.prompt_style, rotations=self.rotation_count,
                          few_shot=self.few_shot_count)


class SampleLibrary:
    """The samples every session serves, loaded once and shared (thread-safe).

    Args:
        dataset_dir: dataset folder (or hub name) the subjects are read from.
        results_root: folder of stored runs that ``replay_from`` may name
            (None: replaying is off).
        max_tasks: task configurations kept built at once (least recent dropped).
    """

    def __init__(self, dataset_dir, results_root=None, max_tasks: int = 64):
        self.dataset_dir = os.fspath(dataset_dir)
        self.results_root = pathlib.Path(results_root) if results_root else None
        self.max_tasks = max(1, int(max_tasks))
        self._records: dict[str, list[dict]] = {}
        self._tasks: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def records(self, subject: str) -> list[dict]:
        """The records of one subject (loaded on first use)."""
        with self._lock:
            if subject not in self._records:
                self._records[subject] = load_subject(self.dataset_dir, subject)
            return self._records[subject]

    def samples(self, task: TaskConfig) -> list[Sample]:
        """The samples of a task configuration, in serving order (built on first use)."""
        with self._lock:
            if task in self._tasks:
                self._tasks.move_to_end(task)
                return self._tasks[task]
        built = self._replay(task) if task.replay_from else build_samples(
            self.records(task.subject), task.subject, task.spec(), task.sample_count, task.seed)
        if not built:
            raise EpisodeError(f"subject {task.subject!r} has no samples to serve")
        with self._lock:
            self._tasks[task] = built
            while len(self._tasks) > self.max_tasks:
                self._tasks.popitem(last=False)
        return built

    def _replay(self, task: TaskConfig) -> list[Sample]:
        if self.results_root is None:
            raise EpisodeError("replay_from needs a server started with a results root")
        path = self.results_root / task.replay_from / f"{task.subject}_results.json"
        if not path.is_file():
            raise EpisodeError(f"no stored run {task.replay_from!r} of {task.subject!r}")
        records = read_json(path)
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise EpisodeError(f"stored run {task.replay_from!r} of {task.subject!r} "
                               "is not a list of records")
        samples = replay_samples(records, task.subject, task.replay_from)
        return samples[: task.sample_count] if task.sample_count else samples


def _integer(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EpisodeError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise EpisodeError(f"{name} must be {bounds}, got {value}")
    return value


@dataclasses.dataclass
class Episode:
    """One sample answered once, then revised up to ``feedback_rounds`` times.

    Attributes:
        sample: the sample.
        feedback_rounds: revisions allowed after the first answer.
        attempts: answers scored so far.
        prompt: what the model is shown next (the sample's prompt, then the
            revision prompts).
    """

    sample: Sample
    feedback_rounds: int = 0
    attempts: int = 0
    prompt: str = ""

    def __post_init__(self):
        self.prompt = self.prompt or self.sample.prompt

    @property
    def done(self) -> bool:
        """Whether every allowed answer has been given."""
        return self.attempts > self.feedback_rounds

    def answer_record(self, answer: str) -> dict:
        """The record an answer to this sample is scored as."""
        s = self.sample
        return {"completion": answer, "ground_truth": s.ground_truth,
                "input_grid": s.input_grid, "gravity_dir": s.gravity_dir}

    def task_fields(self) -> dict:
        """The observation fields describing the sample."""
        s = self.sample
        return {"subject": s.subject, "sample_index": s.index, "rows": s.rows, "cols": s.cols,
                "cell_values": s.cell_values, "masked_cells": s.masked_cells,
                "rotation_count": s.rotation_count}

    def start(self) -> dict:
        """The observation that opens the episode."""
        return {**_EMPTY, "prompt": self.prompt, "grid": self.sample.input_grid,
                **self.task_fields(), "reward": 0.0, "done": False}

    def record(self, answer: str, metrics: dict) -> dict:
        """Advance with a scored answer; the observation that follows it."""
        if self.done:
            raise EpisodeError("the episode is over; call reset() for the next sample")
        self.attempts += 1
        obs = {**_EMPTY, **self.task_fields(), "completion": answer,
               "valid_grid": bool(metrics.get("valid_output_grid")), "metrics": metrics,
               "reward": reward_of(metrics), "done": self.done}
        if self.done:
            obs["ground_truth"] = self.sample.ground_truth
            self.prompt = ""
        else:  # a revision is allowed: the verdict, the grid again, no answer
            self.prompt = revision_prompt(self.sample, _shown_answer(answer), metrics)
            obs["prompt"] = self.prompt
            obs["grid"] = self.sample.input_grid
        return obs


_EMPTY = dict.fromkeys(("prompt", "grid", "subject", "sample_index", "rows", "cols",
                        "cell_values", "masked_cells", "rotation_count", "completion",
                        "ground_truth", "valid_grid", "metrics"))
OBSERVATION_FIELDS = tuple(_EMPTY) + ("reward", "done")
PREVIOUS_ANSWER_CHARS = 2_000


def _shown_answer(answer: str) -> str:
    """The previous answer as a revision prompt shows it: its grid, else its text (shortened)."""
    grid = extract_grid(completion_text(answer))
    if grid is not None:
        return grid_to_text(grid)
    text = completion_text(answer).strip()
    if len(text) > PREVIOUS_ANSWER_CHARS:
        text = text[:PREVIOUS_ANSWER_CHARS] + " [...]"
    return text or "(empty)"


class TopologyEnvironment:
    """Episodes of one session: ``reset`` serves a sample, ``step`` scores an answer.

    Args:
        library: the shared samples (or a dataset folder to build one from).
        scorer: ``scorer(records) -> list of metrics dicts``, as
            :func:`~sphyr_jax.scoring.records.score_records` (default: that
            function with ``cache``).
        cache: the optimum cache of the default scorer.
        **defaults: initial ``reset`` options (``subject``, ``sample_count``...).
    """

    def __init__(self, library: SampleLibrary | str | os.PathLike, scorer: Scorer | None = None,
                 cache: OptimumCache | None = None, **defaults):
        enable_x64()  # an entry point: float64 before any work
        self.library = library if isinstance(library, SampleLibrary) else SampleLibrary(library)
        if scorer is None:
            scorer = functools.partial(
                score_records, cache=cache if cache is not None else OptimumCache())
        self.scorer = scorer
        self.task = TaskConfig()
        self.feedback_rounds = 0
        self.task, self.feedback_rounds = self._configure(**defaults)
        self.cursor = 0
        self.episode: Episode | None = None
        self.episode_id: str | None = None
        self.step_count = 0
        self._built: TaskConfig | None = None

    def _configure(self, subject=None, sample_count=None, rotation_count=None,
                   few_shot_count=None, prompt_style=None, feedback_rounds=None,
                   replay_from=None, seed=None) -> tuple[TaskConfig, int]:
        """The task and feedback rounds after applying ``reset`` options (checked)."""
        changes = {}
        if subject is not None:
            if not isinstance(subject, str) or subject not in list_subjects():
                raise EpisodeError(f"unknown subject {subject!r}; subjects: {list_subjects()}")
            changes["subject"] = subject
        if sample_count is not None:
            changes["sample_count"] = _integer("sample_count", sample_count, 1)
        if rotation_count is not None:
            changes["rotation_count"] = _integer("rotation_count", rotation_count, 0, 3)
        if few_shot_count is not None:
            changes["few_shot_count"] = _integer("few_shot_count", few_shot_count, 0, 16)
        if prompt_style is not None:
            if not isinstance(prompt_style, str) or (
                    prompt_style not in STYLES and "{GRID}" not in prompt_style):
                raise EpisodeError(f"prompt_style must be one of {list(STYLES)} or a template "
                                   f"with a {{GRID}} placeholder, got {prompt_style!r}")
            changes["prompt_style"] = prompt_style
        if replay_from == "":
            changes["replay_from"] = None  # back to the dataset
        elif replay_from is not None:
            if not isinstance(replay_from, str) or not _NAME.fullmatch(replay_from) or (
                    ".." in replay_from):
                raise EpisodeError(f"replay_from must name a stored run (a folder name), "
                                   f"got {replay_from!r}")
            changes["replay_from"] = replay_from
        if seed is not None:
            changes["seed"] = _integer("seed", seed, 0)
        rounds = self.feedback_rounds if feedback_rounds is None else _integer(
            "feedback_rounds", feedback_rounds, 0, MAX_FEEDBACK_ROUNDS)
        return dataclasses.replace(self.task, **changes), rounds

    def reset(self, subject=None, sample_index=None, sample_count=None, rotation_count=None,
              few_shot_count=None, prompt_style=None, feedback_rounds=None, replay_from=None,
              seed=None, episode_id=None) -> dict:
        """Start an episode on the next sample (or on ``sample_index``).

        Every option left as None keeps its current value; changing any of
        the task options (or passing ``seed``) rebuilds the sample order and
        serves from its start.

        Args:
            subject: the subject to serve, e.g. ``"full_hard"``.
            sample_index: serve this position of the order instead of the next.
            sample_count: serve the first N samples of the order (None: all).
            rotation_count: clockwise quarter turns of the samples (0-3).
            few_shot_count: solved examples shown in each prompt.
            prompt_style: a style of :data:`sphyr_jax.evaluation.prompts.STYLES`
                or a template with a ``{GRID}`` placeholder.
            feedback_rounds: revisions after the first answer (0: one step).
            replay_from: a stored run (a folder under the results root) whose
                samples to serve, in its order (``""``: back to the dataset).
            seed: the shuffle's seed (default 42, the published order).
            episode_id: an identifier for the episode (default: a new UUID).

        Returns:
            The opening observation.

        Raises:
            EpisodeError: an unknown subject, an out-of-range index or a bad
                option; the environment keeps its previous state.
        """
        task, rounds = self._configure(subject, sample_count, rotation_count, few_shot_count,
                                       prompt_style, feedback_rounds, replay_from, seed)
        samples = self.library.samples(task)
        rebuilt = task != self._built or seed is not None
        cursor = 0 if rebuilt else self.cursor
        if sample_index is not None:
            cursor = _integer("sample_index", sample_index, 0, len(samples) - 1)
        cursor %= len(samples)
        self.task, self.feedback_rounds, self._built = task, rounds, task
        self.episode = Episode(samples[cursor], rounds)
        self.cursor = cursor + 1
        self.episode_id = episode_id if isinstance(episode_id, str) else str(uuid.uuid4())
        self.step_count = 0
        return self.episode.start()

    def pending(self, grid) -> dict:
        """The record of an answer to the current episode (checks it may be given)."""
        if self.episode is None:
            raise EpisodeError("no episode: call reset() first")
        if self.episode.done:
            raise EpisodeError("the episode is over; call reset() for the next sample")
        if not isinstance(grid, str):
            raise EpisodeError(f"an answer is text, got {type(grid).__name__}")
        return self.episode.answer_record(grid)

    def complete(self, grid: str, metrics: dict) -> dict:
        """Advance the episode with an answer's metrics; the next observation."""
        obs = self.episode.record(grid, metrics)
        self.step_count += 1
        return obs

    def step(self, grid: str) -> dict:
        """Score an answer to the current sample (raw model text: prose and fences are fine).

        Returns:
            The observation: metrics and reward, and either the answer
            (``done``) or the revision prompt.

        Raises:
            EpisodeError: no episode, or the episode is over.
        """
        record = self.pending(grid)
        return self.complete(grid, self.scorer([record])[0])

    @property
    def state(self) -> dict:
        """``episode_id``, ``step_count``, ``subject``, ``sample_index``, ``sample_count``."""
        served = self.episode.sample if self.episode else None
        count = len(self.library.samples(self._built)) if self._built else None
        return {"episode_id": self.episode_id, "step_count": self.step_count,
                "subject": self.task.subject, "sample_index": served.index if served else None,
                "sample_count": count}
