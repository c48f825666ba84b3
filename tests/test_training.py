"""Training against compliance: random problems, loss, loop, checkpoints, completions."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import EIGHT, SETS, assert_dihedral_equivariance, symmetry_image, token_grid

from sphyr_jax import training
from sphyr_jax.evaluation.baselines import write_baseline_results
from sphyr_jax.fem import fea
from sphyr_jax.problem.grids import densities_from_grid, parse_number
from sphyr_jax.problem.loadcase import load_case_from_grid, stack_load_cases
from sphyr_jax.problem.symmetry import (
    AXIS_DIRECTIONS,
    transform_record,
    turn_records,
)
from sphyr_jax.topopt.optimum import OptimumCache, OptimumResult

TINY = training.TrainConfig(
    steps=60, batch_size=8, learning_rate=1e-2, warmup_steps=5, log_every=20, seed=0,
    problem=training.ProblemConfig(shape=(6, 6), load_run=(2, 6), support_run=(2, 4),
                                   variant_weights=(0,) * 7 + (1,)),  # full masks: no pool
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
    return token_grid(case.load_mask, case.support_mask, case.pinned, None if gt else masked)


def _on_edge(mask: np.ndarray, edge: str) -> bool:
    """Whether a mask is non-empty and lies entirely on one grid edge."""
    rows, cols = np.nonzero(mask)
    n = mask.shape[0] - 1
    line = {"top": rows == 0, "bottom": rows == n, "left": cols == 0, "right": cols == n}[edge]
    return len(rows) > 0 and bool(np.all(line))


_TOWARDS = {0: "bottom", 1: "right", 2: "top", 3: "left"}  # edge a direction points to
_AWAY = {0: "top", 1: "left", 2: "bottom", 3: "right"}


def test_sampled_problems_match_grid_load_cases():
    """The traced sampler builds the load case the grid reader builds from the same tokens;
    loads sit on the edge opposite the supports, the load pushing towards them."""
    cfg = training.ProblemConfig(pool_fraction=0.5)
    k_pool, k_values, k_sample = jax.random.split(jax.random.PRNGKey(4), 3)
    load, support, _ = jax.vmap(lambda k: training.sample_boundary(k, cfg))(
        jax.random.split(k_pool, 4))
    values = jax.random.uniform(k_values, (4, 10, 10))  # stand-in designs
    pool = training.Pool(load=load, support=support,
                         densities=jnp.where(load | support, 1.0, values))
    case, feats, info = jax.jit(lambda k: training.sample_problems(k, 32, cfg, pool))(k_sample)
    masked = np.asarray(feats[:, training.CHANNELS.index("masked")]) > 0.5
    for i in range(32):
        one = jax.tree.map(lambda a, i=i: np.asarray(a[i]), case)
        gt, inp = _tokens(one, masked[i], True), _tokens(one, masked[i], False)
        ref = load_case_from_grid(gt, inp, one.gravity)
        np.testing.assert_allclose(one.force, ref.force, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(one.free_dofs, ref.free_dofs)
        np.testing.assert_array_equal(one.design_mask, ref.design_mask)
        keep = ~ref.design_mask
        np.testing.assert_allclose(one.pinned[keep], ref.pinned[keep])
        np.testing.assert_allclose(np.asarray(feats[i]), training.grid_features(inp, one.gravity))
        d = int(info.direction[i])
        np.testing.assert_array_equal(one.gravity, np.asarray(AXIS_DIRECTIONS[d], float))
        assert _on_edge(one.load_mask, _AWAY[d]) and _on_edge(one.support_mask, _TOWARDS[d])
        known = one.pinned[~(one.load_mask | one.support_mask)]
        if bool(info.hard[i]):
            np.testing.assert_allclose(known, np.round(known, 1), atol=1e-12)
        else:
            assert set(np.unique(known)) <= {0.0, 1.0}


def _canonical(mask, direction, mirrored):
    """Undo the sampler's turn and mirror."""
    m = np.rot90(mask, -direction)
    return np.flip(m, 1) if mirrored else m


