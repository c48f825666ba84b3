"""The ``reference`` yardstick: the published optimum, reproduced.

Truths: the reference implementation's stored figures (``optimal_compliance``,
``topology_score``) on the GPT-4o ``full_easy`` records, an independent
NumPy/SciPy re-implementation of the published method
(``benchmarks/reference_method.py``), and analytic cases for the pieces.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import REPO, RTOL_REFERENCE, SETS, report

from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
from sphyr_jax.scoring.metrics import ScoreItem, score_batch
from sphyr_jax.scoring.results import AGGREGATED_SUFFIX, rescore_tree
from sphyr_jax.topopt import simp, yardstick
from sphyr_jax.topopt.budget import round_to_budget
from sphyr_jax.topopt.optimum import OptimumCache, optimum_key
from sphyr_jax.topopt.options import DEFAULT_REFERENCE, DEFAULT_STRONG, yardstick_options

sys.path.insert(0, str(REPO / "benchmarks"))
import reference_method  # noqa: E402

PARITY_SHARE = 0.98


def _cases(records):
    return [load_case_from_grid(r["ground_truth"], r["prompt"]) for r in records]


@pytest.fixture(scope="module")
def stored_optima(gpt4o_records, claude_records, optimum_cache):
    """Reference optima of the 100 GPT-4o and the first 16 Claude samples, one
    batched computation kept in the session's cache (rescore tests reuse it)."""
    records = list(gpt4o_records) + list(claude_records[:16])
    cases = _cases(records)
    res = optimum_cache.get_many(cases, [np.asarray(c.pinned) for c in cases])
    return records, cases, res


# ----------------------------------------------------------------------------
# Pieces against analytic truths.


@pytest.mark.parametrize("shape,radius", [((4, 5), 1.2), ((3, 4, 5), 1.2), ((4, 3, 5), 2.5)])
def test_filter_stencil_equals_the_cone_filter(shape, radius):
    idx, w = yardstick.filter_stencil(shape, radius)
    nel = int(np.prod(shape))
    dense = np.zeros((nel, nel))
    for i in range(nel):
        for k in range(idx.shape[1]):
            dense[i, idx[i, k]] += w[i, k]
    truth = simp.filter_matrix(shape, radius)  # from centre-to-centre distances
    np.testing.assert_allclose(dense, truth, rtol=0, atol=1e-15)
    x = np.random.default_rng(0).random((3, nel))
    np.testing.assert_allclose(np.asarray(yardstick.apply_stencil(x, idx, w)), x @ truth.T,
                               rtol=1e-14)


def test_round_to_budget_keeps_ties_and_edges():
    mask = np.array([True, True, True, True, False])
    x = np.array([0.2, 0.7, 0.7, 0.1, 0.4])
    # Two cells of material; the 2nd largest (0.7) is tied: both 0.7 cells kept.
    np.testing.assert_array_equal(round_to_budget(x, mask, 2.0), [0, 1, 1, 0, 0.4])
    # One cell: threshold 0.7, tied -> the rounding overspends (as published).
    np.testing.assert_array_equal(round_to_budget(x, mask, 1.5), [0, 1, 1, 0, 0.4])
    np.testing.assert_array_equal(round_to_budget(x, mask, 3.0), [1, 1, 1, 0, 0.4])
    np.testing.assert_array_equal(round_to_budget(x, mask, 0.5), [0, 0, 0, 0, 0.4])
    np.testing.assert_array_equal(round_to_budget(x, mask, 9.0), [1, 1, 1, 1, 0.4])
    # The NumPy re-implementation agrees.
    for budget in (0.5, 1.5, 2.0, 3.0, 9.0):
        np.testing.assert_array_equal(
            round_to_budget(x, mask, budget),
            reference_method.round_to_budget(x, mask, budget))


