"""Training against compliance: random problems, loss, loop, checkpoints, completions."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sphyr_jax import fea, training
from sphyr_jax.grids import densities_from_grid, parse_number
from sphyr_jax.loadcase import load_case_from_grid, stack_load_cases
from sphyr_jax.optimum import OptimumCache, OptimumResult

TINY = training.TrainConfig(
    steps=60, batch_size=8, learning_rate=1e-2, warmup_steps=5, log_every=20, seed=0,
    problem=training.ProblemConfig(shape=(6, 6), load_run=(2, 6), support_run=(2, 4)),
    model=training.ModelConfig(width=8, dilations=(1, 2, 4)))
GRID = [["0", "L", "L", "L", "0"], ["V", "V", "0.3", "V", "V"], ["V", "V", "V", "V", "1"],
        ["V", "1", "V", "V", "V"], ["0", "S", "S", "V", "0"]]


@pytest.fixture(scope="module")
def trained():
    model, curve = training.train(TINY)
    return model, curve


def _leaves(model):
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(model, eqx.is_array))]


def _tokens(case, masked, gt: bool):
    """Ground-truth (gt=True) or masked input token grid of a sampled problem."""
    load, support = np.asarray(case.load_mask), np.asarray(case.support_mask)
    pinned = np.asarray(case.pinned)
    grid = []
    for r in range(load.shape[0]):
        row = []
        for c in range(load.shape[1]):
            if not gt and masked[r, c]:
                row.append("V")
            elif load[r, c]:
                row.append("L")
            elif support[r, c]:
                row.append("S")
            else:
                row.append(f"{pinned[r, c]:g}")
        grid.append(row)
    return grid


def test_sampled_problems_match_grid_load_cases():
    """The traced sampler builds the load case the grid reader builds from the same tokens."""
    cfg = training.ProblemConfig(mask_weights=(1, 1, 1, 1), random_gravity=True,
                                 pool_fraction=1.0)
    k_pool, k_values, k_sample = jax.random.split(jax.random.PRNGKey(4), 3)
    load, support, gravity = jax.vmap(lambda k: training.sample_boundary(k, cfg))(
        jax.random.split(k_pool, 4))
    values = jnp.round(jax.random.uniform(k_values, (4, 10, 10)), 1)  # stand-in designs
    pool = training.Pool(load=load, support=support, gravity=gravity,
                         densities=jnp.where(load | support, 1.0, values))
    case, feats = jax.jit(lambda k: training.sample_problems(k, 24, cfg, pool))(k_sample)
    masked = np.asarray(feats[:, training.CHANNELS.index("masked")]) > 0.5
    kinds_seen = set()
    for i in range(24):
        one = jax.tree.map(lambda a, i=i: np.asarray(a[i]), case)
        gt, inp = _tokens(one, masked[i], True), _tokens(one, masked[i], False)
        ref = load_case_from_grid(gt, inp, one.gravity)
        np.testing.assert_allclose(one.force, ref.force, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(one.free_dofs, ref.free_dofs)
        np.testing.assert_array_equal(one.design_mask, ref.design_mask)
        keep = ~ref.design_mask
        np.testing.assert_allclose(one.pinned[keep], ref.pinned[keep])
        np.testing.assert_allclose(np.asarray(feats[i]), training.grid_features(inp, one.gravity))
        # Full masks: fresh BCs, empty known cells; other masks: a pool design.
        full = masked[i].all(axis=1).tolist() == [False] + [True] * 8 + [False]
        kinds_seen.add(full)
        structural = one.load_mask | one.support_mask
        if full:
            assert not one.pinned[keep & ~structural].any()
        else:
            match = [j for j in range(4) if np.array_equal(one.load_mask, np.asarray(load[j]))
                     and np.allclose(one.pinned[keep], np.asarray(pool.densities[j])[keep])]
            assert match, i
    assert kinds_seen == {True, False}


@pytest.mark.parametrize("kind", training.MASK_KINDS)
def test_masks_and_boundaries_follow_sphyr_variants(kind):
    weights = tuple(float(k == kind) for k in training.MASK_KINDS)
    cfg = training.ProblemConfig(mask_weights=weights, load_run=(3, 10), support_run=(3, 5))
    keys = jax.random.split(jax.random.PRNGKey(1), 64)
    masks = np.asarray(jax.vmap(lambda k: training.sample_mask(k, cfg))(keys))
    load, support, _ = (np.asarray(a) for a in
                        jax.vmap(lambda k: training.sample_boundary(k, cfg))(keys))
    full_rows, full_cols = masks.all(axis=2), masks.all(axis=1)
    for m, rows, cols in zip(masks, full_rows, full_cols, strict=True):
        if kind == "full":
            assert rows.tolist() == [False] + [True] * 8 + [False]
        elif kind == "rows":
            assert not rows[0] and not rows[-1] and rows.sum() in cfg.row_counts
            assert m.sum() == 10 * rows.sum()
        elif kind == "columns":
            assert cols.sum() in cfg.column_counts and m.sum() == 10 * cols.sum()
        else:
            assert 1 <= m.sum() <= max(cfg.cell_counts)
    for lo, hi, mask, row in ((3, 10, load, 0), (3, 5, support, 9)):
        assert not np.delete(mask, row, axis=1).any()
        runs = mask[:, row]
        lengths = runs.sum(axis=1)
        assert lengths.min() >= lo and lengths.max() <= hi and len(set(lengths)) > 2
        first = runs.argmax(axis=1)
        assert all(runs[i, first[i]:first[i] + lengths[i]].all() for i in range(len(runs)))


def test_training_lowers_the_loss_with_finite_gradients(trained):
    model, curve = trained
    step_fn = training.make_train_step(TINY)  # compiled by the fixture's run
    start = training.init_model(TINY.model, jax.random.split(jax.random.PRNGKey(0), 3)[0])
    opt_state = training.make_optimizer(TINY).init(eqx.filter(start, eqx.is_array))
    final = jnp.asarray(TINY.steps - 1, jnp.float64)  # final objective: p = 3, rounded term on
    key = jax.random.PRNGKey(99)  # the same held-out batch for both models
    moved, _, before, aux0 = step_fn(start, opt_state, key, final, None)
    _, _, after, aux1 = step_fn(model, opt_state, key, final, None)
    for aux in (aux0, aux1):
        assert np.isfinite(float(aux["grad_norm"])) and float(aux["grad_norm"]) > 0
    assert all(np.all(np.isfinite(x)) for x in _leaves(moved))
    assert float(after) < float(before) - 1.0, (float(before), float(after))
    assert float(aux1["carrying"]) > 0.9
    assert [e["step"] for e in curve] == [20, 40, 60]
    assert all(np.isfinite(e["loss"]) and np.isfinite(e["grad_norm"]) for e in curve)


def test_same_seed_same_parameters(trained):
    model, _ = trained
    again, _ = training.train(TINY)
    for a, b in zip(_leaves(model), _leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    other, _ = training.train(dataclasses.replace(TINY, seed=1))
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(model), _leaves(other),
                                                        strict=True))


def test_checkpoint_round_trip(trained, tmp_path):
    model, _ = trained
    training.save_checkpoint(tmp_path, model, TINY.model)
    loaded = training.load_checkpoint(tmp_path)
    feats = jnp.asarray(training.grid_features(GRID)[None])
    np.testing.assert_array_equal(np.asarray(training.predict(model, feats)),
                                  np.asarray(training.predict(loaded, feats)))
    for a, b in zip(_leaves(model), _leaves(loaded), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("hard", [False, True])
def test_completions_keep_known_cells_and_use_the_format(trained, hard):
    model, _ = trained
    grid = GRID
    out = training.complete_grid(model, grid, hard)
    assert [len(r) for r in out] == [5] * 5
    for row_in, row_out in zip(grid, out, strict=True):
        for t_in, t_out in zip(row_in, row_out, strict=True):
            if t_in != "V":
                assert t_out == t_in
            elif hard:
                value = parse_number(t_out)
                assert 0.0 <= value <= 1.0 and len(t_out.split(".")[1]) == 1
            else:
                assert t_out in ("0", "1")
    rotated = {"input_grid": grid, "ground_truth": grid, "gravity_dir": [0, 1]}
    assert training.complete_records(model, [rotated], hard)[0] == training.complete_grid(
        model, grid, hard, (0, 1))
    down = training.grid_features(grid)
    side = training.grid_features(grid, (0, 1))
    assert not np.allclose(np.asarray(training.predict(model, jnp.asarray(down[None]))),
                           np.asarray(training.predict(model, jnp.asarray(side[None]))))


_compliance = jax.jit(fea.compliance)


class AnswerAsOptimum(OptimumCache):
    """Test double: the dataset answer stands in for the reference optimum (no SIMP)."""

    def get_many(self, cases, seeds=None, progress=None):
        rho = np.stack([np.asarray(s) for s in seeds])
        c = np.asarray(_compliance(stack_load_cases(cases), rho))
        return OptimumResult(densities=rho, compliance=c, volume_fraction=rho.mean(axis=(1, 2)),
                             iterations=np.zeros(len(c), int), converged=np.ones(len(c), bool))


def test_evaluate_scores_completions_physically(trained, full_easy_records):
    model, _ = trained
    records = [dict(r) for r in full_easy_records[:3]]
    records[2]["gravity_dir"] = [0, 1]
    cache = AnswerAsOptimum()
    result = training.evaluate(model, records, hard=False, cache=cache)
    assert result["samples"] == 3
    assert result["completions"][2] == training.complete_grid(
        model, records[2]["input_grid"], False, (0, 1))
    # Independent truth: compliances of the completions and answers by direct FEA.
    cases = [load_case_from_grid(r["ground_truth"], r["input_grid"], r.get("gravity_dir", (1, 0)))
             for r in records]
    rho = np.stack([densities_from_grid(c)[0] for c in result["completions"]])
    gt = np.stack([case.pinned for case in cases])
    c, c_gt, c_solid = (np.asarray(_compliance(stack_load_cases(cases), x))
                        for x in (rho, gt, np.ones_like(gt)))
    for i, m in enumerate(result["per_record"]):
        assert m["compliance"] == pytest.approx(c[i], rel=1e-9)
        assert m["load_carrying"] == bool(c[i] <= 1e3 * c_solid[i])
        expected = min(c_gt[i] / c[i], 1.0) * min(1.0, gt[i].mean() / rho[i].mean())
        assert m["topology_score"] == pytest.approx(expected if m["load_carrying"] else 0.0,
                                                    rel=1e-9)
    assert result["topology_score"] == pytest.approx(
        np.mean([m["topology_score"] for m in result["per_record"]]))
    # Trivial completions: all-solid always carries; with rows 1..8 empty the
    # top-row load cannot reach the bottom-row supports.
    assert training.fill_baseline(records, "1", cache)["load_carrying"] == 1.0
    empty = training.fill_baseline(records, "0", cache)
    assert empty["load_carrying"] == 0.0 and empty["topology_score"] == 0.0