def _check_variant(mask, variant):
    """A canonical mask has the shape SPhyR's generator gives the variant."""
    n, kind = (10, "full") if variant == "full" else (int(variant.split("_")[0]),
                                                       variant.split("_")[-1])
    rows, cols = mask.all(axis=1), mask.all(axis=0)
    if kind == "full":
        assert rows.tolist() == [False] + [True] * 8 + [False] and mask.sum() == 80
    elif kind == "row":
        assert not rows[0] and not rows[-1] and rows.sum() == n and mask.sum() == 10 * n
    elif kind == "column":
        assert cols.sum() == n and mask.sum() == 10 * n
    else:
        assert 1 <= mask.sum() <= n and (n == 1) == (mask.sum() == 1)


def test_sampler_draws_every_variant_format_and_direction_at_the_configured_frequencies():
    weights = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
    dirs = (4.0, 3.0, 2.0, 1.0)
    cfg = training.ProblemConfig(variant_weights=weights, hard_fraction=0.3,
                                 direction_weights=dirs, mirror_fraction=0.4)
    n = 4000
    case, feats, info = jax.jit(lambda k: training.sample_problems(k, n, cfg))(
        jax.random.PRNGKey(7))
    variant, hard, direction, mirrored = (np.asarray(a) for a in (
        info.variant, info.hard, info.direction, info.mirrored))

    def close(count, p):  # binomial count within 4.5 standard deviations
        assert abs(count - n * p) <= 4.5 * np.sqrt(n * p * (1 - p)), (count, n * p)

    for v in range(8):
        close((variant == v).sum(), weights[v] / sum(weights))
    for d in range(4):
        close((direction == d).sum(), dirs[d] / sum(dirs))
    close(hard.sum(), 0.3)
    close(mirrored.sum(), 0.4)
    # The labels describe the problems: gravity, masks (after undoing turn and mirror).
    masked = np.asarray(feats[:, training.CHANNELS.index("masked")]) > 0.5
    gravity = np.asarray(case.gravity)
    for i in range(0, n, 7):
        np.testing.assert_array_equal(gravity[i], np.asarray(AXIS_DIRECTIONS[direction[i]], float))
        _check_variant(_canonical(masked[i], direction[i], mirrored[i]),
                       training.MASK_VARIANTS[variant[i]])


@pytest.mark.parametrize("variant", training.MASK_VARIANTS)
def test_masks_and_boundaries_follow_sphyr_variants(variant):
    weights = tuple(float(v == variant) for v in training.MASK_VARIANTS)
    cfg = training.ProblemConfig(variant_weights=weights, load_run=(3, 10), support_run=(3, 5))
    keys = jax.random.split(jax.random.PRNGKey(1), 64)
    masks = np.asarray(jax.vmap(lambda k: training.sample_mask(k, cfg))(keys))
    load, support, gravity = (np.asarray(a) for a in
                              jax.vmap(lambda k: training.sample_boundary(k, cfg))(keys))
    for m in masks:
        _check_variant(m, variant)
    np.testing.assert_array_equal(gravity, np.tile([1.0, 0.0], (64, 1)))
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
    held_out = training.CanonicalSource(TINY, jax.random.PRNGKey(99)).batch(0)  # both models
    moved, _, before, aux0 = step_fn(start, opt_state, held_out, final)
    _, _, after, aux1 = step_fn(model, opt_state, held_out, final)
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
    out = training.complete_grid(model, grid, hard=hard)
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
    assert training.complete_records(model, [rotated], hard=hard)[0] == training.complete_grid(
        model, grid, hard=hard, gravity_dir=(0, 1))
    down = training.grid_features(grid)
    side = training.grid_features(grid, (0, 1))
    assert not np.allclose(np.asarray(training.predict(model, jnp.asarray(down[None]))),
                           np.asarray(training.predict(model, jnp.asarray(side[None]))))


_compliance = jax.jit(fea.compliance)


