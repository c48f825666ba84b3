"""One scoring path: every layer gives a record the same metrics; stored optima; bounded memory.

The stored GPT-4o and Claude completions are scored through a rescore of their
tree, a replay by the evaluation harness, the RL reward and the training
layer: the metric fields must agree to the last bit.  A record may carry its
sample's optimum, used while its key is current and recomputed once stale.
A reward scoring 20,000 distinct problems keeps a flat resident memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import (
    CLAUDE_RESULTS,
    COMPILE_CACHE,
    GPT4O_RESULTS,
    REPO,
    RTOL_REFERENCE,
    require_shared,
)

from sphyr_jax.evaluation.backends import as_backend
from sphyr_jax.evaluation.harness import evaluate
from sphyr_jax.problem.grids import extract_grid
from sphyr_jax.problem.loadcase import load_case_from_grid
from sphyr_jax.rl.reward import TopologyReward
from sphyr_jax.scoring.records import RECORD_METRIC_KEYS, optimum_fields, score_records
from sphyr_jax.scoring.results import rescore_tree
from sphyr_jax.topopt.optimum import OptimumCache, read_stored_optimum, stored_optimum
from sphyr_jax.training.evaluation import score_summary

TREES = {"gpt-4o-2024-08-06": GPT4O_RESULTS, "claude-3-7-sonnet-20250219": CLAUDE_RESULTS}


@pytest.fixture(scope="module")
def trees(optimum_cache):
    """``{model: (subject, records)}`` of the two stored trees, their optima in the
    session's cache (each tree optimised as one batch, as the yardstick test does)."""
    out = {}
    for model, path in TREES.items():
        records = json.loads(require_shared(path).read_text())
        out[model] = (path.name[: -len("_results.json")], records)
        score_records(records, cache=optimum_cache)
    return out


def _metrics(record: dict) -> str:
    """The metric fields of a record, as their exact JSON text."""
    return json.dumps({k: record[k] for k in RECORD_METRIC_KEYS}, sort_keys=True)


def test_every_layer_gives_a_stored_completion_the_same_metrics(trees, optimum_cache, tmp_path):
    """Rescore (prompt text), a harness replay (the task's masked grid), the reward
    (trainer columns) and the training layer (dataset records with ``input_grid``
    rows) read the same record differently and must score it identically: every
    metric field, bit for bit, on 200 stored completions.  Each path scores a
    tree's records as one batch, in file order."""
    root = tmp_path / "trees"
    for model, (subject, records) in trees.items():
        (root / model).mkdir(parents=True)
        kept = [{k: r[k] for k in ("subject", "prompt", "ground_truth", "completion")}
                for r in records]
        (root / model / f"{subject}_results.json").write_text(json.dumps(kept))
    summary = rescore_tree(root, cache=optimum_cache, chunk=100)  # one chunk per tree
    assert summary.files == 2 and summary.records == 200 and summary.optimisations == 0

    for model, (subject, records) in trees.items():
        completions = [r["completion"] for r in records]
        rescored = json.loads((root / model / f"{subject}_results.json").read_text())

        answers = iter(completions)  # asked one at a time, in the stored order
        replay = evaluate(as_backend(lambda prompt, answers=answers: next(answers), name=model),
                          replay_from=TREES[model].parent, results_root=tmp_path / "replay",
                          concurrency=1, cache=optimum_cache, score_batch_size=len(records),
                          score_wait=600.0)
        assert replay.failures == [] and replay.score_batches == 1
        replayed = json.loads((tmp_path / "replay" / model / f"{subject}_results.json")
                              .read_text())
        assert [r["prompt"] for r in replayed] == [r["prompt"] for r in records]

        rewarded = TopologyReward(cache=optimum_cache).metrics(
            prompts=[r["prompt"] for r in records], completions=completions,
            ground_truth=[r["ground_truth"] for r in records])

        dataset = [{"input_grid": extract_grid(r["prompt"]), "ground_truth": r["ground_truth"]}
                   for r in records]
        trained = score_summary(dataset, completions, cache=optimum_cache)["per_record"]

        for i, mine in enumerate(rescored):
            expected = _metrics(mine)
            assert _metrics(replayed[i]) == expected, (model, i, "harness")
            assert _metrics(rewarded[i]) == expected, (model, i, "reward")
            assert _metrics(trained[i]) == expected, (model, i, "training")
        assert sum(r["physically_valid"] for r in rescored) >= 90
    # Against the published figures: the reference yardstick's optimum of the GPT-4o tree.
    _, gpt = trees["gpt-4o-2024-08-06"]
    mine = json.loads((root / "gpt-4o-2024-08-06" / "full_easy_results.json").read_text())
    same = sum(a["optimal_compliance"] == pytest.approx(b["optimal_compliance"],
                                                        rel=RTOL_REFERENCE)
               for a, b in zip(mine, gpt, strict=True))
    assert same >= 98


