"""The feedback experiment: revisions that see the simulation's verdict, against resampling.

``mode="feedback"``: each sample is one episode with ``rounds`` revisions: the
model answers, is shown the verdict of the simulation (carried the load or
not, stiffness against the best design, material against the budget,
isolated pieces; :func:`sphyr_jax.rl.feedback.verdict`) with the grid and its
previous answer, and answers again.  ``mode="resample"`` is the control: the
same number of independent attempts at the original prompt.  Taking the best
of several noisy attempts beats one attempt whether or not the attempts learn
anything, so only the difference between the two modes says whether the
verdict helped.

Episodes run round by round through the environment's episode logic
(:class:`sphyr_jax.rl.environment.Episode`): a round's prompts go to the
backend concurrently, its answers are scored in one batch.  Outputs (written
atomically after every round): ``<stem>_trajectories.jsonl`` (one episode per
line, every round's prompt, answer and metrics) and the per-round table,
``<stem>_rounds.json`` and ``<stem>_rounds.md`` (mean topology score,
load-carrying share, valid share, mean best score so far).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Literal

from sphyr_jax.errors import UserInputError
from sphyr_jax.io import atomic_write_json, atomic_write_text
from sphyr_jax.rl.environment import Episode
from sphyr_jax.rl.feedback import verdict
from sphyr_jax.rl.samples import Sample
from sphyr_jax.runtime import enable_x64
from sphyr_jax.scoring.records import completion_text, score_records
from sphyr_jax.topopt.optimum import OptimumCache

Mode = Literal["feedback", "resample"]
MODES: tuple[Mode, ...] = ("feedback", "resample")
Backend = Callable[[str], object]  # prompt -> answer text (or an awaitable of it)


@dataclasses.dataclass
class ExperimentResult:
    """Trajectories and the per-round table of one experiment.

    Attributes:
        mode: ``"feedback"`` or ``"resample"``.
        rounds: revisions (or extra attempts) after the first answer.
        trajectories: one dict per episode (``subject``, ``sample_index``,
            ``record_index``, ``mode``, ``rounds``, ``trajectory``: one entry per round).
        table: one row per round (``round``, ``episodes``,
            ``mean_topology_score``, ``load_carrying_share``, ``valid_share``,
            ``mean_best_so_far``).
    """

    mode: str
    rounds: int
    trajectories: list[dict]
    table: list[dict]

    def as_dict(self) -> dict:
        """The table as JSON (no trajectories)."""
        return {"mode": self.mode, "rounds": self.rounds, "episodes": len(self.trajectories),
                "table": self.table}

    def markdown(self) -> str:
        """The per-round table in Markdown."""
        lines = [f"{self.mode}: {len(self.trajectories)} episodes, {self.rounds} rounds after "
                 "the first answer", "",
                 "| round | episodes | mean topology score | load carrying | valid grid | "
                 "mean best so far |", "|---|---|---|---|---|---|"]
        for row in self.table:
            lines.append(f"| {row['round']} | {row['episodes']} | "
                         f"{row['mean_topology_score']:.3f} | "
                         f"{100 * row['load_carrying_share']:.0f}% | "
                         f"{100 * row['valid_share']:.0f}% | {row['mean_best_so_far']:.3f} |")
        return "\n".join(lines) + "\n"


def round_table(trajectories: Sequence[dict], rounds: int) -> list[dict]:
    """Per-round means over the episodes that reached each round."""
    table = []
    for r in range(rounds + 1):
        steps = [t["trajectory"][: r + 1] for t in trajectories if len(t["trajectory"]) > r]
        n = len(steps)
        if not n:
            continue
        table.append({
            "round": r,
            "episodes": n,
            "mean_topology_score": sum(s[-1]["reward"] for s in steps) / n,
            "load_carrying_share": sum(bool(s[-1]["load_carrying"]) for s in steps) / n,
            "valid_share": sum(bool(s[-1]["valid_grid"]) for s in steps) / n,
            "mean_best_so_far": sum(max(e["reward"] for e in s) for s in steps) / n,
        })
    return table


async def _ask(backend: Backend, prompts: Sequence[str], limit: int) -> list[tuple[str, str]]:
    """(answer, error) per prompt; a backend that fails gives an empty answer and the error."""
    gate = asyncio.Semaphore(max(1, int(limit)))

    async def one(prompt: str) -> tuple[str, str]:
        async with gate:
            try:
                out = backend(prompt)
                if inspect.isawaitable(out):
                    out = await out
            except UserInputError:  # the user's mistake (an unreachable endpoint): stop
                raise
            except Exception as exc:  # a backend's failure is one invalid answer
                return "", f"{type(exc).__name__}: {exc}"
            return (out if isinstance(out, str) else completion_text(out)), ""

    return await asyncio.gather(*(one(p) for p in prompts))


def _write(directory: pathlib.Path, stem: str, result: ExperimentResult) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(directory / f"{stem}_trajectories.jsonl", "".join(
        json.dumps(t, allow_nan=False, ensure_ascii=False) + "\n" for t in result.trajectories))
    atomic_write_json(directory / f"{stem}_rounds.json", result.as_dict())
    atomic_write_text(directory / f"{stem}_rounds.md", result.markdown())


async def arun_feedback_experiment(
    backend: Backend,
    samples: Sequence[Sample],
    *,
    rounds: int = 3,
    mode: Mode = "feedback",
    output_dir: str | os.PathLike | None = None,
    stem: str | None = None,
    cache: OptimumCache | None = None,
    scorer=None,
    max_concurrency: int = 8,
) -> ExperimentResult:
    """Async :func:`run_feedback_experiment` (for callers already inside an event loop)."""
    enable_x64()  # an entry point: float64 before any work
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be a non-negative integer, got {rounds!r}")
    if scorer is None:
        scorer = functools.partial(
            score_records, cache=cache if cache is not None else OptimumCache())
    samples = list(samples)
    if stem is None:
        subjects = {s.subject for s in samples}
        stem = subjects.pop() if len(subjects) == 1 else "episodes"
    directory = pathlib.Path(output_dir) if output_dir is not None else None
    trajectories = [{"subject": s.subject, "sample_index": s.index,
                     "record_index": s.record_index, "rotation_count": s.rotation_count,
                     "mode": mode, "rounds": rounds, "trajectory": []} for s in samples]
    episodes = [Episode(s, rounds if mode == "feedback" else 0) for s in samples]
    result = ExperimentResult(mode, rounds, trajectories, [])
    for r in range(rounds + 1):
        if mode == "resample" and r:
            episodes = [Episode(s) for s in samples]  # a fresh, independent attempt
        prompts = [e.prompt for e in episodes]
        answers = await _ask(backend, prompts, max_concurrency)
        metrics = scorer([e.answer_record(a) for e, (a, _) in zip(episodes, answers, strict=True)])
        for e, t, prompt, (answer, error), m in zip(episodes, trajectories, prompts, answers,
                                                     metrics, strict=True):
            obs = e.record(answer, m)
            t["trajectory"].append({
                "round": r, "prompt": prompt, "completion": answer, "error": error or None,
                "reward": obs["reward"], "valid_grid": obs["valid_grid"],
                "load_carrying": bool(m.get("load_carrying")),
                "topology_score": m.get("topology_score"),
                "structural_efficiency": m.get("structural_efficiency"),
                "material_efficiency": m.get("material_efficiency"),
                "volume_ratio": m.get("volume_ratio"),
                "isolated_clusters_count": m.get("isolated_clusters_count"),
                "verdict": verdict(m, e.sample.shape), "metrics": m,
            })
        result.table = round_table(trajectories, rounds)
        if directory is not None:
            _write(directory, stem, result)
    return result


def run_feedback_experiment(
    backend: Backend,
    samples: Sequence[Sample],
    *,
    rounds: int = 3,
    mode: Mode = "feedback",
    output_dir: str | os.PathLike | None = None,
    stem: str | None = None,
    cache: OptimumCache | None = None,
    scorer=None,
    max_concurrency: int = 8,
) -> ExperimentResult:
    """Run the feedback experiment (or its ``resample`` control) on some samples.

    Turns float64 on before any work (the scoring needs it).

    Args:
        backend: the model, ``prompt -> answer``; sync or async, returning
            text or chat messages.  An exception counts as an empty (invalid)
            answer and is recorded in the trajectory.
        samples: the samples (:func:`sphyr_jax.rl.samples.build_samples`),
            one episode each.
        rounds: revisions (``feedback``) or extra independent attempts
            (``resample``) after the first answer.
        mode: ``"feedback"`` or ``"resample"``.
        output_dir: where the trajectories and the table are written
            (atomically, after every round); None: nothing is written.
        stem: file-name stem (default: the samples' subject).
        cache: optimum cache of the default scorer.
        scorer: ``scorer(records) -> metrics dicts`` (default:
            :func:`~sphyr_jax.scoring.records.score_records` with ``cache``).
        max_concurrency: backend calls in flight at once (async backends).

    Returns:
        An :class:`ExperimentResult`.
    """
    return asyncio.run(arun_feedback_experiment(
        backend, samples, rounds=rounds, mode=mode, output_dir=output_dir, stem=stem,
        cache=cache, scorer=scorer, max_concurrency=max_concurrency))
