"""Training problems drawn by the generators' own rules: layouts, pools, masks, batches."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import token_grid

from sphyr_jax import training
from sphyr_jax.data import generate_v2
from sphyr_jax.data.datasets import VARIANTS
from sphyr_jax.fem import fea
from sphyr_jax.problem.grids import densities_from_grid
from sphyr_jax.problem.loadcase import load_case_from_grid
from sphyr_jax.training import drawing

N = 6
DRAW = training.DrawConfig(sources=(f"v1:{N}", f"v2:{N}"), source_weights=(1.0, 1.0),
                           size_weights=(1.0,), batch_sizes=(8,), pool_sizes=(6, 6),
                           bank_size=16)
TINY = training.TrainConfig(
    steps=40, learning_rate=3e-2, warmup_steps=4, log_every=20, seed=0, problem=DRAW,
    model=training.ModelConfig(width=8, dilations=(1, 2, 4)),
    loss=training.LossConfig(volume_weight=0.0, excess_weight=4.0))
EDGES = {"top": (0, None), "bottom": (N - 1, None), "left": (None, 0), "right": (None, N - 1)}


@pytest.fixture(scope="module")
def source():
    return training.RulesSource(DRAW, seed=3)


def _edge_of(mask):
    """The edge a non-empty cell set lies on entirely (corners: the first listed), else None."""
    rows, cols = np.nonzero(mask)
    for name, (r, c) in EDGES.items():
        if len(rows) and (np.all(rows == r) if r is not None else np.all(cols == c)):
            return name
    return None


def _contiguous(mask) -> bool:
    rows, cols = np.nonzero(mask)
    line = cols if len(set(rows)) == 1 else rows
    return bool(np.all(np.diff(np.sort(line)) == 1))


def test_layouts_follow_each_family_rules(source):
    """v1: one load run, supports on the opposite edge, the load pushing towards them;
    v2: 1-3 contiguous load cells on one edge, at least 2 support cells on edges, never on a
    load cell, eight unit directions, budget round(0.3 n^2) / n^2."""
    v1, v2 = source.sets
    assert v1.family == "v1" and v2.family == "v2"
    towards = {"top": (-1, 0), "bottom": (1, 0), "left": (0, -1), "right": (0, 1)}
    for i in range(len(v1.bank)):
        load, support, g = v1.bank.load[i], v1.bank.support[i], v1.bank.gravity[i]
        le, se = _edge_of(load), _edge_of(support)
        assert le and se and _contiguous(load) and _contiguous(support)
        assert tuple(g) == towards[se] and tuple(-g) == towards[le]
        canonical = [np.rot90(m, -int(v1.bank.turns[i])) for m in (load, support)]
        assert canonical[0][0].any() and canonical[1][-1].any()  # load top, supports bottom
        assert 0.2 <= v1.bank.budget[i] <= 1.0
    directions = set()
    for i in range(len(v2.bank)):
        load, support, g = v2.bank.load[i], v2.bank.support[i], v2.bank.gravity[i]
        assert 1 <= load.sum() <= 3 and _edge_of(load) and _contiguous(load)
        assert support.sum() >= 2 and not (load & support).any()
        border = np.ones((N, N), bool)
        border[1:-1, 1:-1] = False
        assert not (support & ~border).any()
        assert np.linalg.norm(g) == pytest.approx(1.0)
        directions.add(tuple(np.sign(g).astype(int)))
        assert v2.bank.budget[i] == round(0.3 * N * N) / (N * N)
    assert directions <= set(generate_v2.LOAD_DIRECTIONS) and len(directions) >= 4


def test_pool_answers_are_the_family_answers(source):
    """v2: exactly round(0.3 n^2) solid cells (L/S included) in the easy answer, one decimal in
    the hard one; v1: 0/1 answers at most at the budget; every answer carries the load
    (direct FEA against the solid grid)."""
    for ps in source.sets:
        assert len(ps.easy) == 6
        cases = [load_case_from_grid(_tokens(ps, i, ps.easy[i]), None, tuple(ps.bank.gravity[i]))
                 for i in range(len(ps.easy))]
        for i, case in enumerate(cases):
            easy, hard = ps.easy[i], ps.hard[i]
            assert set(np.unique(easy)) <= {0.0, 1.0}
            np.testing.assert_array_equal(easy[ps.bank.load[i] | ps.bank.support[i]], 1.0)
            np.testing.assert_allclose(hard, np.round(hard, 1), atol=1e-12)
            if ps.family == "v2":
                assert easy.sum() == round(0.3 * N * N)
            else:
                np.testing.assert_array_equal(hard, easy)
                assert easy.mean() <= ps.bank.budget[i] + 1e-9
            for design in (easy, hard):
                c = float(fea.compliance(case, jnp.asarray(design)))
                solid = float(fea.compliance(case, jnp.ones((N, N))))
                assert c <= fea.SINGULARITY_RATIO * solid


def _tokens(ps, i, values, masked=None):
    """Token grid of a problem: L/S cells, values elsewhere (V where masked)."""
    return token_grid(ps.bank.load[i], ps.bank.support[i], values, masked)


@pytest.mark.parametrize("variant", VARIANTS)
def test_masks_are_drawn_as_each_family_draws_them(source, variant):
    """v2: among free cells only, in the counts of generate_v2.mask_count; v1: in the
    canonical frame, convert's patterns (cells anywhere, inner rows, whole columns, rows
    1..n-2 for full)."""
    rng = np.random.default_rng(0)
    v1, v2 = source.sets
    for i in range(8):
        load, support = v2.bank.load[i], v2.bank.support[i]
        m = drawing.draw_mask("v2", variant, load, support, 0, rng)
        free = ~(load | support)
        assert not (m & ~free).any()
        if variant == "full":
            np.testing.assert_array_equal(m, free)
        elif variant.endswith("cell"):
            assert m.sum() == generate_v2.mask_count(variant, N)
        else:
            lines = (m.any(1) if variant.endswith("row") else m.any(0)).sum()
            assert lines == generate_v2.mask_count(variant, N)
        load, support, k = v1.bank.load[i], v1.bank.support[i], int(v1.bank.turns[i])
        m = np.rot90(drawing.draw_mask("v1", variant, load, support, k, rng), -k)
        rows, cols = m.all(1), m.all(0)
        count = 0 if variant == "full" else int(variant.split("_")[0])
        if variant == "full":
            assert rows.tolist() == [False] + [True] * (N - 2) + [False]
        elif variant.endswith("row"):
            assert not rows[0] and not rows[-1] and rows.sum() == count == m.sum() / N
        elif variant.endswith("column"):
            assert cols.sum() == min(count, N) == m.sum() / N
        else:
            assert 1 <= m.sum() <= count


def test_drawn_batches_build_the_load_case_the_grid_reader_builds(source):
    """A drawn problem written as tokens and read back by the grid reader gives the same load
    case and features; its target is the answer's volume fraction (a bank layout: its
    budget); variants, formats and sources all occur."""
    seen = set()
    for step in range(6):
        p = source.draw(step)
        batch = source.batch(step)
        for j in range(len(p.hard)):
            ps = source.sets[p.source[j]]
            seen.add((int(p.variant[j]), bool(p.hard[j]), int(p.source[j])))
            i = next(i for i in range(len(ps.bank))
                     if np.array_equal(ps.bank.load[i], p.load[j])
                     and np.array_equal(ps.bank.support[i], p.support[j]))
            known = p.known[j]
            gt = _tokens(ps, i, known)
            inp = _tokens(ps, i, known, p.masked[j])
            ref = load_case_from_grid(gt, inp, tuple(p.gravity[j]))
            one = jax.tree.map(lambda a, j=j: np.asarray(a[j]), batch.case)
            np.testing.assert_allclose(one.force, ref.force, rtol=0, atol=1e-15)
            np.testing.assert_array_equal(one.free_dofs, ref.free_dofs)
            np.testing.assert_array_equal(one.design_mask, ref.design_mask)
            np.testing.assert_allclose(np.asarray(batch.features[j]),
                                       training.grid_features(inp, tuple(p.gravity[j])))
            answers = [a for a in (ps.easy, ps.hard) for a in a
                       if np.array_equal(np.where(p.masked[j], 0.0, a), known)]
            # A bank layout (full mask, nothing known) asks for its budget; a pool answer
            # for its own volume fraction (all-zero known cells can match both).
            banked = (VARIANTS[p.variant[j]] == "full" and not known.any()
                      and p.target[j] == ps.bank.budget[i])
            assert banked or p.target[j] in {float(a.mean()) for a in answers}
            assert bool(batch.hard[j]) == bool(p.hard[j])
            np.testing.assert_allclose(densities_from_grid(gt)[0][~p.masked[j]],
                                       np.where(p.load[j] | p.support[j], 1.0, known)[
                                           ~p.masked[j]])
    assert {v for v, _, _ in seen} == set(range(len(VARIANTS)))
    assert {h for _, h, _ in seen} == {False, True} and {s for _, _, s in seen} == {0, 1}


def test_rules_trained_model_lowers_the_loss_and_is_reproducible():
    model, curve = training.train(TINY)
    step_fn = training.make_train_step(dataclasses.replace(TINY, seed=0))
    start = training.init_model(TINY.model, 11)
    opt_state = training.make_optimizer(TINY).init(eqx.filter(start, eqx.is_array))
    final = jnp.asarray(TINY.steps - 1, jnp.float64)
    held_out = training.RulesSource(DRAW, seed=9).batch(0)
    _, _, before, _ = step_fn(start, opt_state, held_out, final)
    _, _, after, aux = step_fn(model, opt_state, held_out, final)
    assert float(after) < float(before) - 0.5, (float(before), float(after))
    assert float(aux["carrying"]) > 0.9 and np.isfinite(float(aux["grad_norm"]))
    again, _ = training.train(TINY)
    for a, b in zip(jax.tree.leaves(eqx.filter(model, eqx.is_array)),
                    jax.tree.leaves(eqx.filter(again, eqx.is_array)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [e["step"] for e in curve] == [20, 40]


def _benchmark_layouts(names, n=10):
    """Layout codes (1 load, 2 support) of every record of embedded sets, read directly."""
    from sphyr_jax.data import embedded
    from sphyr_jax.data.datasets import list_subjects, load_subject

    codes = set()
    for name in names:
        for subject in list_subjects():
            for rec in load_subject(embedded(name), subject):
                gt = np.asarray(rec["ground_truth"], dtype=object)
                codes.add(((gt == "L") + 2 * (gt == "S")).astype(np.int8).tobytes())
    return np.stack([np.frombuffer(c, np.int8).reshape(n, n) for c in codes])


def _nearest(kept, bench, images: bool):
    codes = kept.load.astype(np.int8) + 2 * kept.support.astype(np.int8)
    moved = drawing._images(codes) if images else codes[None]
    return (moved[:, :, None] != bench[None, None]).sum((-2, -1)).min((0, 2))


def test_exclusion_keeps_drawn_layouts_away_from_every_benchmark_sample():
    """Brute force over the benchmark files: every kept v2 layout is at least 6 cells from
    every benchmark layout of its grid size (symmetric: every image of it), the refused
    draws were close (drawing without the exclusion gives some), and the v1 rules at 10x10,
    whose layouts nearly all lie near the embedded v1 set, give up with a clear error."""
    bench10 = _benchmark_layouts(["dataset", "dataset_1_rotations", "dataset_2_rotations",
                                  "dataset_3_rotations", "dataset_v2"])
    bench20 = _benchmark_layouts(["dataset_v2_20"], 20)
    for n, bench, symmetric in ((10, bench10, False), (20, bench20, True)):
        exclusion = drawing.Exclusion(symmetric=symmetric)
        kept, _, refused = drawing.draw_layouts("v2", n, 200, np.random.default_rng(1),
                                                exclusion)
        assert len(kept) == 200 and _nearest(kept, bench, symmetric).min() >= 6
        free, _, _ = drawing.draw_layouts("v2", n, 200, np.random.default_rng(1))
        assert refused > 0 and (_nearest(free, bench, symmetric) < 6).any()
    with pytest.raises(ValueError, match="v1:10.*another grid size"):
        drawing.draw_layouts("v1", 10, 64, np.random.default_rng(0), drawing.Exclusion())