def _seed(case) -> np.ndarray:
    """A sample's seed design: the answer's densities with L/S solid."""
    seed = np.asarray(case.pinned).copy()
    seed[np.asarray(case.load_mask | case.support_mask)] = 1.0
    return seed


def test_a_stored_optimum_is_used_while_current_and_recomputed_once_stale(trees,
                                                                          optimum_cache):
    """Records carrying their sample's optimum are scored without optimising, with the
    figures of the computed optimum; an answer edited after the optimum was stored is
    optimised again (once); another yardstick or another mask never reads it."""
    _, gpt = trees["gpt-4o-2024-08-06"]
    records = [{k: r[k] for k in ("prompt", "ground_truth", "completion")} for r in gpt[:8]]
    fields = json.loads(json.dumps(optimum_fields(records, cache=optimum_cache)))
    for record, field, published in zip(records, fields, gpt[:8], strict=True):
        assert field["yardstick"] == "reference" and len(field["key"]) == 64
        assert field["compliance"] == pytest.approx(published["optimal_compliance"],
                                                    rel=RTOL_REFERENCE)
        case = load_case_from_grid(record["ground_truth"], record["prompt"])
        cached = optimum_cache.get(case, _seed(case))
        assert field["compliance"] == float(cached.compliance)
        np.testing.assert_array_equal(field["densities"], cached.densities)
        assert field == stored_optimum(case, _seed(case), cached)
    carrying = [dict(r, optimum=f) for r, f in zip(records, fields, strict=True)]

    fresh = OptimumCache()
    with_stored = score_records(carrying, cache=fresh)
    assert (fresh.computed, fresh.hits) == (0, len(records))
    assert [_metrics(m) for m in with_stored] == [
        _metrics(m) for m in score_records(records, cache=optimum_cache)]

    # The first record's answer gains a solid cell in its masked region; its stored
    # optimum is now stale.
    rows = [row.split() for row in records[0]["ground_truth"].splitlines()]
    masked = extract_grid(records[0]["prompt"])
    r, c = next((r, c) for r in range(len(rows)) for c in range(len(rows[0]))
                if masked[r][c] == "V" and rows[r][c] == "0")
    rows[r][c] = "1"
    edited = dict(carrying[0], ground_truth="\n".join(" ".join(row) for row in rows))
    case = load_case_from_grid(edited["ground_truth"], edited["prompt"])
    assert read_stored_optimum(fields[0], case, _seed(case)) is None
    again = OptimumCache()
    scored = score_records([edited] + carrying[1:], cache=again)
    assert again.computed == 1  # the edited sample only
    assert scored[0]["optimal_compliance"] == float(again.get(case, _seed(case)).compliance)
    assert scored[0]["optimal_compliance"] != fields[0]["compliance"]
    assert [_metrics(m) for m in scored[1:]] == [_metrics(m) for m in with_stored[1:]]

    case = load_case_from_grid(records[1]["ground_truth"], records[1]["prompt"])
    assert read_stored_optimum(fields[1], case, _seed(case)).compliance == fields[1]["compliance"]
    assert read_stored_optimum(fields[1], case, _seed(case), "strong") is None
    unmasked = load_case_from_grid(records[1]["ground_truth"])  # every cell designable
    assert read_stored_optimum(fields[1], unmasked, _seed(unmasked)) is None
    for broken in ({**fields[1], "densities": [[0.0]]}, {**fields[1], "iterations": "many"},
                   {k: v for k, v in fields[1].items() if k != "compliance"}, "not a field"):
        assert read_stored_optimum(broken, case, _seed(case)) is None
    assert optimum_fields([{"ground_truth": "no grid here", "completion": ""}],
                          cache=optimum_cache) == [None]


def test_optimum_cache_keeps_the_most_recent_optima_in_memory_and_all_on_disk(
        trees, optimum_cache, tmp_path):
    _, gpt = trees["gpt-4o-2024-08-06"]
    cases = [load_case_from_grid(r["ground_truth"], r["prompt"]) for r in gpt[:3]]
    cache = OptimumCache(tmp_path, max_memory_entries=2)
    for case in cases:
        cache.put(case, _seed(case), optimum_cache.get(case, _seed(case)))
    assert cache.memory_entries == 2 and len(list(tmp_path.glob("*.json"))) == 3
    first = cache.get(cases[0], _seed(cases[0]))  # dropped from memory: read from its file
    assert (cache.hits, cache.computed) == (1, 0) and cache.memory_entries == 2
    assert first.compliance == optimum_cache.get(cases[0], _seed(cases[0])).compliance
    assert list(cache._memory) == [cache.key(c, _seed(c)) for c in (cases[2], cases[0])]
    with pytest.raises(ValueError, match="max_memory_entries"):
        OptimumCache(max_memory_entries=0)