class AnswerAsOptimum(OptimumCache):
    """Test double: the dataset answer stands in for the reference optimum (no SIMP)."""

    def get_many(self, cases, seeds=None, *, progress=None, stored=None):
        rho = np.stack([np.asarray(s) for s in seeds])
        c = np.asarray(_compliance(stack_load_cases(cases), rho))
        return OptimumResult(densities=rho, compliance=c, volume_fraction=rho.mean(axis=(1, 2)),
                             iterations=np.zeros(len(c), int), converged=np.ones(len(c), bool))


def test_complete_and_score_scores_completions_physically(trained, full_easy_records):
    model, _ = trained
    records = [dict(r) for r in full_easy_records[:3]]
    records[2]["gravity_dir"] = [0, 1]
    cache = AnswerAsOptimum()
    result = training.complete_and_score(model, records, hard=False, cache=cache)
    assert result["samples"] == 3
    assert result["completions"][2] == training.complete_grid(
        model, records[2]["input_grid"], hard=False, gravity_dir=(0, 1))
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
    assert training.fill_baseline(records, "1", cache=cache)["load_carrying"] == 1.0
    empty = training.fill_baseline(records, "0", cache=cache)
    assert empty["load_carrying"] == 0.0 and empty["topology_score"] == 0.0


# ---------------------------------------------------------------------------
# Symmetry: turned / mirrored problems through the model and the evaluation path.

TRANSFORMS = [(k, None) for k in range(1, 4)] + [(0, 1), (3, 0)]  # (turns, mirror axis)


def _transform_tokens(grid, k, mirror):
    a = np.array(grid, dtype=object)
    return np.rot90(np.flip(a, mirror) if mirror is not None else a, k).tolist()


@pytest.fixture(scope="module")
def data_records():
    from sphyr_jax.data.datasets import load_subject

    return {s: load_subject(str(SETS / "dataset"), s, limit=3)
            for s in ("full_easy", "full_hard", "3_random_column_hard", "5_random_cell_easy")}


def test_canonical_element_takes_every_direction_into_the_sector():
    """An axis direction goes to down, a diagonal to down-right, any other direction into the
    sector r >= c >= 0; the stabiliser keeps the canonical direction (brute force over the
    eight symmetries: it is the only other one that does)."""
    from sphyr_jax.problem import symmetry as sym

    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 2 * np.pi, 16)
    extra = [(np.cos(a), np.sin(a)) for a in angles]
    for i, g in enumerate(EIGHT + extra):
        g = np.asarray(g, np.float64) / np.linalg.norm(g)
        m, k = sym.canonical_element(jnp.asarray(g))
        c = np.asarray(sym.transform_vector(jnp.asarray(g), m, k))
        assert c[0] >= c[1] >= 0
        if i < 8:  # an axis direction goes to down, a diagonal to down-right
            np.testing.assert_array_equal(c, [1.0, 0.0] if i < 4 else [abs(g[0])] * 2)
        keeps = [(mm, kk) for mm, kk in sym.ELEMENTS
                 if np.array_equal(np.asarray(sym.transform_vector(jnp.asarray(c), mm, kk)), c)]
        sm, sk = sym.stabiliser(jnp.asarray(c))
        assert (bool(sm), int(sk)) in keeps
        assert len(keeps) == (2 if (c[1] == 0 or c[0] == c[1]) else 1)
        # The planes move like np.rot90(np.fliplr(.)) and the inverse undoes them.
        x = rng.random((3, 5, 5))
        y = np.asarray(sym.transform_planes(jnp.asarray(x), m, k))
        np.testing.assert_array_equal(y, symmetry_image(x.transpose(1, 2, 0), bool(m), int(k))
                                      .transpose(2, 0, 1))
        np.testing.assert_array_equal(
            np.asarray(sym.transform_planes(jnp.asarray(y), *sym.inverse_element(m, k))), x)


def _random_model(width=6, **options):
    net = training.init_model(dataclasses.replace(TINY.model, width=width, **options), 3)
    return eqx.tree_at(lambda m: m.head.weight, net, jax.random.normal(
        jax.random.PRNGKey(5), net.head.weight.shape))  # a non-constant output


