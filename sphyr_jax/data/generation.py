"""What every SPhyR generator shares: candidates as load cases, their analysis, and the driver.

A generator version (the v1-style :mod:`~sphyr_jax.data.generate`, SPhyR-v2
:mod:`~sphyr_jax.data.generate_v2`) is a set of :class:`SamplingRules`: how one
candidate problem is drawn from a random stream, which candidates are refused
before they are solved, how a batch of candidates is solved, which solved
candidates are kept (in draw order, against the samples already kept), and
which files the kept samples make.  :func:`generate` is the one driver that
runs any of them:

1. draw candidates from the stream until the round is full (the rules say how
   many draws, or how many admitted candidates, make a round), refusing some
   by reason as they are drawn;
2. solve the round's candidates in one batch (a pure function of the
   candidates, so batches may be split or solved ahead of need);
3. judge the solved candidates in draw order, keeping or refusing each by
   reason, until enough samples are kept;
4. write every file of the set at once (nothing is written on failure).

A candidate is any object with the fields of :class:`Problem`; its load case
(:func:`candidate_load_case`: every non-load/support cell designable, load and
support cells solid, the candidate's budget) is the same for every version.
The random stream is an iterator of draws; :func:`draw_stream` is the one
used today, a single ``numpy.random.Generator`` seeded once, so the same seed
gives the same candidates in the same order.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import jax
import numpy as np

from sphyr_jax.data.datasets import list_subjects
from sphyr_jax.fem import fea
from sphyr_jax.io import commit_files
from sphyr_jax.problem.grids import LOAD, SUPPORT
from sphyr_jax.problem.loadcase import LoadCase, load_case_from_grid, with_budget
from sphyr_jax.sharding import batch_call

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: a generator's progress callback."""


class GenerationError(RuntimeError):
    """Generation that cannot keep enough samples within its attempt bound."""


class Problem(Protocol):
    """The fields every generator's candidate has (row 0 = top).

    Attributes:
        load_mask: (n, n) bool load cells.
        support_mask: (n, n) bool support cells (never on a load cell).
        gravity_dir: (row, col) load direction.
        volume_fraction: the material budget as a fraction of the whole grid
            (load and support cells included).
    """

    load_mask: np.ndarray
    support_mask: np.ndarray

    @property
    def gravity_dir(self) -> tuple[int, int]: ...

    @property
    def volume_fraction(self) -> float: ...


def candidate_tokens(candidate: Problem, values) -> list[list[str]]:
    """Token rows: ``L``/``S`` on the candidate's load and support cells, ``values`` elsewhere.

    Args:
        candidate: a drawn problem.
        values: (n, n) strings for the other cells.
    """
    grid = np.asarray(values, dtype=object).copy()
    grid[candidate.support_mask] = SUPPORT
    grid[candidate.load_mask] = LOAD
    return grid.tolist()


def design_tokens(candidate: Problem, design=None) -> list[list[str]]:
    """Token rows of a 0/1 design: ``"1"`` where it is at least 0.5, else ``"0"``; L/S tokens.

    Args:
        candidate: a drawn problem.
        design: (n, n) densities; None: every other cell ``"0"``.
    """
    design = np.zeros(candidate.load_mask.shape) if design is None else np.asarray(design)
    return candidate_tokens(candidate, np.where(design >= 0.5, "1", "0"))


def candidate_load_case(candidate: Problem) -> LoadCase:
    """Load case of a candidate: every non-L/S cell designable, L/S solid, its budget."""
    case = load_case_from_grid(design_tokens(candidate), gravity_dir=candidate.gravity_dir)
    return with_budget(case, candidate.volume_fraction)


def _analyze(load_case, densities):
    return fea.analyze(load_case, densities)


def analyze_designs(batch: LoadCase, designs, *, num_devices: int | None = None) -> fea.Analysis:
    """:func:`sphyr_jax.fem.fea.analyze` of a batch of designs, split over devices.

    Args:
        batch: (B, ...) load cases.
        designs: (B, n, n) densities.
        num_devices: devices the batch is split over (None: all local).
    """
    return batch_call(_analyze, batch, designs, num_devices=num_devices)


