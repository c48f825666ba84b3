"""The twelve static (grid-only) metrics: hand-made grids with hand-computed
values for every branch, and the batched implementation against a plain
per-record implementation of the definitions (forward Dijkstra from each
load, breadth- and depth-first searches) on random grids."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from decimal import Decimal

import pytest

from sphyr_jax.scoring.static import (
    MAX_PATH_COST,
    STATIC_METRIC_KEYS,
    StaticMetrics,
    force_path_cost,
    read_grid,
    static_metrics,
    static_metrics_batch,
    step_weights,
)

PUBLISHED_NAMES = (
    "valid_output_grid", "exact_match", "difference_ratio", "relative_difference_ratio",
    "penalized_difference_ratio", "load_support_connected",
    "load_support_connected_force_directional", "isolated_clusters_count",
    "force_path_cost_average_efficiency_ratio", "difficulty_score",
    "difficulty_weighted_difference_ratio", "difficulty_weighted_relative_difference_ratio",
)


def g(text: str) -> list[list[str]]:
    return [row.split() for row in text.strip().splitlines()]


def test_names_are_the_published_ones():
    assert STATIC_METRIC_KEYS == PUBLISHED_NAMES
    assert tuple(StaticMetrics().as_dict()) == PUBLISHED_NAMES


# ----------------------------------------------------------------------------
# Reading.


def test_reads_the_last_token_block():
    text = ("Here is my reasoning:\n1 0\n0 1\n\nFinal answer:\n```\n"
            "0 L L\n1 1 0\n0 S S\n```\nDone.")
    assert read_grid(text) == g("0 L L\n1 1 0\n0 S S")
    # Prose on a line ends a block; the published reader keeps ragged blocks.
    assert read_grid("0 1\n0 1 1\nthe end") == [["0", "1"], ["0", "1", "1"]]
    assert read_grid("no grid here") == []
    assert read_grid(None) == []
    assert read_grid([["0", 1, 0.5]]) == [["0", "1", "0.5"]]


# ----------------------------------------------------------------------------
# Agreement with the answer.

ANSWER = g("""
L L 0
1 1 0
0 1 0
S S 0
""")  # numeric sum 3


def test_difference_ratios_by_hand():
    out = g("L L 1\n1 0 0\n0 1 0\nS S 0")  # two cells differ by 1 each
    m = static_metrics(out, ANSWER)
    assert m.valid_output_grid and not m.exact_match
    assert m.difference_ratio == pytest.approx(1 - 2 / 3)
    assert m.relative_difference_ratio == pytest.approx(1 - 2 / 3)
    assert m.penalized_difference_ratio == pytest.approx(1 - 2 / 3)


def test_support_pairs_are_penalised_and_ratios_go_negative():
    out = g("L L 1\n1 0 0\n0 1 0\nS 1 0")  # plus an S answered with a 1
    m = static_metrics(out, ANSWER)
    assert m.difference_ratio == pytest.approx(1 - 3 / 3)
    assert m.relative_difference_ratio == pytest.approx(1 - 3 / 3)
    assert m.penalized_difference_ratio == pytest.approx(1 - (1 + 1 + 3) / 3)
    assert m.penalized_difference_ratio < 0


def test_exact_match_and_decimal_differences():
    m = static_metrics(ANSWER, ANSWER)
    assert m.exact_match and m.difference_ratio == 1.0 == m.relative_difference_ratio
    answer = g("L 0.3 0.4\nS 0.2 0.1")
    total = 0.3 + 0.4 + 0.2 + 0.1  # row-major, as the published loop adds
    m = static_metrics(g("L 0.1 0.4\nS 0.2 0.1"), answer)
    assert m.difference_ratio == pytest.approx(1 - 1 / total, rel=1e-15)
    # |0.1 - 0.3| in decimal arithmetic is exactly 0.2 (0.3 - 0.1 in binary is not).
    assert m.relative_difference_ratio == 1 - 0.2 / total
    assert 0.3 - 0.1 != 0.2
    # "1" and "1.0" differ as strings but not in value.
    m = static_metrics(g("L 1.0\nS 0"), g("L 1\nS 0"))
    assert not m.exact_match and m.difference_ratio == 0.0  # 1 - 1/1
    assert m.relative_difference_ratio == 1.0 == m.penalized_difference_ratio


def test_answer_without_material():
    answer = g("L 0\nS 0")
    assert static_metrics(g("L 0\nS 0"), answer).difference_ratio == 1.0
    m = static_metrics(g("L 1\nS 0"), answer)  # the published code divides by zero
    assert m.difference_ratio == 0.0 == m.relative_difference_ratio


# ----------------------------------------------------------------------------
# Invalid outputs.

INPUT = g("V L 0\nV V 0\n0 1 0\nS S V")


@pytest.mark.parametrize("output", [
    "L L 0\n1 V 0\n0 1 0\nS S 0",          # a V left
    [["L", "L", "0"], ["1", "1.5", "0"], ["0", "1", "0"], ["S", "S", "0"]],  # above 1
    [["L", "L", "0"], ["1", "x", "0"], ["0", "1", "0"], ["S", "S", "0"]],    # not a number
    "L L 0 0\n1 1 0 0\n0 1 0 0\nS S 0 0",  # a column too many
    "L L 0\n1 1 0\n0 1 0",                 # a row short
    "L L 0\n1 1\n0 1 0\nS S 0",             # ragged
    "I cannot solve this.",
    None,
])
def test_invalid_outputs_score_nothing_but_difficulty(output):
    valid = static_metrics(ANSWER, ANSWER, INPUT)
    m = static_metrics(output, ANSWER, INPUT)
    expected = StaticMetrics(difficulty_score=valid.difficulty_score)
    assert m == expected
    assert m.difficulty_score > 0


def test_unusable_answer_or_direction():
    assert static_metrics(ANSWER, "L L\n0", INPUT) == StaticMetrics()
    m = static_metrics(ANSWER, ANSWER, INPUT, gravity_dir=(0, 0))
    assert not m.valid_output_grid and m.difficulty_score > 0
    assert not static_metrics(ANSWER, ANSWER, INPUT, gravity_dir=(1, 0, 0, 1)).valid_output_grid


# ----------------------------------------------------------------------------
# Graph metrics.

DIAGONAL = "L 0 0 0\n0 1 0 0\n0 0 1 0\n0 0 0 S"
ELBOW = "L 0 0 0\n1 0 0 0\n1 0 0 0\n1 1 1 S"


def test_path_costs_by_hand():
    # Diagonal steps weigh 1.5 (just above 45 degrees), times 1 + 0.05 x rows below the load.
    assert force_path_cost(DIAGONAL) == pytest.approx(1.5 * (1.05 + 1.10 + 1.15))
    # Down 1.0 x (1.05, 1.10), then diagonal 1.5 x 1.15, then sideways 1.5 x 1.15 twice.
    assert force_path_cost(ELBOW) == pytest.approx(1.05 + 1.10 + 3 * 1.5 * 1.15)
    m = static_metrics(ELBOW, DIAGONAL)
    assert m.force_path_cost_average_efficiency_ratio == pytest.approx(4.95 / 7.325)
    assert m.load_support_connected and m.load_support_connected_force_directional
    # The cheaper output is clipped to 1.
    assert static_metrics(DIAGONAL, ELBOW).force_path_cost_average_efficiency_ratio == 1.0


def test_mean_over_loads_with_an_unsupported_load():
    # Two loads: one 1.05 + 1.10 above the support, one cut off by void.
    grid = "L 0 L\n1 0 0\nS 0 0"
    assert force_path_cost(grid) == pytest.approx((1.05 + 1.10 + MAX_PATH_COST) / 2)


def test_long_paths_are_cut_at_1000():
    # Sideways steps cost 1.5 each on the load's own row.
    assert force_path_cost([["L"] + ["1"] * 598 + ["S"]]) == pytest.approx(599 * 1.5)
    assert force_path_cost([["L"] + ["1"] * 698 + ["S"]]) == MAX_PATH_COST  # 1048.5 > 1000


UPWARD = "S 0\n1 0\nL 0"


@pytest.mark.parametrize("gravity, directional, cost", [
    ((1, 0), False, MAX_PATH_COST),       # down: the way up is forbidden
    ((-1, 0), True, 1.05 + 1.10),         # up: straight along the load
    ((0, 1), True, 1.5 * (1.05 + 1.10)),  # right: up is sideways (90 degrees)
    ((0, -1), True, 1.5 * (1.05 + 1.10)),  # left: the same
])
def test_each_load_direction(gravity, directional, cost):
    m = static_metrics(UPWARD, UPWARD, None, gravity)
    assert m.load_support_connected
    assert m.load_support_connected_force_directional is directional
    assert force_path_cost(UPWARD, gravity) == pytest.approx(cost)
    assert m.force_path_cost_average_efficiency_ratio == 1.0  # the answer is the output


def test_step_weights_by_hand():
    inf = math.inf
    # Steps in itertools.product((-1, 0, 1), repeat=2) order, zero step left out.
    assert list(step_weights((1, 0))) == [inf, inf, inf, 1.5, 1.5, 1.5, 1.0, 1.5]
    assert list(step_weights((-1, 0))) == [1.5, 1.0, 1.5, 1.5, 1.5, inf, inf, inf]
    assert list(step_weights((0, 1))) == [inf, 1.5, 1.5, inf, 1.0, inf, 1.5, 1.5]
    assert list(step_weights((0, -1))) == [1.5, 1.5, inf, 1.0, inf, 1.5, 1.5, inf]
    assert list(step_weights((2, 0))) == list(step_weights((1, 0)))  # only the direction counts
    # A diagonal load: the axis steps sit just above 45 degrees.
    assert list(step_weights((1, 1))) == [inf, inf, 1.5, inf, 1.5, 1.5, 1.5, 1.0]


def test_directional_search_takes_only_steps_along_the_load():
    # The way round needs a step up: connected, but not along the load.
    grid = "L 0 0\n1 0 S\n1 1 1"
    m = static_metrics(grid, grid)
    assert m.load_support_connected and not m.load_support_connected_force_directional
    assert m.force_path_cost_average_efficiency_ratio == 1.0
    assert force_path_cost(grid) == MAX_PATH_COST


def test_isolated_clusters_and_diagonal_contact():
    grid = g("""