def test_model_is_exactly_equivariant_under_the_eight_symmetries(data_records):
    """Eight directions (axes and diagonals) x eight symmetries, on a 10x10 and a 20x20
    grid, for a random untrained model: bit for bit (the shipped trained model gets the
    same check in test_pretrained.py)."""
    from sphyr_jax.data.datasets import load_subject

    v2_20 = load_subject(str(SETS / "dataset_v2_20"), "5_random_cell_easy", limit=1)
    assert_dihedral_equivariance(_random_model(),
                                 [data_records["3_random_column_hard"][1], v2_20[0]])
    # With the finite elements' energy channel (computed in the canonical frame) too.
    assert_dihedral_equivariance(_random_model(energy_channel=True),
                                 [data_records["full_hard"][0]])
    # The bare conv net (no symmetrisation) with the same weights is not equivariant.
    full = _random_model()
    rec = data_records["3_random_column_hard"][1]
    base = jnp.asarray(training.grid_features(rec["input_grid"]))
    r = transform_record(rec, 1)
    z0 = np.asarray(full.net(base))
    z1 = np.asarray(full.net(jnp.asarray(training.grid_features(r["input_grid"],
                                                                r["gravity_dir"]))))
    assert np.abs(z1 - np.rot90(z0)).max() > 1e-3


def test_turned_problem_scores_the_same_through_the_evaluation_path(trained, data_records):
    """Compliances (completion, answer, solid) and scores of a turned or mirrored record equal
    the original's to 1e-10: sampling, completion, load case, FEA and metrics."""
    model, _ = trained
    cache = AnswerAsOptimum()
    checked = 0
    for subject, records in data_records.items():
        hard = subject.endswith("_hard")
        base = training.complete_and_score(model, records, hard=hard, cache=cache)
        solid = training.fill_baseline(records, "1", cache=cache)["per_record"]
        for k, mirror in TRANSFORMS:
            moved = [transform_record(r, k, mirror=mirror) for r in records]
            out = training.complete_and_score(model, moved, hard=hard, cache=cache)
            assert out["completions"] == [_transform_tokens(c, k, mirror)
                                          for c in base["completions"]]
            moved_solid = training.fill_baseline(moved, "1", cache=cache)["per_record"]
            for a, b in zip(base["per_record"] + solid, out["per_record"] + moved_solid,
                            strict=True):
                assert b["load_carrying"] == a["load_carrying"]
                # Designs that carry the load are well conditioned: 1e-10.  A design
                # that drops the load is held by E_min = 1e-9 cells only (c ~ 1e9,
                # cond(K) ~ 1e18): its compliance is reproducible to ~1e-5 only.
                rel = 1e-10 if a["load_carrying"] else 1e-4
                assert b["compliance"] == pytest.approx(a["compliance"], rel=rel)
                # The largest displacement may sit on a node held by void cells only.
                assert b["max_displacement"] == pytest.approx(a["max_displacement"],
                                                              rel=max(rel, 1e-6))
                for name in ("ground_truth_compliance", "optimal_compliance",
                             "topology_score", "volume_fraction"):
                    assert b[name] == pytest.approx(a[name], rel=1e-10, abs=1e-300), name
                checked += a["load_carrying"]
    assert checked >= 40  # most records (solid fills included) carry the load


@pytest.mark.parametrize("hard", [False, True])
def test_completions_keep_known_cells_and_format_in_every_direction(trained, data_records, hard):
    model, _ = trained
    records = data_records["full_hard" if hard else "full_easy"] + data_records[
        "3_random_column_hard" if hard else "5_random_cell_easy"]
    for k in range(4):
        moved = turn_records(records, k)
        for rec, out in zip(moved, training.complete_records(model, moved, hard=hard), strict=True):
            assert np.array(out).shape == (10, 10)
            for t_in, t_out in zip(np.ravel(rec["input_grid"]), np.ravel(out), strict=True):
                if t_in != "V":
                    assert t_out == t_in
                elif hard:
                    assert 0.0 <= parse_number(t_out) <= 1.0 and len(t_out.split(".")[1]) == 1
                else:
                    assert t_out in ("0", "1")