# ----------------------------------------------------------------------------
# Memory of a long run.

_MEMORY_RUN = """
import gc, json, math, sys
import equinox as eqx
import numpy as np
import sphyr_jax as sj
from sphyr_jax.problem.loadcase import load_case_from_grid, normalise_gravity
from sphyr_jax.rl import TopologyReward
from sphyr_jax.runtime import release_heap
from sphyr_jax.topopt.optimum import OptimumCache

limit = None if sys.argv[1] == "none" else int(sys.argv[1])
size = int(sys.argv[3])
count, directions, chunk, warm = 20480, 40, 256, 4096
sj.enable_x64()
if sys.argv[2]:
    sj.enable_compilation_cache(sys.argv[2])


def resident_mb():
    gc.collect()
    release_heap()
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


rng = np.random.default_rng(0)
keys = OptimumCache()
rows = []
for _ in range(count // directions):
    solid = rng.random((size, size)) < 0.5
    grid = [["1" if v else "0" for v in row] for row in solid]
    grid[0][int(rng.integers(size))] = "L"
    grid[-1][0] = grid[-1][-1] = "S"
    masked = [["V" if t not in "LS" and rng.random() < 0.3 else t for t in row] for row in grid]
    case = load_case_from_grid(grid, masked)
    seed = np.asarray(case.pinned).copy()
    seed[np.asarray(case.load_mask | case.support_mask)] = 1.0
    text, masked_text = "\\n".join(map(" ".join, grid)), "\\n".join(map(" ".join, masked))
    for k in range(directions):
        angle = 2 * math.pi * (k + 0.5) / directions
        g = (math.cos(angle), math.sin(angle))
        turned = eqx.tree_at(lambda c: c.gravity, case, normalise_gravity(g))
        stored = {"yardstick": "reference", "key": keys.key(turned, seed), "compliance": None,
                  "densities": seed.tolist(), "iterations": 0, "converged": True}
        rows.append((text, masked_text, g, stored))
order = rng.permutation(len(rows))
rows = [rows[i] for i in order]

reward = TopologyReward(max_memory_entries=limit)


def score(part):
    reward(completions=[r[0] for r in part], ground_truth=[r[0] for r in part],
           input_grid=[r[1] for r in part], gravity_dir=[r[2] for r in part],
           optimum=[r[3] for r in part])


for lo in range(0, warm, chunk):
    score(rows[lo: lo + chunk])
before = resident_mb()
for lo in range(warm, count, chunk):
    score(rows[lo: lo + chunk])
print(json.dumps({"growth_mb": resident_mb() - before, "records": len(rows),
                  "distinct": len({r[3]["key"] for r in rows}),
                  "entries": reward.cache.memory_entries, "computed": reward.cache.computed,
                  "hits": reward.cache.hits}))
"""


def reward_memory(limit: int | None, size: int = 4) -> dict:
    """Score 20,480 distinct problems with a reward whose cache keeps ``limit`` optima
    in memory, in a process of its own (one malloc arena, so the resident size moves
    with what is kept, not with which thread allocated); its resident growth after the
    first 4,096.

    Each problem is a ``size`` x ``size`` layout (tiny, so the run takes seconds) in
    one of 40 load directions and carries a stored optimum with its key, so nothing is
    optimised: the answer stands in for the optimum (this measures memory; stored
    optima against computed ones are tested above).  With ``limit=None`` (no bound)
    the resident size grows with every problem, several times past the bound the
    test allows."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "MALLOC_ARENA_MAX": "1"}
    done = subprocess.run([sys.executable, "-c", _MEMORY_RUN, str(limit).lower(), COMPILE_CACHE,
                           str(size)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_reward_memory_stays_bounded_over_20000_distinct_problems():
    """A reward's optima in memory are capped by its cache limit, so a long run over
    distinct problems keeps its resident memory flat: growth at most the cache's
    share (4 KB an optimum, generously) plus 2 MB."""
    limit = 256
    run = reward_memory(limit)
    assert run["records"] == run["distinct"] == 20480
    assert run["computed"] == 0 and run["hits"] == 20480  # every stored optimum was current
    assert run["entries"] == limit
    assert run["growth_mb"] <= 2.0 + limit * 4 / 1024, run