L 0 0 0 1
1 0 1 0 0
0 0 0 0 0
1 1 0 0 0
0 0 0 S 0
""")
    m = static_metrics(grid, grid)
    assert m.isolated_clusters_count == 3  # (0,4); (1,2); (3,0)-(3,1)
    assert not m.load_support_connected and not m.load_support_connected_force_directional
    assert m.force_path_cost_average_efficiency_ratio == 1.0  # both cost 1000
    grid[2][1] = "0.5"  # touches (1,0), (1,2) and (3,*) diagonally: one group with the load
    m = static_metrics(grid, grid)
    assert m.isolated_clusters_count == 1
    grid[3][2] = "1"  # and now it reaches the support
    m = static_metrics(grid, grid)
    assert m.load_support_connected and m.load_support_connected_force_directional


def test_no_load_or_no_support():
    for grid in ("0 1 0\n1 1 0\nS S 0", "L L 0\n1 1 0\n0 1 0"):
        m = static_metrics(grid, grid)
        assert m.valid_output_grid
        assert not m.load_support_connected and not m.load_support_connected_force_directional
        assert m.force_path_cost_average_efficiency_ratio == 0.0
        assert force_path_cost(grid) == 0.0
    # A support only: the material touching it is not isolated, the rest is.
    assert static_metrics("1 0 1\n0 0 0\nS 0 0", "1 0 1\n0 0 0\nS 0 0", None
                          ).isolated_clusters_count == 2


def test_tied_paths():
    # Two mirror-image routes of equal cost; either gives the same figure.
    grid = "0 L 0\n1 0 1\n0 S 0"
    assert force_path_cost(grid) == pytest.approx(1.5 * 1.05 + 1.5 * 1.10)


def test_voxel_grids_use_26_neighbours():
    layers = [[["L", "0"], ["0", "0"]], [["0", "0"], ["0", "S"]]]
    m = static_metrics(layers, layers, None, (1, 0, 0))
    assert m.valid_output_grid and m.exact_match
    assert m.load_support_connected and m.load_support_connected_force_directional
    # The corner step (1, 1, 1) is 54.7 degrees from down: 1.5 x (1 + 0.05 x 1 layer).
    assert force_path_cost(layers, (1, 0, 0)) == pytest.approx(1.5 * 1.05)
    assert force_path_cost(layers) == pytest.approx(1.5 * 1.05)  # the 2D default is down
    up = static_metrics(layers, layers, None, (-1, 0, 0))
    assert up.load_support_connected and not up.load_support_connected_force_directional
    isolated = [[["L", "0", "0"], ["0", "0", "0"], ["0", "0", "1"]],
                [["0", "0", "0"], ["0", "0", "0"], ["S", "0", "0"]]]
    assert static_metrics(isolated, isolated, None, (1, 0, 0)).isolated_clusters_count == 1


# ----------------------------------------------------------------------------
# Difficulty.


def test_difficulty_weights_by_hand():
    answer = g("0 0 0\n0 0 1\n1 1 1")
    masked = g("V 0 0\n0 V 1\n1 1 V")  # all-zero and equal -> 1; mixed -> 3; mixed -> 3
    m = static_metrics(answer, answer, masked)
    assert m.difficulty_score == pytest.approx(7 / 3)
    assert m.difficulty_weighted_difference_ratio == pytest.approx(7 / 3)  # ratio 1
    answer = g("1 1 1\n1 0 1\n1 1 1")
    masked = g("V 1 1\n1 V 1\n1 1 1")  # mixed -> 3; all ones but 0 -> 2
    assert static_metrics(answer, answer, masked).difficulty_score == pytest.approx(2.5)
    # No numeric neighbour: weight 0, still counted in the mean; L/S answers read as 1.
    answer = g("L S 1\nL S 1")
    masked = g("V S V\nL S 1")
    assert static_metrics(answer, answer, masked).difficulty_score == pytest.approx(0.5)
    assert static_metrics(answer, answer, g("V S 1\nL S 1")).difficulty_score == 0.0
    assert static_metrics(answer, answer, answer).difficulty_score == 0.0  # no V
    assert static_metrics(answer, answer).difficulty_score == 0.0
    assert static_metrics(answer, answer, g("V S\nL S")).difficulty_score == 0.0  # shape


def test_difficulty_weighted_ratios_multiply():
    masked = g("V L 0\n1 V 0\n0 1 0\nS S V")
    out = g("L L 1\n1 0 0\n0 1 0\nS S 0")
    m = static_metrics(out, ANSWER, masked)
    # (0,0): answer L read as 1, numeric neighbours {1, 1} -> 1; (1,1): mixed -> 3;
    # (3,2): neighbours {0, 1, 0} mixed -> 3.
    assert m.difficulty_score == pytest.approx(7 / 3)
    assert m.difficulty_weighted_difference_ratio == pytest.approx(7 / 3 * (1 - 2 / 3))
    assert m.difficulty_weighted_relative_difference_ratio == pytest.approx(7 / 3 * (1 - 2 / 3))


# ----------------------------------------------------------------------------
# A plain per-record implementation of the definitions, for random grids.


def _number(token):
    try:
        value = float(token)
    except ValueError:
        return None
    return value if all(ch in "0123456789.+-eE" for ch in token) else None


def _solid(token) -> bool:
    if token in ("L", "S"):
        return True
    value = _number(token)
    return value is not None and value > 0


def _cells(shape):
    return list(itertools.product(*(range(n) for n in shape)))


def _at(grid, cell):
    for i in cell:
        grid = grid[i]
    return grid


def _neighbours(cell, shape):
    for d in itertools.product((-1, 0, 1), repeat=len(shape)):
        if any(d):
            other = tuple(c + s for c, s in zip(cell, d, strict=True))
            if all(0 <= o < n for o, n in zip(other, shape, strict=True)):
                yield d, other


def _unit(gravity):
    norm = math.sqrt(sum(x * x for x in gravity))
    return [x / norm for x in gravity]


def _weight(d, gu):
    dot = sum(a * b for a, b in zip(d, gu, strict=True))
    cos = dot / (math.sqrt(sum(a * a for a in d)) * math.sqrt(sum(b * b for b in gu)) + 1e-9)
    angle = math.degrees(math.acos(max(-1.0, min(1.0, cos))))
    return dot, 1.0 if angle < 15 else 1.2 if angle < 45 else 1.5 if angle < 100 else 3.0


def _cost(grid, shape, gravity):
    gu = _unit(gravity)
    loads = [c for c in _cells(shape) if _at(grid, c) == "L"]
    supports = {c for c in _cells(shape) if _at(grid, c) == "S"}
    if not loads or not supports:
        return 0.0
    total = 0.0
    for load in loads:
        best = {load: 0.0}
        heap = [(0.0, load)]
        found = MAX_PATH_COST
        while heap:
            cost, cell = heapq.heappop(heap)
            if cost > best[cell]:
                continue
            if cell in supports:
                found = cost
                break
            for d, other in _neighbours(cell, shape):
                dot, w = _weight(d, gu)
                if dot < -0.5 or not _solid(_at(grid, other)):
                    continue
                new = cost + w * (1.0 + 0.05 * abs(other[0] - load[0]))
                if new < best.get(other, math.inf) and new < MAX_PATH_COST:
                    best[other] = new
                    heapq.heappush(heap, (new, other))
        total += found
    return total / len(loads)


def _reaches(grid, shape, allowed):
    starts = [c for c in _cells(shape) if _at(grid, c) == "L"]
    seen = set(starts)
    stack = list(starts)
    while stack:
        cell = stack.pop()
        if _at(grid, cell) == "S":
            return True
        for d, other in _neighbours(cell, shape):
            if other not in seen and allowed(d) and _solid(_at(grid, other)):
                seen.add(other)
                stack.append(other)
    return False


def _clusters(grid, shape):
    seen = set()
    count = 0
    for start in _cells(shape):
        if start in seen or not _solid(_at(grid, start)):
            continue
        group, queue, structural = [], [start], False
        seen.add(start)
        while queue:
            cell = queue.pop()
            group.append(cell)
            structural |= _at(grid, cell) in ("L", "S")
            for _, other in _neighbours(cell, shape):
                if other not in seen and _solid(_at(grid, other)):
                    seen.add(other)
                    queue.append(other)
        count += not structural
    return count


def _ratio(count, total):
    if count == 0:
        return 1.0
    return 1.0 - count / total if total != 0 else 0.0


def reference_metrics(out, gt, inp, gravity):
    shape = (len(gt), len(gt[0])) if not isinstance(gt[0][0], list) else (
        len(gt), len(gt[0]), len(gt[0][0]))
    cells = _cells(shape)
    m = {key: 0.0 for key in STATIC_METRIC_KEYS}
    m.update(valid_output_grid=False, exact_match=False, load_support_connected=False,
             load_support_connected_force_directional=False, isolated_clusters_count=0)
    if inp is not None:
        weights = []
        for cell in cells:
            if _at(inp, cell) != "V":
                continue
            values = [_number(_at(gt, o)) for _, o in _neighbours(cell, shape)
                      if _at(gt, o) not in ("L", "S", "V")]
            values = [v for v in values if v is not None]
            own = _number(_at(gt, cell))
            own = own if own is not None else 1.0 if _at(gt, cell) in ("L", "S") else 0.0
            if not values:
                weights.append(0.0)
            elif all(v == 0 for v in values) or all(v == 1 for v in values):
                same = all(v == own for v in values)
                weights.append(1.0 if same else 2.0)
            else:
                weights.append(3.0)
        total = sum(weights)
        m["difficulty_score"] = total / len(weights) if weights and total > 0 else 0.0
    try:
        ok = all(_at(out, c) is not None for c in cells) and len(out) == shape[0] and all(
            len(r) == shape[1] for r in out)
    except (IndexError, TypeError):
        ok = False
    ok = ok and all(_at(out, c) in ("L", "S") or (
        _number(_at(out, c)) is not None and 0 <= _number(_at(out, c)) <= 1) for c in cells)
    if not ok:
        return m
    m["valid_output_grid"] = True
    differing = [c for c in cells if _at(out, c) != _at(gt, c)]
    gt_sum = 0.0
    for c in cells:
        if _number(_at(gt, c)) is not None:
            gt_sum += _number(_at(gt, c))
    relative = penalized = 0.0
    for c in differing:
        a, b = _at(out, c), _at(gt, c)
        if _number(a) is None or _number(b) is None:
            relative += 1.0
            penalized += 3.0
        else:
            gap = float(abs(Decimal(a) - Decimal(b)))
            relative += gap
            penalized += gap
    m["exact_match"] = not differing
    m["difference_ratio"] = _ratio(len(differing), gt_sum)
    m["relative_difference_ratio"] = _ratio(relative, gt_sum)
    m["penalized_difference_ratio"] = _ratio(penalized, gt_sum)
    m["load_support_connected"] = _reaches(out, shape, lambda d: True)
    m["load_support_connected_force_directional"] = _reaches(
        out, shape, lambda d: all(a * b >= 0 for a, b in zip(d, gravity, strict=True)))
    m["isolated_clusters_count"] = _clusters(out, shape)
    cost_out = _cost(out, shape, gravity)
    cost_gt = _cost(gt, shape, gravity)
    m["force_path_cost_average_efficiency_ratio"] = (
        min(max(cost_gt / cost_out, 0.0), 1.0) if cost_out > 0 else 0.0)
    m["difficulty_weighted_difference_ratio"] = m["difficulty_score"] * m["difference_ratio"]
    m["difficulty_weighted_relative_difference_ratio"] = (
        m["difficulty_score"] * m["relative_difference_ratio"])
    return m


GRAVITIES = [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (2, 1), (0.5, -1.0)]


def _random_case(rng: random.Random, hard: bool):
    rows, cols = rng.randint(1, 7), rng.randint(1, 7)
    values = ["0.0", "0.1", "0.3", "0.5", "1.0", "1"] if hard else ["0", "1"]
    density = rng.random()
    gt = [[rng.choice(values[1:]) if rng.random() < density else values[0]
           for _ in range(cols)] for _ in range(rows)]
    for token in ("L", "S"):
        for _ in range(rng.randint(0, 3)):
            gt[rng.randrange(rows)][rng.randrange(cols)] = token
    inp = [[("V" if rng.random() < 0.4 else t) for t in row] for row in gt]
    out = [row[:] for row in gt]
    for _ in range(rng.randint(0, rows * cols)):
        r, c = rng.randrange(rows), rng.randrange(cols)
        out[r][c] = rng.choice(values + ["L", "S"] + (["V", "1.5"] if rng.random() < 0.05
                                                       else []))
    return out, gt, inp, rng.choice(GRAVITIES)


def _assert_same(got: StaticMetrics, expected: dict, where: str):
    for key, value in expected.items():
        actual = getattr(got, key)
        if isinstance(value, bool) or key == "isolated_clusters_count":
            assert actual == value, (where, key)
        else:
            assert actual == pytest.approx(value, rel=1e-12, abs=1e-12), (where, key)


def test_batch_agrees_with_a_plain_implementation():
    rng = random.Random(20)
    cases = [_random_case(rng, hard=k % 2 == 1) for k in range(400)]
    batch = static_metrics_batch(*zip(*cases, strict=True))
    for k, (case, got) in enumerate(zip(cases, batch, strict=True)):
        _assert_same(got, reference_metrics(*case), f"case {k}")
    # Each record alone gives the same figures as in the batch.
    for case, got in list(zip(cases, batch, strict=True))[:40]:
        assert static_metrics(*case) == got
    branches = {
        "valid": sum(m.valid_output_grid for m in batch),
        "invalid": sum(not m.valid_output_grid for m in batch),
        "connected": sum(m.load_support_connected for m in batch),
        "directional": sum(m.load_support_connected_force_directional for m in batch),
        "not directional": sum(m.load_support_connected
                               and not m.load_support_connected_force_directional
                               for m in batch),
        "clusters": sum(m.isolated_clusters_count > 0 for m in batch),
        "negative": sum(m.difference_ratio < 0 for m in batch),
        "path ratio in (0, 1)": sum(0 < m.force_path_cost_average_efficiency_ratio < 1
                                    for m in batch),
    }
    assert min(branches.values()) >= 5, branches


def test_random_voxel_grids_agree_with_a_plain_implementation():
    rng = random.Random(3)
    cases = []
    for _ in range(60):
        shape = [rng.randint(1, 4) for _ in range(3)]
        gt = [[[("1" if rng.random() < 0.45 else "0") for _ in range(shape[2])]
               for _ in range(shape[1])] for _ in range(shape[0])]
        for token in ("L", "S"):
            for _ in range(rng.randint(0, 2)):
                gt[rng.randrange(shape[0])][rng.randrange(shape[1])][rng.randrange(shape[2])] = \
                    token
        out = [[[("1" if rng.random() < 0.5 else "0") if t not in "LS" else t for t in row]
                for row in layer] for layer in gt]
        inp = [[[("V" if rng.random() < 0.3 else t) for t in row] for row in layer]
               for layer in gt]
        gravity = rng.choice([(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, 0, -1), (1, 1, 0)])
        cases.append((out, gt, inp, gravity))
    batch = static_metrics_batch(*zip(*cases, strict=True))
    for k, (case, got) in enumerate(zip(cases, batch, strict=True)):
        _assert_same(got, reference_metrics(*case), f"voxel case {k}")
    assert sum(m.load_support_connected for m in batch) >= 5


def test_text_and_tokens_agree():
    rng = random.Random(5)
    cases = [_random_case(rng, hard=True) for _ in range(30)]
    as_text = [tuple("\n".join(" ".join(row) for row in grid) if isinstance(grid, list) else grid
                     for grid in case) for case in cases]
    assert static_metrics_batch(*zip(*cases, strict=True)) == static_metrics_batch(
        *zip(*as_text, strict=True))


def test_score_items_use_the_physics_direction():
    """``score_batch(static=True)`` reads the item's input and direction; on a
    voxel item the 2D default (1, 0) means down, as for the physics."""
    from sphyr_jax.scoring.metrics import ScoreItem, static_of

    layers = [[["L", "0"], ["0", "0"]], [["0", "0"], ["0", "S"]]]
    masked = [[["L", "V"], ["0", "0"]], [["0", "0"], ["0", "S"]]]
    (voxel, turned, flat) = static_of([
        ScoreItem(layers, layers, masked, (1.0, 0.0)),
        ScoreItem(layers, layers, masked, (-1.0, 0.0, 0.0)),
        ScoreItem(UPWARD, UPWARD, None, (-1.0, 0.0)),
    ])
    assert voxel == static_metrics(layers, layers, masked, (1, 0, 0))
    assert voxel.load_support_connected_force_directional
    assert not turned.load_support_connected_force_directional
    assert voxel.difficulty_score > 0
    assert flat == static_metrics(UPWARD, UPWARD, None, (-1, 0))
    assert flat.load_support_connected_force_directional