def _bisection_problem(seed: int, slots: int = 12, nel: int = 150):
    """Random optimality-criteria steps with the awkward slots: not live, no
    sensitivity, a target above every design's volume, one below every design's."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    x = np.where(rng.random((slots, nel)) < 0.2, rng.integers(0, 2, (slots, nel)),
                 rng.random((slots, nel)))
    scaled = rng.random((slots, nel)) * 10.0 ** rng.uniform(-3, 2, (slots, 1))
    scaled[:, :5] *= 1e-20  # cells far beyond every multiplier tested
    scaled[1] = 0.0
    mask = rng.random((slots, nel)) < 0.9
    dv = rng.uniform(0.5, 1.0, (slots, nel))
    rest = rng.uniform(0.0, 5.0, slots)
    move = 0.2
    low, high = np.maximum(x - move, 0) * mask * dv, np.minimum(x + move, 1) * mask * dv
    share = rng.uniform(0.1, 0.9, slots)
    target = rest + (1 - share) * low.sum(axis=1) + share * high.sum(axis=1)
    target[2], target[3] = rest[2] + 2.0 * nel, rest[3] - 1.0
    live = np.ones(slots, bool)
    live[4] = False

    def volume(mid):
        design = jnp.clip(jnp.clip(scaled / jnp.sqrt(mid)[:, None], x - move, x + move), 0, 1)
        return jnp.sum(jnp.where(mask, dv * design, 0.0), axis=-1) + rest

    return scaled, x, mask, dv, target, rest, move, live, volume


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_predicted_bisection_equals_the_published_one(seed):
    """The bisection replayed from the Newton threshold ends on the same last
    midpoint, bit for bit, as the published loop (a plain Python loop testing
    the volume at every midpoint); a wrong threshold falls back to it."""
    import jax
    import jax.numpy as jnp

    scaled, x, mask, dv, target, rest, move, live, volume = _bisection_problem(seed)
    threshold = yardstick.multiplier_threshold(jnp.asarray(scaled), x, mask, dv, target, rest,
                                               move)
    vol = jax.jit(volume)
    lo = np.full(target.shape, yardstick.BISECTION_BRACKET[0])
    hi = np.full(target.shape, yardstick.BISECTION_BRACKET[1])
    mid = 0.5 * (lo + hi)
    while True:
        go = ((hi - lo) / (lo + hi) > yardstick.BISECTION_TOL) & live
        if not go.any():
            break
        mm = 0.5 * (lo + hi)
        over = np.asarray(vol(mm)) > target
        lo, hi, mid = (np.where(go & over, mm, lo), np.where(go & ~over, mm, hi),
                       np.where(go, mm, mid))
    # The threshold splits the multipliers as the volume test does.
    threshold = np.asarray(threshold)
    assert np.isinf(threshold[3]) and threshold[2] == 0.0
    inner = live & np.isfinite(threshold) & (threshold > 0)
    assert inner.sum() >= 8
    below = np.where(inner, threshold * (1 - 1e-9), 1.0)
    above = np.where(inner, threshold * (1 + 1e-9), 1.0)
    assert np.all((np.asarray(vol(below)) > target)[inner])
    assert np.all((np.asarray(vol(above)) <= target)[inner])

    bisect = jax.jit(yardstick._bisect, static_argnums=0)
    got = bisect(volume, target, live, threshold)
    np.testing.assert_array_equal(np.asarray(got)[live], mid[live])
    wrong = np.where(inner, 1.5 * threshold, threshold)  # every check fails: published loop
    np.testing.assert_array_equal(np.asarray(bisect(volume, target, live, wrong))[live],
                                  mid[live])


# ----------------------------------------------------------------------------
# Parity with the published figures.


def test_parity_with_stored_figures(gpt4o_records, stored_optima, optimum_cache):
    """optimal_compliance and topology_score to 1e-6 on >= 98% of the records;
    every record that differs is listed with its reason."""
    items = [ScoreItem(r["completion"], r["ground_truth"], r["prompt"]) for r in gpt4o_records]
    scored = score_batch(items, cache=optimum_cache)
    differ = []
    for i, (rec, m) in enumerate(zip(gpt4o_records, scored, strict=True)):
        c_ok = m.optimal_compliance == pytest.approx(rec["optimal_compliance"],
                                                     rel=RTOL_REFERENCE)
        t_ok = m.topology_score == pytest.approx(rec["topology_score"], rel=RTOL_REFERENCE,
                                                 abs=1e-12)
        if not (c_ok and t_ok):
            why = ("a different optimum" if not c_ok else "the completion's figures")
            differ.append(f"record {i}: optimal {m.optimal_compliance:.9g} vs stored "
                          f"{rec['optimal_compliance']:.9g}, topology {m.topology_score:.6g} "
                          f"vs {rec['topology_score']:.6g} ({why})")
    n = len(gpt4o_records)
    report(f"reference yardstick: {n - len(differ)}/{n} stored records reproduce "
           f"optimal_compliance and topology_score to 1e-6")
    for line in differ:
        report("  differs: " + line)
    assert n - len(differ) >= PARITY_SHARE * n, "\n".join(differ)
    # The optimum is never beaten by the answer it bounds.
    assert all(m.optimal_compliance <= m.ground_truth_compliance * (1 + 1e-12) for m in scored)


def test_second_method_agrees(stored_optima):
    """The NumPy/SciPy re-implementation gives the same optima on a few samples:
    two easy GPT-4o ones and two hard Claude ones (non-0/1 answers)."""
    records, cases, res = stored_optima
    for i in (0, 9, 100, 101):
        ours = reference_method.reference_optimum(cases[i])
        assert ours.compliance == pytest.approx(float(res.compliance[i]), rel=1e-9), i
        np.testing.assert_array_equal(ours.densities, res.densities[i])


def test_claude_file_gets_figures(claude_records, stored_optima, optimum_cache, tmp_path):
    """The older Claude file has no structural figures: rescoring adds them, from
    the same optimum the second method finds, and names the yardstick."""
    records = claude_records[:16]
    path = tmp_path / "claude-3-7-sonnet-20250219" / "10_random_cell_hard_results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(records))
    summary = rescore_tree(tmp_path, cache=optimum_cache)
    assert summary.optimum == "reference" and summary.optimisations == 0
    new = json.loads(path.read_text())
    _, _, res = stored_optima
    for j, rec in enumerate(new):
        assert rec["physically_valid"] is True or rec["optimal_compliance"] is None
        if rec["physically_valid"]:
            assert rec["optimal_compliance"] == pytest.approx(float(res.compliance[100 + j]),
                                                              rel=1e-12)
    agg = json.loads(path.with_name("10_random_cell_hard" + AGGREGATED_SUFFIX).read_text())
    assert agg["optimum"] == "reference"


# ----------------------------------------------------------------------------
# Two yardsticks, never mixed silently.


def test_cache_keys_differ_between_yardsticks(gpt4o_records):
    case = _cases(gpt4o_records[:1])[0]
    ref = optimum_key(case, None, options=yardstick_options("reference"))
    strong = optimum_key(case, None, options=yardstick_options("strong"))
    assert ref != strong
    assert optimum_key(case, None, options=DEFAULT_STRONG) == strong
    assert OptimumCache().yardstick == "reference"
    assert OptimumCache(yardstick="strong").yardstick == "strong"
    with pytest.raises(ValueError):
        yardstick_options("fastest")
    with pytest.raises(ValueError):
        score_batch([], cache=OptimumCache(), optimum="strong")


def test_rescore_reports_a_yardstick_switch(gpt4o_records, stored_optima, optimum_cache,
                                            tmp_path):
    folder = tmp_path / "gpt-4o-2024-08-06"
    folder.mkdir()
    (folder / "full_easy_results.json").write_text(json.dumps(gpt4o_records[:3]))
    agg = folder / ("full_easy" + AGGREGATED_SUFFIX)
    agg.write_text(json.dumps({"optimum": "strong", "model": "gpt-4o"}))
    logged = []
    summary = rescore_tree(tmp_path, cache=optimum_cache, log=logged.append)
    assert summary.switched == [(str(folder / "full_easy_results.json"), "strong")]
    assert any("'strong'" in m and "'reference'" in m for m in logged)
    assert "optimum=reference switched=1" in summary.line()
    new = json.loads(agg.read_text())
    assert new["optimum"] == "reference" and new["model"] == "gpt-4o"
    # Rescoring again with the same yardstick reports nothing.
    again = rescore_tree(tmp_path, cache=optimum_cache)
    assert again.switched == []


def test_one_sample_equals_its_batch(stored_optima):
    """A sample alone (bucket 1) gets the optimum it gets in a batch of 64."""
    _, cases, res = stored_optima
    alone = yardstick.reference_optimum_batch(stack_load_cases([cases[3]]))
    assert float(alone.compliance[0]) == pytest.approx(float(res.compliance[3]), rel=1e-12)
    np.testing.assert_array_equal(alone.densities[0], res.densities[3])
    assert 0 <= int(alone.winner[0]) <= 16


def test_app_selects_the_yardstick(tmp_path):
    """``--optimum`` reaches the app's cache; ``reference`` is the default."""
    from absl import flags

    from sphyr_jax.app import common

    for argv, expected in (([], "reference"), (["--optimum=strong"], "strong"),
                           (["--optimum=reference"], "reference")):
        flags.FLAGS(["sphyr_jax", f"--cache_dir={tmp_path}"] + argv)
        try:
            assert common.cache().yardstick == expected
        finally:
            flags.FLAGS.unparse_flags()
    with pytest.raises(flags.IllegalFlagValueError):
        flags.FLAGS(["sphyr_jax", "--optimum=fastest"])
    flags.FLAGS.unparse_flags()


