"""The physics loss and the training loop.

Per sample, with $\\rho$ the model's densities on design cells (pinned values
elsewhere) and $c(\\mathbf 1)$ the solid grid's compliance,

$$J(\\rho) = \\log \\frac{c(\\rho)}{c(\\mathbf 1)} + \\lambda\\, \\overline{\\rho}.$$

The log ratio makes load cases of very different stiffness comparable; the
price $\\lambda$ on the whole-grid volume fraction decides how much material
the model spends (for designs with $c \\propto vf^{-\\beta}$ the optimum sits
near $vf = \\beta / \\lambda$).  The loss is $(1 - w) J(\\rho) + w J(r(\\rho))$
with $r$ the rounding to the problem's format (drawn per problem: 0/1 or one
decimal) and a straight-through gradient;
for 0/1 designs the rounded term is evaluated at p = 1 (same value for 0/1
densities, but a non-zero gradient on empty cells), so a rounded design that
drops the load is pushed to reconnect it.  Continuations over training:
the soft term's SIMP exponent rises from ``initial_penal`` to ``penal``, the
logit scale from ``initial_sharpness`` to 1 and w from 0 to
``rounded_weight``.
"""

from __future__ import annotations

import dataclasses
import math
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
from sphyr_jax.training.config import LossConfig, TrainConfig
from sphyr_jax.training.model import init_model, predict
from sphyr_jax.training.problems import (
    make_pool,
    needs_pool,
    round_to_format,
    sample_problems,
)


def design_objective(case: LoadCase, rho, solid, volume_weight, penal,
                     solver=None) -> jax.Array:
    """Per-sample $\\log(c / c_{solid}) + \\lambda\\, vf$, (B,)."""
    c = fea.compliance(case, rho, penal=penal, solver=solver)
    return jnp.log(c / solid) + volume_weight * jnp.mean(rho, axis=tuple(range(-case.ndim, 0)))


def schedule(progress, cfg: LossConfig):
    """(sharpness, soft-term SIMP exponent, rounded weight) at training progress in [0, 1]."""
    sharp = cfg.initial_sharpness ** (1.0 - progress)
    penal = cfg.initial_penal + (cfg.penal - cfg.initial_penal) * jnp.minimum(2.0 * progress, 1.0)
    ramp = jnp.clip((progress - cfg.rounded_start) / max(1.0 - cfg.rounded_start, 1e-9), 0, 1)
    return sharp, penal, cfg.rounded_weight * ramp


def batch_loss(model, case: LoadCase, features, progress, cfg: LossConfig, hard):
    """Mean physics loss of a batch and diagnostics.

    Args:
        model: the density model.
        case: batched load cases (design mask = cells the model fills).
        features: (B, C, *cells).
        progress: training progress in [0, 1] (drives the continuations).
        cfg: loss settings.
        hard: (B,) bool (or one bool): round to one decimal (else 0/1) in the
            rounded term, per problem.

    Returns:
        (loss, {"soft", "rounded": mean objectives, "volume_fraction": mean of
        the rounded designs, "carrying": share of rounded designs within
        ``fea.SINGULARITY_RATIO`` of the solid compliance}).
    """
    sharp, penal, w = schedule(progress, cfg)
    soft = jnp.where(case.design_mask, predict(model, features, sharp, cfg.leak), case.pinned)
    rounded = soft + jax.lax.stop_gradient(round_to_format(soft, hard) - soft)
    solid = jax.lax.stop_gradient(
        fea.compliance(case, jnp.ones(soft.shape[-case.ndim:]), penal=cfg.penal,
                       solver=cfg.solver))
    j_soft = design_objective(case, soft, solid, cfg.volume_weight, penal, cfg.solver)
    j_round = design_objective(case, rounded, solid, cfg.volume_weight,
                               jnp.where(jnp.asarray(hard), cfg.penal, 1.0), cfg.solver)
    loss = jnp.mean((1.0 - w) * j_soft + w * j_round)
    vf = jnp.mean(rounded, axis=tuple(range(-case.ndim, 0)))
    aux = {"soft": jnp.mean(j_soft), "rounded": jnp.mean(j_round),
           "volume_fraction": jnp.mean(vf),
           "carrying": jnp.mean(j_round - cfg.volume_weight * vf
                                <= math.log(fea.SINGULARITY_RATIO))}
    return loss, aux


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """Adam with linear warmup, cosine decay (to 5 %) and global-norm clipping."""
    decay = max(cfg.steps, cfg.warmup_steps + 1)
    lr = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1),
                                            decay, cfg.learning_rate * 0.05)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adam(lr))


@bounded_cache(maxsize=8)
def make_train_step(cfg: TrainConfig):
    """A compiled step ``(model, opt_state, key, step, pool) -> (model, opt_state, loss, aux)``.

    The step draws its batch of problems from ``key`` inside the compiled call
    and updates with :func:`make_optimizer`; ``loss`` and ``aux`` (see
    :func:`batch_loss`, plus ``grad_norm``) are those of the model before the
    update.  Cached per configuration, so runs with one configuration compile once.
    """
    optimizer = make_optimizer(cfg)

    @eqx.filter_jit
    def step_fn(model, opt_state, key, step, pool):
        case, features, info = sample_problems(key, cfg.batch_size, cfg.problem, pool)
        progress = step / max(cfg.steps - 1, 1)
        (loss, aux), grads = eqx.filter_value_and_grad(batch_loss, has_aux=True)(
            model, case, features, progress, cfg.loss, info.hard)
        aux = {**aux, "grad_norm": optax.tree.norm(grads)}
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss, aux

    return step_fn


def train(cfg: TrainConfig, log: Callable[[dict], None] | None = None):
    """Train a model from ``cfg.seed`` on random problems (deterministic for a seed).

    Turns float64 on (the finite elements need it) before any work.

    Args:
        cfg: configuration.
        log: optional callback receiving each curve entry as it is made.

    Returns:
        (model, curve): curve entries ``{"step", "loss", "soft", "rounded",
        "volume_fraction", "carrying", "grad_norm", "seconds"}``, means over the last
        ``log_every`` steps (``seconds``: wall time since the start).
    """
    enable_x64()
    start = time.perf_counter()
    k_model, k_pool, k_data = jax.random.split(jax.random.PRNGKey(cfg.seed), 3)
    model = init_model(cfg.model, k_model)
    pool = make_pool(k_pool, cfg.problem) if needs_pool(cfg.problem) else None
    opt_state = make_optimizer(cfg).init(eqx.filter(model, eqx.is_array))
    step_fn = make_train_step(dataclasses.replace(cfg, seed=0))  # compiled once per setup
    curve, window = [], []
    for step in range(cfg.steps):
        model, opt_state, loss, aux = step_fn(model, opt_state, jax.random.fold_in(k_data, step),
                                              jnp.asarray(step, jnp.float64), pool)
        window.append({"loss": loss, **aux})
        if (step + 1) % max(cfg.log_every, 1) == 0 or step + 1 == cfg.steps:
            entry = {"step": step + 1}
            for name in window[0]:
                entry[name] = float(np.mean([float(w[name]) for w in window]))
            entry["seconds"] = time.perf_counter() - start
            curve.append(entry)
            window = []
            if log is not None:
                log(entry)
    return model, curve