def device_name() -> str:
    """The first local device and the device count, as the summaries print them."""
    device = jax.devices()[0]
    return f"{device.platform}:{device.device_kind} x{jax.device_count()}"


@dataclasses.dataclass(frozen=True)
class Kept:
    """A kept sample: the candidate and the answer the rules' solver gave it."""

    candidate: Any
    answer: Any


@dataclasses.dataclass(frozen=True)
class RoundSize:
    """When a round of drawing ends (whichever comes first; None: no bound).

    Attributes:
        draws: candidates drawn in the round.
        admitted: candidates admitted to the round's batch.
    """

    draws: int | None = None
    admitted: int | None = None


class SamplingRules(abc.ABC):
    """A generator version: how candidates are drawn, screened, solved, kept and written.

    Every method but :meth:`check_output` must be given; a draw or a judgement
    refuses a candidate by returning one of :attr:`rejection_reasons`.
    """

    rejection_reasons: ClassVar[tuple[str, ...]]
    """Every reason a candidate can be refused for, in the summary's order."""
    advice: ClassVar[str]
    """What to change when too few candidates are kept (ends the error message)."""

    @abc.abstractmethod
    def draw(self, rng: np.random.Generator) -> Any:
        """One candidate drawn from ``rng`` (advanced in place), or the reason the draw
        failed."""

    @abc.abstractmethod
    def screen(self, candidate, kept: Sequence[Kept], waiting: Sequence) -> str | None:
        """The reason a drawn candidate is refused before solving (None: admitted).

        Args:
            candidate: the drawn candidate.
            kept: the samples kept so far, in order.
            waiting: the candidates already admitted to this round's batch.
        """

    @abc.abstractmethod
    def round_size(self, remaining: int) -> RoundSize:
        """How much a round draws while ``remaining`` samples are still missing."""

    @abc.abstractmethod
    def solve(self, candidates: Sequence, progress: Progress) -> Sequence:
        """One answer per candidate, from one batched solve."""

    @abc.abstractmethod
    def judge(self, candidate, answer, kept: Sequence[Kept]) -> str | None:
        """The reason a solved candidate is refused (None: kept), given the samples
        kept so far."""

    @abc.abstractmethod
    def files(self, output: pathlib.Path, kept: Sequence[Kept]) -> Mapping[pathlib.Path, str]:
        """Every file of the finished set: path -> text."""

    def check_output(self, output: pathlib.Path, num_samples: int) -> None:  # noqa: B027
        """Refuse an output folder before any work is done (default: any folder)."""


def draw_stream(rules: SamplingRules, seed: int) -> Iterator:
    """The draws of one ``numpy.random.default_rng(seed)``, one after the other."""
    rng = np.random.default_rng(seed)
    while True:
        yield rules.draw(rng)


@dataclasses.dataclass
class _Tally:
    """The counts of a run (the summary's numbers)."""

    rejected: dict[str, int]
    drawn: int = 0
    solved: int = 0
    unused: int = 0
    batches: int = 0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a generation run kept and counted.

    Attributes:
        kept: the kept samples, in order (their index is their position).
        drawn: candidates drawn (refused draws included).
        solved: candidates solved.
        unused: candidates solved after the last sample was kept.
        rejected: refused candidates by reason.
        batches: batched solves.
        seconds: wall time, writing included.
    """

    kept: list[Kept]
    drawn: int
    solved: int
    unused: int
    rejected: dict[str, int]
    batches: int
    seconds: float

    def summary(self, output_dir, **fields) -> dict:
        """The summary every generator returns; ``fields`` add the version's own entries
        (``samples`` among them)."""
        kept = len(self.kept)
        own = {k: v for k, v in fields.items() if k != "samples"}
        return {
            "output_dir": os.fspath(output_dir), **own,
            "kept": kept, "drawn": self.drawn, "solved": self.solved, "unused": self.unused,
            "rejected": self.rejected, "batches": self.batches, "seconds": self.seconds,
            "samples_per_second": kept / self.seconds if self.seconds > 0 else float("inf"),
            "seconds_per_solve": self.seconds / max(self.solved, 1),
            "device": device_name(),
            "subjects": dict.fromkeys(list_subjects(), kept),
            "samples": fields.get("samples", []),
        }


def check_num_samples(num_samples) -> int:
    """``num_samples`` if it is a positive integer; ValueError otherwise."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    return num_samples


