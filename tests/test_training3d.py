"""Training on voxel grids: the same sampler, model, loss and evaluation as 2D.

Truths: the grid reader's load cases (an independent NumPy construction), the
converter's mask definitions, finite differences of the loss, and the mirror
symmetry of the physics.
"""

import dataclasses
import itertools
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SETS

from sphyr_jax import training
from sphyr_jax.problem.grids import InvalidProblemError
from sphyr_jax.problem.loadcase import load_case_from_grid

SHAPE = (6, 6, 6)
PROBLEM = training.ProblemConfig(shape=SHAPE, load_run=(2, 4), support_run=(2, 5),
                                 direction_weights=(1, 0, 0, 0), pool_size=4,
                                 pool_iterations=5)
TINY3D = training.TrainConfig(
    steps=12, batch_size=4, learning_rate=1e-2, warmup_steps=2, log_every=6, seed=0,
    problem=dataclasses.replace(PROBLEM, variant_weights=(0,) * 7 + (1,)),  # full: no pool
    model=training.ModelConfig(width=6, dilations=(1, 2), ndim=3))
CH = training.problems.CHANNELS_3D


def _tokens(case, masked, gt: bool):
    """Token layers of a sampled voxel problem (answer, or input with V cells)."""
    load, support = np.asarray(case.load_mask), np.asarray(case.support_mask)
    pinned = np.asarray(case.pinned)
    out = np.empty(load.shape, dtype=object)
    for idx in np.ndindex(*load.shape):
        if not gt and masked[idx]:
            out[idx] = "V"
        elif load[idx]:
            out[idx] = "L"
        elif support[idx]:
            out[idx] = "S"
        else:
            out[idx] = f"{pinned[idx]:g}"
    return out.tolist()


@pytest.fixture(scope="module")
def sampled():
    k_pool, k_values, k_sample = jax.random.split(jax.random.PRNGKey(3), 3)
    load, support, _ = jax.vmap(lambda k: training.sample_boundary(k, PROBLEM))(
        jax.random.split(k_pool, 4))
    values = jax.random.uniform(k_values, (4,) + SHAPE)
    pool = training.Pool(load=load, support=support,
                         densities=jnp.where(load | support, 1.0, values))
    return jax.jit(lambda k: training.sample_problems(k, 24, PROBLEM, pool))(k_sample)


def test_voxel_problems_match_grid_load_cases(sampled):
    """The traced 3D sampler builds the load case the grid reader builds from the same
    tokens: loads on the top layer, supports on the bottom layer, gravity down."""
    case, feats, info = sampled
    masked = np.asarray(feats[:, CH.index("masked")]) > 0.5
    assert feats.shape == (24, len(CH)) + SHAPE
    for i in range(24):
        one = jax.tree.map(lambda a, i=i: np.asarray(a[i]), case)
        gt, inp = _tokens(one, masked[i], True), _tokens(one, masked[i], False)
        ref = load_case_from_grid(gt, inp, (1, 0, 0), ndim=3)
        np.testing.assert_allclose(one.force, ref.force, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(one.free_dofs, ref.free_dofs)
        np.testing.assert_array_equal(one.design_mask, ref.design_mask)
        np.testing.assert_allclose(np.asarray(feats[i]), training.grid_features(inp))
        np.testing.assert_array_equal(one.gravity, [1.0, 0.0, 0.0])
        assert one.load_mask.any() and not one.load_mask[1:].any()
        assert one.support_mask.any() and not one.support_mask[:-1].any()
        # each patch is a rectangle of the configured side lengths
        for mask, (lo, hi) in ((one.load_mask[0], PROBLEM.load_run),
                               (one.support_mask[-1], PROBLEM.support_run)):
            rows, cols = np.nonzero(mask)
            h, w = np.ptp(rows) + 1, np.ptp(cols) + 1
            assert mask.sum() == h * w and lo <= h <= hi and lo <= w <= hi
    assert set(np.asarray(info.direction).tolist()) == {0}


@pytest.mark.parametrize("variant", training.MASK_VARIANTS)
def test_voxel_masks_follow_the_converter_variants(variant):
    """Masks drawn like ``convert.mask_grid_3d``: cells anywhere, rows of interior
    layers, vertical columns through every layer, full interior layers."""
    index = training.MASK_VARIANTS.index(variant)
    masks = np.asarray(jax.vmap(lambda k: training.problems.variant_mask(k, index, SHAPE))(
        jax.random.split(jax.random.PRNGKey(7), 16)))
    nz, ny, nx = SHAPE
    n = 0 if variant == "full" else int(variant.split("_")[0])
    for m in masks:
        if variant == "full":
            assert m[1:-1].all() and not m[0].any() and not m[-1].any()
        elif variant.endswith("row"):
            rows = m.all(axis=2)  # (nz, ny): whole rows
            assert rows.sum() == n and m.sum() == n * nx
            assert not rows[0].any() and not rows[-1].any()
        elif variant.endswith("column"):
            cols = m.all(axis=0)  # (ny, nx): whole vertical columns
            assert cols.sum() == n and m.sum() == n * nz
        else:
            assert 1 <= m.sum() <= n and (n == 1) == (m.sum() == 1)
    if variant.endswith("cell") and n > 1:  # draws reach every layer over the samples
        assert masks.any(axis=(0, 2, 3)).sum() >= 3


@pytest.fixture(scope="module")
def trained3d():
    return training.train(TINY3D)


def test_voxel_loss_gradient_matches_finite_differences(sampled):
    """d loss / d parameters of a 3D model (Conv3d through the multigrid CG) along a
    random direction equals a central difference."""
    case, feats, info = sampled
    sub = jax.tree.map(lambda a: a[:3], (case, feats, info))
    model = training.init_model(TINY3D.model, 1)
    params, static = eqx.partition(model, eqx.is_array)
    direction = jax.tree.map(lambda a: jax.random.normal(jax.random.PRNGKey(a.size), a.shape),
                             params)

    batch = training.TrainBatch(sub[0], sub[1], sub[2].hard)

    def loss(p):  # progress 0.1: before the straight-through rounded term starts
        m = eqx.combine(p, static)
        return training.batch_loss(m, batch, 0.1, TINY3D.loss)[0]

    g = jax.grad(loss)(params)
    dd = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(direction),
                                            strict=True))
    h = 1e-5
    shift = lambda s: jax.tree.map(lambda a, d: a + s * h * d, params, direction)  # noqa: E731
    fd = (loss(shift(1.0)) - loss(shift(-1.0))) / (2 * h)
    np.testing.assert_allclose(float(dd), float(fd), rtol=1e-5)


