"""A person's first calls: compile once whatever the sample, flat memory.

Compilations are counted with JAX's own monitoring events
(:class:`sphyr_jax.runtime.CompileCounter`) and traces with
``chex.assert_max_traces``.  After one warm-up call per program, calls on
heterogeneous samples — full masks, random cells, rows and columns, easy and
hard, two load directions, batch sizes inside one bucket — must not compile
again.  No timing is asserted here (timings live in ``benchmarks/``).
"""

from __future__ import annotations

import json
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SETS

import sphyr_jax as sj
from sphyr_jax.runtime import CompileCounter

DATA = SETS / "dataset"
SUBJECTS = ("full_easy", "full_hard", "5_random_cell_easy", "10_random_cell_hard",
            "1_random_column_hard", "3_random_column_easy", "1_random_row_easy",
            "3_random_row_hard")
GRAVITIES = ((1.0, 0.0), (0.0, 1.0))


def _records(subject: str, count: int = 3) -> list[dict]:
    lines = (DATA / f"{subject}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[:count]]


@pytest.fixture(scope="module")
def problems():
    """(load case, answer densities) of many heterogeneous samples."""
    out = []
    for s, subject in enumerate(SUBJECTS):
        for rec in _records(subject):
            gravity = GRAVITIES[s % 2]
            case = sj.load_case_from_grid(rec["ground_truth"], rec["input_grid"], gravity)
            rho, _ = sj.densities_from_grid(rec["ground_truth"])
            out.append((case, rho))
    return out


def _eager_fea_calls(case, rho, solver):
    c = sj.compliance(case, rho, solver=solver)
    sol = sj.solve(case, rho, solver=solver)
    ana = sj.analyze(case, rho, solver=solver)
    jax.block_until_ready((c, sol, ana))
    return float(c), float(sol.compliance), float(ana.compliance)


@pytest.mark.parametrize("solver", ["banded", "cg"])
def test_eager_fea_compiles_once_whatever_the_sample(problems, solver):
    case0, rho0 = problems[0]
    _eager_fea_calls(case0, rho0, solver)  # warm-up: one program each
    with CompileCounter() as cc:
        for case, rho in problems[1:]:
            c, c_solve, c_analyze = _eager_fea_calls(case, rho, solver)
            # The three entry points are one physics: they agree on every sample.
            np.testing.assert_allclose([c_solve, c_analyze], c, rtol=1e-9)
    assert cc.count == 0, f"{cc.count} compilations on new samples ({cc.seconds:.1f} s)"


def test_eager_batches_inside_a_bucket_do_not_recompile(problems):
    cases = sj.stack_load_cases([p[0] for p in problems[:8]])
    rho = np.stack([p[1] for p in problems[:8]])
    first = sj.compliance(jax.tree.map(lambda a: a[:5], cases), rho[:5])  # bucket of 8
    with CompileCounter() as cc:
        for n in (6, 7, 8):
            c = sj.compliance(jax.tree.map(lambda a, n=n: a[:n], cases), rho[:n])
            np.testing.assert_allclose(np.asarray(c)[:5], np.asarray(first), rtol=1e-13)
        # One load case broadcast against a batch of designs: same bucket.
        c = sj.compliance(jax.tree.map(lambda a: a[0], cases), rho[:6])
    assert cc.count == 0
    singles = [float(sj.compliance(p[0], r)) for p, r in zip(problems[:1] * 6, rho[:6],
                                                               strict=True)]
    np.testing.assert_allclose(np.asarray(c), singles, rtol=1e-13)


def test_user_jit_traces_once_over_heterogeneous_samples(problems):
    """A user's jit of the public functions traces once for every sample."""

    @jax.jit
    @chex.assert_max_traces(n=1)
    def value_and_grad(case, rho):
        return jax.value_and_grad(sj.compliance, argnums=1)(case, rho)

    eager = []
    for case, rho in problems:
        c, g = value_and_grad(case, rho)
        chex.assert_shape(g, rho.shape)
        eager.append((float(sj.compliance(case, rho)), float(c)))
    eager = np.array(eager)
    np.testing.assert_allclose(eager[:, 1], eager[:, 0], rtol=1e-12)


def test_vmap_is_the_native_batch(problems):
    """jax.vmap of the public functions gives the native batch's numbers."""
    cases = sj.stack_load_cases([p[0] for p in problems])
    rho = jnp.asarray(np.stack([p[1] for p in problems]))
    native = sj.compliance(cases, rho)
    vmapped = jax.jit(jax.vmap(sj.compliance))(cases, rho)
    np.testing.assert_allclose(np.asarray(vmapped), np.asarray(native), rtol=1e-12)
    sol = jax.vmap(sj.solve)(cases, rho)
    np.testing.assert_allclose(np.asarray(sol.displacements),
                               np.asarray(sj.solve(cases, rho).displacements),
                               rtol=1e-10, atol=1e-14)
    ana = jax.vmap(sj.analyze)(cases, rho)
    np.testing.assert_array_equal(np.asarray(ana.load_carrying),
                                  np.asarray(sj.analyze(cases, rho).load_carrying))


def _rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    pytest.skip("no /proc/self/status")


def test_memory_stays_flat_over_many_eager_calls(problems):
    rng = np.random.default_rng(0)
    designs = [np.clip(p[1] + 0.3 * rng.standard_normal(p[1].shape), 0, 1) for p in problems]
    for case, rho in problems[:4]:  # warm-up
        float(sj.compliance(case, rho))
    before = _rss_mb()
    with CompileCounter() as cc:
        for k in range(1000):
            case, _ = problems[k % len(problems)]
            float(sj.compliance(case, designs[(7 * k) % len(designs)]))
    grown = _rss_mb() - before
    assert cc.count == 0
    assert grown <= 100.0, f"RSS grew by {grown:.0f} MB over 1,000 eager calls"


def test_scoring_compiles_once_whatever_the_sample():
    """get_structural_metrics and score_batch: after warm-up, new samples of every
    subject, format and load direction (and a batch inside the same bucket) never
    compile again; every answer scores as its own completion should."""
    warm = _records("full_easy", 1)[0]
    sj.get_structural_metrics(warm["ground_truth"], warm["ground_truth"], warm["input_grid"])
    items = []
    for s, subject in enumerate(SUBJECTS):
        rec = _records(subject, 4)[3]
        items.append(sj.ScoreItem(rec["ground_truth"], rec["ground_truth"], rec["input_grid"],
                                  GRAVITIES[s % 2]))
    batch = [sj.ScoreItem(r["ground_truth"], r["ground_truth"], r["input_grid"])
             for r in _records("3_random_row_easy", 8)[4:]]
    sj.score_batch(batch[:3])  # warm-up of the 3-4 sample bucket
    with CompileCounter() as cc:
        singles = [sj.get_structural_metrics(it.completion, it.ground_truth, it.input_grid,
                                             it.gravity_dir) for it in items]
        together = sj.score_batch(batch)
    assert cc.count == 0, f"{cc.count} compilations on new samples ({cc.seconds:.1f} s)"
    for m in singles + together:
        # The answer is a candidate of the optimum: never stiffer than it, and
        # scored against its own compliance.
        assert m.physically_valid and m.load_carrying
        assert m.optimal_compliance <= m.ground_truth_compliance * (1 + 1e-9)
        np.testing.assert_allclose(m.compliance, m.ground_truth_compliance, rtol=1e-12)