def _draw_round(rules: SamplingRules, draws: Iterator, kept: list[Kept], tally: _Tally,
                size: RoundSize, max_attempts: int) -> list:
    """Candidates admitted to one round's batch, in draw order."""
    waiting: list = []
    drawn = 0
    while (tally.drawn < max_attempts
           and (size.draws is None or drawn < size.draws)
           and (size.admitted is None or len(waiting) < size.admitted)):
        candidate = next(draws)
        drawn += 1
        tally.drawn += 1
        reason = candidate if isinstance(candidate, str) else rules.screen(candidate, kept,
                                                                           waiting)
        if reason is None:
            waiting.append(candidate)
        else:
            tally.rejected[reason] += 1
    return waiting


def _judge_round(rules: SamplingRules, waiting: Sequence, answers: Sequence, kept: list[Kept],
                 num_samples: int, tally: _Tally) -> None:
    """Keep the round's solved candidates that the rules accept, in draw order."""
    for candidate, answer in zip(waiting, answers, strict=True):
        if len(kept) == num_samples:
            tally.unused += 1
            continue
        reason = rules.judge(candidate, answer, kept)
        if reason is None:
            kept.append(Kept(candidate, answer))
        else:
            tally.rejected[reason] += 1


def _shortfall(kept: int, num_samples: int, tally: _Tally, advice: str) -> GenerationError:
    return GenerationError(
        f"kept only {kept} of {num_samples} samples after {tally.drawn} draws "
        f"(rejected: {tally.rejected}); raise max_attempts or {advice}")


def generate(rules: SamplingRules, output_dir, num_samples: int, *, max_attempts: int,
             seed: int = 0, draws: Iterator | None = None,
             progress: Progress | None = None) -> Outcome:
    """Draw, solve and keep ``num_samples`` samples by ``rules``; write their files.

    Args:
        rules: the generator version's rules.
        output_dir: target folder (created if missing).
        num_samples: samples to keep.
        max_attempts: bound on drawn candidates.
        seed: seed of the default stream (:func:`draw_stream`).
        draws: another stream of draws (candidates, or reasons of failed draws).
        progress: optional callable(stage, done, total); the rules' solver
            reports its stages, the driver ``"kept"`` (per round) and ``"write"``.

    Returns:
        :class:`Outcome`.

    Raises:
        GenerationError: if ``max_attempts`` draws do not give enough samples;
            nothing is then written.
    """
    fea.require_x64()
    start = time.perf_counter()
    check_num_samples(num_samples)
    output = pathlib.Path(output_dir)
    rules.check_output(output, num_samples)
    report = progress or (lambda stage, done, total: None)
    draws = draw_stream(rules, seed) if draws is None else draws
    kept: list[Kept] = []
    tally = _Tally(dict.fromkeys(rules.rejection_reasons, 0))
    while len(kept) < num_samples:
        if tally.drawn >= max_attempts:
            raise _shortfall(len(kept), num_samples, tally, rules.advice)
        size = rules.round_size(num_samples - len(kept))
        waiting = _draw_round(rules, draws, kept, tally, size, max_attempts)
        if not waiting:
            continue
        answers = rules.solve(waiting, report)
        tally.solved += len(waiting)
        tally.batches += 1
        _judge_round(rules, waiting, answers, kept, num_samples, tally)
        report("kept", len(kept), num_samples)
    commit_files(rules.files(output, kept))
    report("write", 1, 1)
    return Outcome(kept, tally.drawn, tally.solved, tally.unused, tally.rejected,
                   tally.batches, time.perf_counter() - start)


def summary_line(summary: dict) -> str:
    """One line: kept, drawn, solved and rejections by reason, time."""
    reasons = " ".join(f"{k}={v}" for k, v in summary["rejected"].items())
    return (f"kept {summary['kept']} of {summary['drawn']} drawn candidates "
            f"({summary['solved']} solved, {summary['unused']} unused) in "
            f"{summary['seconds']:.1f} s; rejected: {reasons}")