def test_other_shapes_and_edge_masks_agree_with_second_method():
    """A 4x5 grid: every free cell a design cell, a masked row, and no design
    cell at all (the optimum is then the answer itself)."""
    answer = ["L L 0 0 0", "1 1 1 0 0", "0 1 1 1 0", "S S 0 1 S"]
    inputs = [None,
              ["L L 0 0 0", "V V V V V", "0 1 1 1 0", "S S 0 1 S"],
              answer]
    cases = [load_case_from_grid("\n".join(answer), None if g is None else "\n".join(g))
             for g in inputs]
    res = yardstick.reference_optimum_batch(stack_load_cases(cases))
    for i, case in enumerate(cases):
        theirs = reference_method.reference_optimum(case)
        assert float(res.compliance[i]) == pytest.approx(theirs.compliance, rel=1e-9), i
        np.testing.assert_array_equal(res.densities[i], theirs.densities)
    np.testing.assert_array_equal(res.densities[2], np.asarray(cases[2].pinned))
    assert float(res.compliance[0]) <= float(res.compliance[1]) * (1 + 1e-12)


def test_exact_polish_agrees_with_the_low_rank_polish():
    """The swap polish scored by exact solves (the voxel grids' polish) and the
    published polish scored by Sherman-Morrison-Woodbury updates of one
    factorisation take the same swaps on 2D samples, from perturbed answers."""
    import jax

    from sphyr_jax.fem import fea
    from sphyr_jax.topopt import yardstick_polish

    lines = (SETS / "dataset" / "full_easy.jsonl").read_text().splitlines()[:6]
    records = [json.loads(line) for line in lines]
    cases = stack_load_cases([load_case_from_grid(r["ground_truth"], r["input_grid"])
                              for r in records])
    nb = len(records)
    mask = np.asarray(cases.design_mask).reshape(nb, -1)
    answers = np.asarray(cases.pinned).reshape(nb, -1)
    c_answer = np.asarray(fea.compliance(cases, answers.reshape((nb,) + cases.shape)))
    x = answers.copy()
    rng = np.random.default_rng(0)
    for i in range(nb):
        # Two solid cells out, two empty cells in, still carrying the load (a cut
        # load path makes every ranking a matter of rounding): the polish has work.
        solid = np.flatnonzero(mask[i] & (answers[i] > 0.5))
        empty = np.flatnonzero(mask[i] & (answers[i] < 0.5))
        while True:
            x[i] = answers[i]
            x[i, rng.choice(solid, 2, replace=False)] = 0.0
            x[i, rng.choice(empty, 2, replace=False)] = 1.0
            one = jax.tree.map(lambda a, i=i: a[i:i + 1], cases)
            c = float(fea.compliance(one, x[i].reshape((1,) + cases.shape))[0])
            if c < 2.0 * c_answer[i]:
                break
    static = DEFAULT_REFERENCE.static()
    low_rank = jax.jit(lambda c, z, m: yardstick_polish.polish(c, z, m, static=static))
    exact = jax.jit(lambda c, z, m: yardstick_polish.polish_exact(c, z, m, static=static))
    xa, ca = low_rank(cases, x, mask)
    xb, cb = exact(cases, x, mask)
    np.testing.assert_array_equal(np.asarray(xa), np.asarray(xb))
    np.testing.assert_allclose(np.asarray(ca), np.asarray(cb), rtol=1e-9)
    start = np.asarray(fea.compliance(cases, x.reshape((nb,) + cases.shape)))
    assert np.all(np.asarray(cb) < start)  # every perturbed start was improved
    np.testing.assert_allclose(
        np.asarray(fea.compliance(cases, np.asarray(xb).reshape((nb,) + cases.shape))),
        np.asarray(cb), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(xb).sum(1), x.sum(1))  # swaps keep the budget