def test_embedded_turned_datasets_match_the_turned_records():
    """The embedded dataset_<n>_rotations hold dataset turned with the direction their name
    encodes."""
    from sphyr_jax.data.datasets import list_subjects, load_subject
    from sphyr_jax.problem.loadcase import gravity_from_folder

    for tag, k in (("3_rotations", 1), ("2_rotations", 2), ("1_rotations", 3)):
        folder = SETS / f"dataset_{tag}"
        for subject in list_subjects():
            turned = load_subject(str(folder), subject)
            original = load_subject(str(SETS / "dataset"), subject)
            assert len(turned) == len(original) == 20
            for a, b in zip(original, turned, strict=True):
                assert b["gravity_dir"] == list(gravity_from_folder(folder.name))
                assert b["input_grid"] == np.rot90(np.array(a["input_grid"]), k).tolist()
                assert b["ground_truth"] == np.rot90(np.array(a["ground_truth"]), k).tolist()


def test_leaderboard_scores_every_group_beside_baselines_and_stored_completions(
        trained, tmp_path):
    """One batched call scores model, baselines and stored completions; the stored ``solid``
    baseline (read from a results tree) scores exactly like the leaderboard's own solid fill."""
    model, _ = trained
    subjects = ["full_easy", "1_random_row_hard"]
    groups = training.load_dataset_groups([SETS / "dataset", SETS / "dataset_3_rotations"],
                                          subjects, limit=2)
    assert {(g.subject, g.direction) for g in groups} == {
        (s, d) for s in subjects for d in ("down", "right")}
    groups = training.add_turned_groups(groups)
    assert len(groups) == 8 and {g.source for g in groups} == {"dataset"}
    write_baseline_results(SETS / "dataset", tmp_path / "results", models=("solid",))
    stored = training.load_results_groups(tmp_path / "results", subjects, limit=2)
    solid_stored = [g for g in stored if "solid" in g.others]
    assert len(solid_stored) == 2 and all(g.direction == "down" for g in solid_stored)
    board = training.build_leaderboard(model, groups + solid_stored, AnswerAsOptimum())
    rows = {(r["source"], r["subject"], r["direction"]): r for r in board["rows"]}
    for subject in subjects:
        ours = rows[("dataset", subject, "down")]
        theirs = rows[("results:solid", subject, "down")]
        assert theirs["solid"] == theirs["solid"] and theirs["samples"] == 2
        assert theirs["solid"]["topology_score"] == pytest.approx(
            ours["solid"]["topology_score"], rel=1e-12)
        for d in ("right", "up", "left"):  # the model is equivariant: same means everywhere
            other = rows[("dataset", subject, d)]
            for name in ("model", "empty", "solid"):
                for metric in ("topology_score", "load_carrying"):
                    assert other[name][metric] == pytest.approx(ours[name][metric], rel=1e-10)
    assert rows[("dataset", "full_easy", "down")]["empty"]["load_carrying"] == 0.0
    files = training.write_leaderboard(board, tmp_path)
    text = files["markdown"].read_text()
    assert "### dataset: model" in text and "| full_easy |" in text and "right" in text
    assert files["plot:dataset"].stat().st_size > 1000


