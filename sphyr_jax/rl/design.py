"""A design episode with a simulation tool, for agent trainers (TRL's ``environment_factory``).

:class:`DesignEnvironment` holds one sample at a time.  ``reset(**row)``
starts an episode from a dataset row (the columns of
:func:`~sphyr_jax.rl.prompt_dataset`, or the ``label`` / ``reward_model`` of
an exported row); the model may then call the tool ``simulate(grid)`` as many
times as the trainer allows: each call scores the grid by finite elements
and answers with the simulation's verdict in words (the same text the
feedback rounds show, :func:`sphyr_jax.rl.feedback.verdict`), never the
answer.  ``get_reward()`` is the reward of the last grid simulated (its
topology score, 0 for one that is not a complete grid, or 0 when nothing was
simulated).

The episode's state lives in the instance; every instance shares one
:class:`~sphyr_jax.rl.batching.BatchingScorer` and its optimum cache (the
class's, or one given), so each sample's optimum is computed once per
process.  Optima are computed in batches: the samples of every episode reset
since the last scoring call are optimised together at the first
``simulate`` after them (a sample whose row carries a stored optimum needs
none), and tool calls made at the same time from several threads are scored
in one call.

TRL usage::

    trainer = GRPOTrainer(model=..., train_dataset=prompt_dataset(..., conversational=True),
                          environment_factory=DesignEnvironment, reward_funcs=[])

TRL makes every public method but ``reset`` and ``get_reward`` a tool (from
its signature and docstring), so this class has exactly one: ``simulate``.
"""

from __future__ import annotations

import threading
import weakref

from sphyr_jax.rl.batching import BatchingScorer
from sphyr_jax.rl.feedback import verdict
from sphyr_jax.rl.reward import reward_of, row_record
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.records import optimum_fields


class _Shared:
    """The scorer every instance uses, and the samples waiting for their optima."""

    def __init__(self, scorer: BatchingScorer):
        self.scorer = scorer
        self._waiting: dict[str, dict] = {}
        self._lock = threading.Lock()

    def expect(self, record: dict) -> None:
        """Note a sample whose optimum the next scoring call should batch with others."""
        if record.get("optimum") is None:
            key = repr((record["ground_truth"], record.get("input_grid"),
                        record.get("gravity_dir")))
            with self._lock:
                self._waiting.setdefault(key, record)

    def score(self, record: dict) -> dict:
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        if len(waiting) > 1:  # one batched optimisation for every sample reset since
            self.scorer.run(optimum_fields, waiting, cache=self.scorer.cache)
        return self.scorer.score([record])[0]


class DesignEnvironment:
    """One design episode: ``reset(**row)``, the tool ``simulate(grid)``, ``get_reward()``.

    Args:
        scorer: the scorer to share (None: the class's, made on first use
            with an in-memory optimum cache; set ``DesignEnvironment.use(scorer)``
            to give every instance another one, e.g. with a folder-backed cache).

    Attributes:
        record: the sample being answered (its record fields), None before ``reset``.
        last_grid: the grid of the last ``simulate`` call (None: none yet).
        last_metrics: its metrics (every field of
            :func:`~sphyr_jax.scoring.records.score_records`).
        simulations: ``simulate`` calls in this episode.
    """

    _shared: _Shared | None = None
    _class_lock = threading.Lock()
    _by_scorer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, scorer: BatchingScorer | None = None):
        self._own = None if scorer is None else self._sharing(scorer)
        self.record: dict | None = None
        self.last_grid: str | None = None
        self.last_metrics: dict | None = None
        self.simulations = 0

    @classmethod
    def _sharing(cls, scorer: BatchingScorer) -> _Shared:
        """The one :class:`_Shared` of a scorer: instances given it share its waiting list."""
        with cls._class_lock:
            shared = cls._by_scorer.get(scorer)
            if shared is None:
                shared = cls._by_scorer[scorer] = _Shared(scorer)
            return shared

    @classmethod
    def use(cls, scorer: BatchingScorer | None) -> None:
        """Share ``scorer`` among the instances made without one (None: a fresh default)."""
        shared = None if scorer is None else cls._sharing(scorer)
        with cls._class_lock:
            cls._shared = shared

    def _scoring(self) -> _Shared:
        if self._own is not None:
            return self._own
        cls = type(self)
        with cls._class_lock:
            if cls._shared is None:
                enable_x64()  # an entry point: float64 before any work
                cls._shared = _Shared(BatchingScorer())
            return cls._shared

    def reset(self, **row) -> None:
        """Start an episode on a dataset row (the prompt is left as it is).

        Args:
            **row: the row's columns: ``ground_truth`` with ``input_grid``,
                ``gravity_dir``, ``subject`` and ``optimum``; or ``label``; or
                a veRL export's ``reward_model`` and ``extra_info``.  Other
                columns (``prompt``...) are ignored.

        Raises:
            ValueError: the row does not say which sample it is.
        """
        self.record = row_record(row)
        self.last_grid = None
        self.last_metrics = None
        self.simulations = 0
        self._scoring().expect(self.record)

    def simulate(self, grid: str) -> str:
        """Simulate a completed design under its load and describe what happened.

        Args:
            grid: The completed grid: the task grid with every 'V' cell
                filled, one row per line, cells separated by spaces.

        Returns:
            The simulation's verdict in words: whether the design carried the
            load, how stiff it is against the best design for its material
            budget, how much material it used and whether pieces float free.
        """
        if self.record is None:
            raise RuntimeError("no episode: reset() first")
        if not isinstance(grid, str):
            raise TypeError(f"grid must be text, got {type(grid).__name__}")
        metrics = self._scoring().score({**self.record, "completion": grid})
        self.last_grid, self.last_metrics = grid, metrics
        self.simulations += 1
        return verdict(metrics, _shape(self.record["ground_truth"]))

    def get_reward(self) -> float:
        """The reward of the last grid simulated (0 when nothing was simulated)."""
        return 0.0 if self.last_metrics is None else reward_of(self.last_metrics)


def _shape(answer) -> tuple[int, int] | None:
    """(rows, cols) of a 2D answer (None for voxels or anything unreadable)."""
    rows = answer.strip().split("\n") if isinstance(answer, str) else answer
    if not rows or any(isinstance(row, str) and not row.strip() for row in rows):
        return None
    first = rows[0].split() if isinstance(rows[0], str) else rows[0]
    return (len(rows), len(first)) if isinstance(first, (list, tuple)) and first and all(
        isinstance(t, str) for t in first) else None