def test_a_group_of_completions_is_analysed_as_each_alone():
    """score_batch analyses a group's distinct designs, answers and all-solid
    grids as rows of one call; each completion's figures equal
    ``fea.analyze`` of its design alone (which solves the solid grid beside
    it): several samples, repeated designs, one that carries no load."""
    import random

    from sphyr_jax.fem import fea
    from sphyr_jax.scoring import metrics
    from sphyr_jax.scoring.validation import probe_completions

    lines = (SETS / "dataset" / "full_easy.jsonl").read_text().splitlines()[:3]
    records = [json.loads(line) for line in lines]
    rng = random.Random(3)
    items = []
    for rec in records:
        probes = probe_completions(rec["ground_truth"], rng, hard=False)
        items += [ScoreItem(c, rec["ground_truth"], rec["input_grid"]) for c in probes.values()]
    items.append(items[1])  # a repeated design
    scored = score_batch(items, cache=OptimumCache())
    assert not all(m.load_carrying for m in scored)  # the empty probe carries nothing
    for item, m in zip(items, scored, strict=True):
        reading = metrics._read_items([item], None)
        prepared, (sample,) = reading.prepared[0], reading.samples
        case = sample.case
        alone = fea.analyze(case, prepared.out_rho)
        answer = fea.analyze(case, sample.gt_rho)
        assert m.compliance == pytest.approx(float(alone.compliance), rel=1e-12)
        assert m.load_carrying == bool(alone.load_carrying)
        assert m.max_displacement == pytest.approx(float(alone.max_displacement), rel=1e-12)
        assert m.volume_fraction == float(alone.volume_fraction)
        assert m.ground_truth_compliance == pytest.approx(float(answer.compliance), rel=1e-12)