def test_voxel_training_lowers_the_loss_and_the_model_is_mirror_equivariant(trained3d):
    model, curve = trained3d
    step_fn = training.make_train_step(TINY3D)
    start = training.init_model(TINY3D.model, jax.random.split(jax.random.PRNGKey(0), 3)[0])
    opt_state = training.make_optimizer(TINY3D).init(eqx.filter(start, eqx.is_array))
    final = jnp.asarray(TINY3D.steps - 1, jnp.float64)
    held_out = training.CanonicalSource(TINY3D, jax.random.PRNGKey(99)).batch(0)  # both models
    _, _, before, _ = step_fn(start, opt_state, held_out, final)
    _, _, after, aux = step_fn(model, opt_state, held_out, final)
    assert np.isfinite(float(aux["grad_norm"]))
    assert float(after) < float(before) - 1.0, (float(before), float(after))
    assert float(aux["carrying"]) > 0.9
    assert [e["step"] for e in curve] == [6, 12]
    # Mirroring a voxel problem left-right mirrors the completion exactly.
    _, feats, _ = training.sample_problems(jax.random.PRNGKey(5), 2, PROBLEM)
    mirrored = jnp.flip(feats, axis=-1).at[:, -1].multiply(-1.0)
    a = training.predict(model, feats)
    b = training.predict(model, mirrored)
    np.testing.assert_allclose(np.asarray(jnp.flip(b, axis=-1)), np.asarray(a), rtol=0,
                               atol=1e-12)


def test_voxel_completions_keep_known_cells_and_score(trained3d):
    """A 3D model completes a record of the embedded voxel dataset: known tokens kept,
    V cells filled in the format."""
    model, _ = trained3d
    path = SETS / "dataset_3d" / "1_random_row_hard_3d.jsonl"
    rec = json.loads(path.read_text().splitlines()[0])
    # A model of another grid size still runs: convolutions are size-agnostic.
    done = training.complete_records(model, [rec], hard=True)[0]
    for layer_in, layer_out in zip(rec["input_grid"], done, strict=True):
        for row_in, row_out in zip(layer_in, layer_out, strict=True):
            for t_in, t_out in zip(row_in, row_out, strict=True):
                if t_in == "V":
                    assert t_out == f"{round(float(t_out), 1):.1f}"
                else:
                    assert t_out == t_in
    # Folders without a direction tag give the 2D default, which means down here too.
    assert training.complete_grids(model, [rec["input_grid"]], hard=True,
                                   gravity_dirs=[(1, 0)])[0] == done
    with pytest.raises(InvalidProblemError):
        training.grid_features(rec["input_grid"], (0, 1))
    assert sum(t == "V" for t in itertools.chain.from_iterable(
        itertools.chain.from_iterable(rec["input_grid"]))) == 10


def test_voxel_baselines_fill_every_masked_voxel(optimum_cache):
    """The leaderboard's empty / solid baselines on a voxel record: every V voxel
    filled, the empty fill carries nothing, the solid one scores its material
    efficiency (structural efficiency 1)."""
    rec = json.loads((SETS / "dataset_3d" / "full_easy_3d.jsonl").read_text()
                     .splitlines()[1])
    solid = training.evaluation.fill_masked(rec["input_grid"], "1")
    flat_in = list(itertools.chain.from_iterable(itertools.chain.from_iterable(
        rec["input_grid"])))
    flat_out = list(itertools.chain.from_iterable(itertools.chain.from_iterable(solid)))
    assert "V" not in flat_out and len(flat_out) == len(flat_in) == 1000
    assert all(o == i for i, o in zip(flat_in, flat_out, strict=True) if i != "V")
    empty_scores = training.fill_baseline([rec], "0", cache=optimum_cache)
    solid_scores = training.fill_baseline([rec], "1", cache=optimum_cache)
    assert empty_scores["topology_score"] == 0.0 and empty_scores["load_carrying"] == 0.0
    m = solid_scores["per_record"][0]
    assert m["load_carrying"] and m["structural_efficiency"] == 1.0
    np.testing.assert_allclose(m["topology_score"], m["material_efficiency"], rtol=1e-12)
    assert 0.0 < m["topology_score"] < 1.0
