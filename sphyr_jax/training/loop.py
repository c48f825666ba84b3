"""The physics loss and the training loop.

Per sample, with $\\rho$ the model's densities on design cells (pinned values
elsewhere) and $c(\\mathbf 1)$ the solid grid's compliance,

$$J(\\rho) = \\log \\frac{c(\\rho)}{c(\\mathbf 1)} + \\lambda\\, \\overline{\\rho}
+ \\kappa \\max\\bigl(0, \\log(\\overline{\\rho} / t)\\bigr).$$

The log ratio makes load cases of very different stiffness comparable.  The
material is paid for in one of two ways.  A price $\\lambda$ on the whole-grid
volume fraction (for designs with $c \\propto vf^{-\\beta}$ the optimum sits
near $vf = \\beta / \\lambda$); or, for problems that carry a target volume
fraction $t$ (those drawn by the generators' rules: the answer's volume
fraction), a price $\\kappa$ on the material above it only, the shape of the
topology score's material efficiency $\\min(1, t / v_f)$: below the target
more material only lowers the compliance, above it each extra cell costs.

The loss is $(1 - w) J(\\rho) + w J(r(\\rho))$ with $r$ the rounding to the
problem's format (0/1 or one decimal) and a straight-through gradient; for
0/1 designs the rounded term is evaluated at p = 1 (same value for 0/1
densities, but a non-zero gradient on empty cells), so a rounded design that
drops the load is pushed to reconnect it.  Continuations over training:
the soft term's SIMP exponent rises from ``initial_penal`` to ``penal``, the
logit scale from ``initial_sharpness`` to 1 and w from 0 to
``rounded_weight``.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from sphyr_jax.fem import fea
from sphyr_jax.problem.loadcase import LoadCase
from sphyr_jax.runtime import bounded_cache, enable_x64
from sphyr_jax.training.config import DrawConfig, LossConfig, ProblemConfig, TrainConfig
from sphyr_jax.training.drawing import DrawnProblems, Exclusion, ProblemSet, draw_problems
from sphyr_jax.training.model import init_model, predict
from sphyr_jax.training.problems import (
    build_problem,
    make_pool,
    needs_pool,
    round_to_format,
    sample_problems,
)


class TrainBatch(eqx.Module):
    """One step's problems: load cases, model features, format and target volume.

    Attributes:
        case: batched :class:`~sphyr_jax.problem.loadcase.LoadCase` (design
            mask = the cells the model fills).
        features: (B, C, *cells) model inputs.
        hard: (B,) bool, one-decimal format.
        target: (B,) target volume fractions, or None (no excess term).
    """

    case: LoadCase
    features: jax.Array
    hard: jax.Array
    target: jax.Array | None = None


def design_objective(case: LoadCase, rho, solid, penal, *, volume_weight=0.0, target=None,
                     excess_weight=0.0, solver=None) -> jax.Array:
    """Per-sample $\\log(c / c_{solid}) + \\lambda\\, v_f
    + \\kappa \\max(0, \\log(v_f / t))$, (B,).

    Args:
        case: batched load cases.
        rho: (B, *cells) densities.
        solid: (B,) compliance of the solid grid.
        penal: SIMP exponent (scalar or (B,)).
        volume_weight: the price $\\lambda$ on the volume fraction.
        target: (B,) target volume fractions $t$, or None (no excess term).
        excess_weight: the price $\\kappa$ on material above the target.
        solver: FEA linear solver (None: the grid's default).
    """
    c = fea.compliance(case, rho, penal=penal, solver=solver)
    vf = jnp.mean(rho, axis=tuple(range(-case.ndim, 0)))
    j = jnp.log(c / solid) + volume_weight * vf
    if target is not None:
        j = j + excess_weight * jax.nn.relu(jnp.log(vf) - jnp.log(target))
    return j


def schedule(progress, cfg: LossConfig):
    """(sharpness, soft-term SIMP exponent, rounded weight) at training progress in [0, 1]."""
    sharp = cfg.initial_sharpness ** (1.0 - progress)
    penal = cfg.initial_penal + (cfg.penal - cfg.initial_penal) * jnp.minimum(2.0 * progress, 1.0)
    ramp = jnp.clip((progress - cfg.rounded_start) / max(1.0 - cfg.rounded_start, 1e-9), 0, 1)
    return sharp, penal, cfg.rounded_weight * ramp


def batch_loss(model, batch: TrainBatch, progress, cfg: LossConfig):
    """Mean physics loss of a batch and diagnostics.

    Args:
        model: the density model.
        batch: the problems (their ``hard`` flags pick the rounding of the
            rounded term: one decimal, else 0/1).
        progress: training progress in [0, 1] (drives the continuations).
        cfg: loss settings.

    Returns:
        (loss, {"soft", "rounded": mean objectives, "volume_fraction": mean of
        the rounded designs, "carrying": share of rounded designs within
        ``fea.SINGULARITY_RATIO`` of the solid compliance}).
    """
    case, hard = batch.case, batch.hard
    sharp, penal, w = schedule(progress, cfg)
    soft = jnp.where(case.design_mask, predict(model, batch.features, sharp, cfg.leak),
                     case.pinned)
    rounded = soft + jax.lax.stop_gradient(
        round_to_format(soft, hard, binary_hard=model.binary_hard) - soft)
    solid = jax.lax.stop_gradient(
        fea.compliance(case, jnp.ones(soft.shape[-case.ndim:]), penal=cfg.penal,
                       solver=cfg.solver))
    prices = {"volume_weight": cfg.volume_weight, "target": batch.target,
              "excess_weight": cfg.excess_weight, "solver": cfg.solver}
    j_soft = design_objective(case, soft, solid, penal, **prices)
    round_penal = 1.0 if model.binary_hard else jnp.where(jnp.asarray(hard), cfg.penal, 1.0)
    j_round = design_objective(case, rounded, solid, round_penal, **prices)
    loss = jnp.mean((1.0 - w) * j_soft + w * j_round)
    vf = jnp.mean(rounded, axis=tuple(range(-case.ndim, 0)))
    c_round = fea.compliance(case, jax.lax.stop_gradient(rounded), penal=round_penal,
                             solver=cfg.solver)
    aux = {"soft": jnp.mean(j_soft), "rounded": jnp.mean(j_round),
           "volume_fraction": jnp.mean(vf),
           "carrying": jnp.mean(c_round <= fea.SINGULARITY_RATIO * solid)}
    return loss, aux


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """Adam with linear warmup, cosine decay (to 5 %) and global-norm clipping."""
    decay = max(cfg.steps, cfg.warmup_steps + 1)
    lr = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1),
                                            decay, cfg.learning_rate * 0.05)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adam(lr))


@bounded_cache(maxsize=8)
def make_train_step(cfg: TrainConfig):
    """A compiled step ``(model, opt_state, batch, step) -> (model, opt_state, loss, aux)``.

    Updates with :func:`make_optimizer` on a :class:`TrainBatch`; ``loss`` and
    ``aux`` (see :func:`batch_loss`, plus ``grad_norm``) are those of the
    model before the update.  Cached per configuration; one compiled program
    per batch shape (grid size).
    """
    optimizer = make_optimizer(cfg)

    @eqx.filter_jit
    def step_fn(model, opt_state, batch, step):
        progress = step / max(cfg.steps - 1, 1)
        (loss, aux), grads = eqx.filter_value_and_grad(batch_loss, has_aux=True)(
            model, batch, progress, cfg.loss)
        aux = {**aux, "grad_norm": optax.tree.norm(grads)}
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss, aux

    return step_fn


class ProblemSource(abc.ABC):
    """Where a trainer's problems come from: one :class:`TrainBatch` per step."""

    @abc.abstractmethod
    def batch(self, step: int) -> TrainBatch:
        """The problems of training step ``step`` (deterministic for a seed)."""

    def describe(self) -> dict:
        """What the source holds, for a run's record (JSON-ready)."""
        return {}


@bounded_cache(maxsize=8)
def _sampler(cfg: ProblemConfig, batch_size: int):
    @jax.jit
    def sample(key, pool):
        case, features, info = sample_problems(key, batch_size, cfg, pool)
        return TrainBatch(case, features, info.hard)

    return sample


class CanonicalSource(ProblemSource):
    """Problems of the in-graph canonical sampler
    (:func:`sphyr_jax.training.problems.sample_problems`).

    Args:
        cfg: training configuration (its ``problem`` a :class:`ProblemConfig`).
        key: PRNG key of the pool and the batches.
    """

    def __init__(self, cfg: TrainConfig, key):
        k_pool, self.key = jax.random.split(key)
        self.pool = make_pool(k_pool, cfg.problem) if needs_pool(cfg.problem) else None
        self.sample = _sampler(cfg.problem, cfg.batch_size)

    def batch(self, step: int) -> TrainBatch:
        return self.sample(jax.random.fold_in(self.key, step), self.pool)


@jax.jit
def _build_batch(load, support, gravity, known, masked, hard, target) -> TrainBatch:
    case, features = jax.vmap(build_problem)(load, support, gravity, known, masked)
    return TrainBatch(case, features, hard, target)


class RulesSource(ProblemSource):
    """Problems drawn by the generators' rules (:mod:`sphyr_jax.training.drawing`).

    Builds every source's bank and pool when made (the pool's optimiser runs
    then).  A step draws its grid size by ``size_weights`` and its problems
    from that size's sources, from a NumPy stream seeded with ``(seed, step)``.

    Args:
        cfg: the draw settings.
        seed: seed of the banks, pools and batches.
        exclusion: the benchmark samples held apart
            (:class:`~sphyr_jax.training.drawing.Exclusion`); None: none.
        progress: optional ``(stage, done, total)`` callback of the pools' optimiser.
    """

    def __init__(self, cfg: DrawConfig, seed: int, exclusion: Exclusion | None = None,
                 progress=None):
        self.cfg, self.seed = cfg, seed
        self.sets = [ProblemSet.build(s, bank_size=cfg.bank_size, pool_size=p, seed=seed,
                                      exclusion=exclusion, progress=progress)
                     for s, p in zip(cfg.sources, cfg.pool_sizes, strict=True)]

    def describe(self) -> dict:
        """Per source: layouts in the bank, answers in the pool, and what the exclusion
        refused (drawn layouts) and dropped (pool answers)."""
        return {f"{s.family}:{s.grid_size}": {"bank": len(s.bank), "pool": len(s.pool),
                                              "refused_layouts": s.refused.get("layout", 0),
                                              "dropped_answers": s.refused.get("structure", 0)}
                for s in self.sets}

    def draw(self, step: int) -> DrawnProblems:
        """The step's problems as NumPy arrays."""
        cfg = self.cfg
        rng = np.random.default_rng([self.seed, step])
        w = np.asarray(cfg.size_weights, np.float64)
        size = int(rng.choice(len(cfg.grid_sizes), p=w / w.sum()))
        ids = [i for i, s in enumerate(self.sets) if s.grid_size == cfg.grid_sizes[size]]
        return draw_problems([self.sets[i] for i in ids], [cfg.source_weights[i] for i in ids],
                             cfg.batch_sizes[size], rng, variant_weights=cfg.variant_weights,
                             hard_fraction=cfg.hard_fraction, pool_fraction=cfg.pool_fraction,
                             source_ids=ids)

    def batch(self, step: int) -> TrainBatch:
        p = self.draw(step)
        return _build_batch(p.load, p.support, p.gravity, p.known, p.masked, p.hard, p.target)


def _keys(seed: int):
    """(model key, data key) of a training seed."""
    return jax.random.split(jax.random.PRNGKey(seed))


def problem_source(cfg: TrainConfig, key=None, progress=None) -> ProblemSource:
    """The problem source of a configuration: drawn by the rules (a :class:`DrawConfig`,
    layouts near benchmark samples refused when it asks) or canonical (from ``key``,
    default the data key of ``cfg.seed``, as :func:`train` uses it)."""
    key = _keys(cfg.seed)[1] if key is None else key
    if isinstance(cfg.problem, DrawConfig):
        exclusion = Exclusion() if cfg.problem.exclude_benchmarks else None
        return RulesSource(cfg.problem, cfg.seed, exclusion, progress)
    return CanonicalSource(cfg, key)


def train(cfg: TrainConfig, log: Callable[[dict], None] | None = None, *,
          progress=None, source: ProblemSource | None = None):
    """Train a model from ``cfg.seed`` on random problems (deterministic for a seed).

    Turns float64 on (the finite elements need it) before any work.

    Args:
        cfg: configuration.
        log: optional callback receiving each curve entry as it is made.
        progress: optional ``(stage, done, total)`` callback (the pool's
            optimiser, then the training steps).
        source: the problems (default: :func:`problem_source` of ``cfg``,
            made here).

    Returns:
        (model, curve): curve entries ``{"step", "loss", "soft", "rounded",
        "volume_fraction", "carrying", "grad_norm", "seconds", "load_average"}``, means
        over the last ``log_every`` steps (``seconds``: wall time since the start;
        ``load_average``: the host's one-minute load average then, None where
        the system does not report it).
    """
    enable_x64()
    start = time.perf_counter()
    k_model, k_data = _keys(cfg.seed)
    model = init_model(cfg.model, k_model)
    if source is None:
        source = problem_source(cfg, k_data, progress)
    opt_state = make_optimizer(cfg).init(eqx.filter(model, eqx.is_array))
    step_fn = make_train_step(dataclasses.replace(cfg, seed=0))  # compiled once per setup
    report = progress or (lambda stage, done, total: None)
    curve, window = [], []
    for step in range(cfg.steps):
        model, opt_state, loss, aux = step_fn(model, opt_state, source.batch(step),
                                              jnp.asarray(step, jnp.float64))
        window.append({"loss": loss, **aux})
        if (step + 1) % max(cfg.log_every, 1) == 0 or step + 1 == cfg.steps:
            entry = {"step": step + 1}
            for name in window[0]:
                entry[name] = float(np.mean([float(w[name]) for w in window]))
            entry["seconds"] = time.perf_counter() - start
            entry["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            curve.append(entry)
            window = []
            report("train", step + 1, cfg.steps)
            if log is not None:
                log(entry)
    return model, curve