def test_energy_field_is_each_cells_strain_energy_by_a_dense_second_method():
    """The energy channel equals $\\log(1 + e_i / \\bar e)$ with $e_i = u^T K_i u$ read off
    the dense stiffness matrix (K with cell i emptied subtracted from K), the input's
    masked cells solid; a turned input gets the turned field (to rounding)."""
    feats = jnp.asarray(training.grid_features(GRID))
    field = np.asarray(training.energy_field(feats))
    load, support, masked = (np.asarray(feats[i]) > 0.5 for i in range(3))
    rho = np.where(masked, 1.0, np.asarray(feats[3]))
    case, _ = training.build_problem(jnp.asarray(load), jnp.asarray(support),
                                     jnp.asarray([1.0, 0.0]), jnp.asarray(rho),
                                     jnp.zeros(load.shape, bool))
    k = fea.dense_stiffness(case, rho)
    free = np.asarray(case.free_dofs)
    f = np.asarray(case.force)
    u = np.zeros_like(f)
    u[free] = np.linalg.solve(k[np.ix_(free, free)], f[free])
    e = np.zeros(rho.shape)
    for idx in np.ndindex(rho.shape):
        emptied = rho.copy()
        emptied[idx] = 0.0
        e[idx] = u @ (k - fea.dense_stiffness(case, emptied)) @ u
    np.testing.assert_allclose(field, np.log1p(e / e.mean()), rtol=1e-7, atol=1e-9)
    assert np.isclose(e.sum(), float(fea.compliance(case, rho)), rtol=1e-9)
    turned = transform_record({"input_grid": GRID, "ground_truth": GRID}, 1)
    other = np.asarray(training.energy_field(jnp.asarray(
        training.grid_features(turned["input_grid"], turned["gravity_dir"]))))
    np.testing.assert_allclose(other, np.rot90(field), rtol=1e-9, atol=1e-12)
    # Nothing carried (no visible support): zeros, not NaN.
    bare = [[t if t != "S" else "0" for t in row] for row in GRID]
    np.testing.assert_array_equal(training.energy_field(jnp.asarray(
        training.grid_features(bare))), np.zeros(rho.shape))


def test_a_completion_that_drops_its_load_is_decoded_again_until_it_carries(data_records):
    """``carry``: a completion the scorer finds not load carrying becomes the first design
    of ``CARRY_THRESHOLDS`` (V cells solid where the density reaches the threshold) that the
    scorer finds carrying; a carrying completion is left as it is."""
    from sphyr_jax.training.evaluation import CARRY_THRESHOLDS

    net = _random_model()
    net = eqx.tree_at(lambda m: m.head.bias, net, net.head.bias - 2.0)  # sparse designs
    cache = AnswerAsOptimum()

    def carries(recs, comps):
        per = training.score_summary(recs, comps, cache=cache)["per_record"]
        return [bool(m["load_carrying"]) for m in per]

    dropped = 0
    for subject in ("full_easy", "full_hard", "3_random_column_hard"):
        recs, hard = data_records[subject], subject.endswith("_hard")
        plain = training.complete_records(net, recs, hard=hard, carry=False)
        guarded = training.complete_records(net, recs, hard=hard)
        assert all(carries(recs, guarded))
        for rec, p, g, ok in zip(recs, plain, guarded, carries(recs, plain), strict=True):
            if ok:
                assert g == p
                continue
            dropped += 1
            rho = np.asarray(training.predict(net, jnp.asarray(
                training.grid_features(rec["input_grid"])[None])))[0]
            masked = np.asarray(rec["input_grid"]) == "V"
            solid = "1.0" if hard else "1"
            tries = [np.where(masked & (rho >= t), solid, np.asarray(p)).tolist()
                     for t in CARRY_THRESHOLDS]
            assert g == tries[carries([rec] * len(tries), tries).index(True)]
    assert dropped >= 2  # the path is exercised


def test_a_large_batch_completes_as_one_grid_at_a_time():
    """96 grids of 20x20 in one compiled call give the densities and completions of 96
    calls of one grid (the conv net's global mixing once went wrong in XLA's CPU compiler
    at this batch and width)."""
    from sphyr_jax.data.datasets import load_subject
    from sphyr_jax.training.evaluation import _predict

    net = _random_model(width=48)
    recs = load_subject(str(SETS / "dataset_v2_20"), "5_random_cell_easy", limit=96)
    feats = jnp.asarray(np.stack([training.grid_features(r["input_grid"], r["gravity_dir"])
                                  for r in recs]))
    together = np.asarray(_predict(net, feats))
    alone = np.concatenate([np.asarray(_predict(net, f[None])) for f in feats])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-12)
    assert training.complete_records(net, recs, hard=False, carry=False) == [
        training.complete_records(net, [r], hard=False, carry=False)[0] for r in recs]
