"""A whole experiment: train a model, checkpoint it, and put it on the leaderboard.

The top of the training package: it joins the trainer
(:mod:`~sphyr_jax.training.loop`), checkpoints (:mod:`~sphyr_jax.training.model`)
and the leaderboard (:mod:`~sphyr_jax.training.leaderboard`), which itself scores
through :mod:`~sphyr_jax.training.evaluation`.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Sequence

from sphyr_jax.io import atomic_write_json, atomic_write_text
from sphyr_jax.progress import Progress
from sphyr_jax.runtime import enable_x64
from sphyr_jax.training.config import TrainConfig
from sphyr_jax.training.leaderboard import build_leaderboard, summary, write_leaderboard
from sphyr_jax.training.loop import problem_source, train
from sphyr_jax.training.model import save_checkpoint


def run_experiment(cfg: TrainConfig, workdir, groups: Sequence = (), cache=None,
                   log: Callable[[str], None] | None = None,
                   num_devices: int | None = None, *,
                   progress: Progress | None = None, command: str | None = None) -> dict:
    """Train, checkpoint, then score the model on every group; writes ``<workdir>/metrics.json``.

    Turns float64 on (the finite elements need it) before any work.

    Args:
        cfg: training configuration.
        workdir: output folder (``model.eqx``, ``model.json``, ``config.json``
            (the training configuration), ``command.txt`` (with ``command``),
            ``metrics.json`` and, with groups, the leaderboard files of
            :func:`~sphyr_jax.training.leaderboard.write_leaderboard`).
        groups: :class:`~sphyr_jax.training.leaderboard.EvalGroup` s (none: no
            evaluation).
        cache: optimum cache for scoring.
        log: optional callable receiving the training curve and other lines.
        num_devices: devices scoring is split over (None: all local).
        progress: optional ``(stage, done, total)`` callback of the pools,
            the training steps and the scoring (:mod:`sphyr_jax.progress`).
        command: the command line that ran this (written to ``command.txt``).

    Returns:
        ``{"config", "curve", "train_seconds", "load_average", "problems",
        "checkpoint"}`` (``load_average``: the host's mean one-minute load
        average over the curve entries, None where the system does not report
        it; ``problems``: what the problem source holds, its ``describe()``;
        ``train_seconds`` counts the pools too) plus, with
        groups, ``"eval_seconds"`` and ``"summary"`` (see
        :func:`~sphyr_jax.training.leaderboard.summary`).
    """
    enable_x64()  # the trainer and the scoring need float64
    log = log or (lambda line: None)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    source = problem_source(cfg, progress=progress)
    log(f"problems ready after {time.perf_counter() - t0:.0f} s: {source.describe()}")
    model, curve = train(cfg, source=source, log=lambda e: log(
        f"step {e['step']}: loss {e['loss']:.4f} vf {e['volume_fraction']:.3f} "
        f"carrying {e['carrying']:.2f} ({e['seconds']:.0f} s)"),
                         progress=progress)
    loads = [e["load_average"] for e in curve if e["load_average"] is not None]
    out = {"config": cfg.as_dict(), "curve": curve, "train_seconds": time.perf_counter() - t0,
           "load_average": sum(loads) / len(loads) if loads else None,
           "problems": source.describe()}
    out["checkpoint"] = str(save_checkpoint(workdir, model, cfg.model).name)
    atomic_write_json(workdir / "config.json", cfg.as_dict())
    if command is not None:
        atomic_write_text(workdir / "command.txt", command + "\n")
    atomic_write_json(workdir / "metrics.json", out)
    if groups:
        out.update(evaluate_model(model, groups, workdir, cache, log, num_devices,
                                  progress=progress))
        atomic_write_json(workdir / "metrics.json", out)
    return out


def evaluate_model(model, groups: Sequence, workdir, cache=None,
                   log: Callable[[str], None] | None = None,
                   num_devices: int | None = None, *,
                   progress: Progress | None = None) -> dict:
    """Leaderboard of a model on groups, written to ``workdir``; returns
    ``{"eval_seconds", "summary"}`` (see :mod:`sphyr_jax.training.leaderboard`).

    Turns float64 on (the scoring needs it); ``progress`` is the scoring's
    optional ``(stage, done, total)`` callback.
    """
    enable_x64()
    log = log or (lambda line: None)
    t1 = time.perf_counter()
    board = build_leaderboard(model, groups, cache, num_devices, log=log, progress=progress)
    seconds = time.perf_counter() - t1
    files = write_leaderboard(board, workdir)
    log(f"scored {len(groups)} groups in {seconds:.0f} s; wrote "
        + ", ".join(str(p) for p in files.values()))
    return {"eval_seconds": seconds, "summary": summary(board)}
