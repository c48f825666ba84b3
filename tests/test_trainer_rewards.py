"""The reward in each trainer's shape, without the trainers: the label, veRL's functions, the
design environment, TRL's keywords and the exports.

Each is checked against the published scoring (``get_structural_metrics``) of the same
completions; the trainers themselves run in ``test_trainer_frameworks.py``.
"""

import asyncio
import json

import numpy as np
import pytest
from rl_support import DATA, fill, scored_samples, warm_optima

from sphyr_jax.rl import DesignEnvironment, TopologyReward, prompt_dataset
from sphyr_jax.rl import verl as verl_reward
from sphyr_jax.rl.batching import BatchingScorer
from sphyr_jax.rl.export import trainer_rows
from sphyr_jax.rl.feedback import verdict
from sphyr_jax.rl.reward import reward_of, row_record
from sphyr_jax.scoring.labels import (
    MAX_CACHED_LABELS,
    LabelError,
    _parsed,
    is_label,
    problem_label,
    read_label,
)
from sphyr_jax.scoring.metrics import get_structural_metrics
from sphyr_jax.scoring.records import optimum_fields, score_records

SUBJECTS = ["1_random_cell_easy", "1_random_row_hard"]


@pytest.fixture(scope="module")
def cache(optimum_cache):
    return warm_optima(optimum_cache)


@pytest.fixture(scope="module")
def rows(cache):
    """Prompt-dataset rows of two subjects (3 samples each), with their stored optima."""
    rows = prompt_dataset(DATA, SUBJECTS, split="test", sample_count=3).to_list()
    for row, field in zip(rows, optimum_fields(rows, cache=cache), strict=True):
        row["optimum"] = field
    return rows


@pytest.fixture
def scorer(cache, monkeypatch):
    """The process's veRL/OpenRLHF scorer, on the session's optima."""
    scorer = BatchingScorer(cache)
    monkeypatch.setitem(verl_reward._SCORERS, (None, "reference"), scorer)
    return scorer


def _answers(row) -> list[str]:
    """A row's answer, its masked cells all empty, all solid, a fenced answer, prose."""
    return [row["ground_truth"], fill(row["input_grid"], "0"), fill(row["input_grid"], "1"),
            f"Here it is:\n```\n{row['ground_truth']}\n```", "I do not know."]


def _published(completion, row) -> dict:
    m = get_structural_metrics(completion, row["ground_truth"], row["input_grid"],
                               row["gravity_dir"], static=True).as_dict()
    return {"score": reward_of(m), "valid": float(bool(m["valid_output_grid"])),
            "load_carrying": float(bool(m["load_carrying"])),
            "topology_score": m["topology_score"] or 0.0}


def test_a_label_reads_back_the_sample_it_was_written_from(rows, cache):
    for row in rows:
        label = problem_label(row)
        assert is_label(label) and label == json.dumps(json.loads(label), separators=(",", ":"))
        back = read_label(label)
        assert back == {"input_grid": row["input_grid"], "ground_truth": row["ground_truth"],
                        "gravity_dir": tuple(row["gravity_dir"]), "subject": row["subject"],
                        "optimum": row["optimum"]}
        densities = np.asarray(back["optimum"]["densities"])
        assert densities.tobytes() == np.asarray(row["optimum"]["densities"]).tobytes()
        assert len(label) < 2200  # a 10 x 10 sample with its optimum: ~1.6 kB
    # token lists and text give the same label; no optimum, no field
    tokens = {**rows[0], "input_grid": [r.split() for r in rows[0]["input_grid"].splitlines()],
              "optimum": None}
    assert read_label(problem_label(tokens))["input_grid"] == rows[0]["input_grid"]
    assert "optimum" not in json.loads(problem_label(tokens))
    # scoring a label's record is scoring the row's
    completions = [c for row in rows for c in _answers(row)[:3]]
    from_rows = [{**row, "completion": c} for row in rows for c in _answers(row)[:3]]
    from_labels = [{**read_label(problem_label(row)), "completion": c}
                   for row in rows for c in _answers(row)[:3]]
    assert json.dumps(score_records(from_labels, cache=cache)) == json.dumps(
        score_records(from_rows, cache=cache))
    assert len(completions) == 18
    assert _parsed.cache_info().maxsize == MAX_CACHED_LABELS  # parsed labels: bounded


@pytest.mark.parametrize("bad, reason", [
    ("not json", "not JSON"),
    ('{"answer": "1 0"}', "version tag"),
    ('{"sphyr":2,"input":null,"answer":"1 0","gravity":[1,0]}', "version 2"),
    ('{"sphyr":1,"input":null,"answer":"1 0","gravity":[1]}', "gravity"),
    ('{"sphyr":1,"input":null,"answer":["1"],"gravity":[1,0]}', "grid text"),
    ('{"sphyr":1,"input":null,"answer":"1 0","gravity":[1,0],'
     '"optimum":{"densities_f64":"%%%","shape":[1,2]}}', "densities"),
])
def test_a_string_that_is_not_a_label_is_refused_with_its_reason(bad, reason):
    with pytest.raises(LabelError, match=reason):
        read_label(bad)
    with pytest.raises(LabelError):
        verl_reward.compute_score("sphyr/x", "1 0", bad)


def test_verl_functions_give_the_published_scores_under_the_same_keys(rows, scorer):
    labels = [r["reward_model"]["ground_truth"] for r in trainer_rows(rows, "verl")]
    completions, truths, expected = [], [], []
    for row, label in zip(rows, labels, strict=True):
        for answer in _answers(row):
            completions.append(answer)
            truths.append(label)
            expected.append(_published(answer, row))
    calls = scorer.calls
    batch = verl_reward.compute_score_batch(["sphyr/x"] * len(truths), completions, truths,
                                            [None] * len(truths))
    assert scorer.calls - calls == 1  # the batch in one scoring call
    singles = [verl_reward.compute_score("sphyr/x", c, t) for c, t in zip(completions, truths,
                                                                           strict=True)]

    async def gathered():
        return await asyncio.gather(*[verl_reward.compute_score_async("sphyr/x", c, t)
                                      for c, t in zip(completions, truths, strict=True)])

    calls = scorer.calls
    concurrent = asyncio.run(gathered())
    assert scorer.calls - calls == 1  # the reward loop's concurrent calls in one batch
    for results in (batch, singles, concurrent):
        assert all(list(r) == list(verl_reward.SCORE_KEYS) for r in results)
        for got, want in zip(results, expected, strict=True):
            assert got == pytest.approx(want, abs=1e-12)
    assert {r["score"] for r in batch} >= {0.0, 1.0} and any(0 < r["score"] < 1 for r in batch)


def test_a_stored_optimum_travels_in_the_label_or_extra_info(rows):
    """Scored on a fresh cache, a label with its optimum (or a veRL row whose extra_info has
    it) needs no optimisation; without either the optimum is computed."""
    from sphyr_jax.topopt.optimum import OptimumCache

    row = rows[0]
    fresh = BatchingScorer(OptimumCache())
    bare = problem_label({**row, "optimum": None})
    record = verl_reward.answer_record(row["ground_truth"], problem_label(row))
    from_extra = verl_reward.answer_record(row["ground_truth"], bare, {"optimum": row["optimum"]})
    assert fresh.score_now([record, from_extra]) and fresh.cache.computed == 0
    assert verl_reward.answer_record("x", bare)["optimum"] is None


def test_topology_reward_takes_trl_keywords_labels_and_logs_its_components(rows, cache):
    """Everything TRL 1.16 passes is accepted; a label or a veRL reward_model column stands
    for the sample columns; the components reach ``log_metric``; the async form agrees."""
    completions = [c for row in rows for c in _answers(row)]
    per = len(_answers(rows[0]))
    expected = [_published(c, row) for row in rows for c in _answers(row)]
    columns = {k: [row[k] for row in rows for _ in range(per)]
               for k in ("prompt", "input_grid", "ground_truth", "gravity_dir", "subject",
                         "optimum", "rotation_count", "index")}
    columns["prompts"] = columns.pop("prompt")
    labels = [problem_label(row) for row in rows for _ in range(per)]
    verl_column = [r["reward_model"] for r in trainer_rows(rows, "verl") for _ in range(per)]
    logged: list = []
    trl_extras = {"completion_ids": [[1, 2]] * len(completions), "trainer_state": object(),
                  "log_extra": lambda column, values: None,
                  "log_metric": lambda name, value: logged.append((name, value))}
    reward = TopologyReward(cache=cache)
    by_columns = reward(completions=completions, **columns, **trl_extras)
    by_label = reward(prompts=columns["prompts"], completions=completions, label=labels)
    by_verl = reward(prompts=columns["prompts"], completions=completions,
                     reward_model=verl_column, data_source=["sphyr/x"] * len(labels))
    from sphyr_jax.rl import AsyncTopologyReward

    by_async = asyncio.run(AsyncTopologyReward(cache=cache)(completions=completions, label=labels))
    scores = [e["score"] for e in expected]
    for got in (by_columns, by_label, by_verl, by_async):
        assert got == pytest.approx(scores, abs=1e-12)
    n = len(expected)
    assert dict(logged) == pytest.approx({
        "topology_reward/valid_share": sum(e["valid"] for e in expected) / n,
        "topology_reward/load_carrying_share": sum(e["load_carrying"] for e in expected) / n,
        "topology_reward/topology_score": sum(scores) / n})
    with pytest.raises(ValueError, match="ground_truth column"):
        reward(completions=completions)


def test_a_design_episode_answers_with_the_verdict_and_rewards_the_last_grid(rows, cache):
    scorer = BatchingScorer(cache)
    row = rows[1]
    verl_row, rlhf_row = trainer_rows([row], "verl")[0], trainer_rows([row], "openrlhf")[0]
    assert row_record(row) == row_record(verl_row) == row_record(rlhf_row) == {
        "input_grid": row["input_grid"], "ground_truth": row["ground_truth"],
        "gravity_dir": tuple(row["gravity_dir"]), "subject": row["subject"],
        "optimum": row["optimum"]}
    env = DesignEnvironment(scorer)
    with pytest.raises(RuntimeError, match="reset"):
        env.simulate(row["ground_truth"])
    for shape in (row, verl_row, rlhf_row):
        env.reset(**{**shape, "prompt": "ignored"})
        assert env.get_reward() == 0.0 and env.simulations == 0
        for answer in _answers(row)[1:]:
            text = env.simulate(answer)
            m = get_structural_metrics(answer, row["ground_truth"], row["input_grid"],
                                       row["gravity_dir"], static=True).as_dict()
            assert text == verdict(m, (10, 10))
            assert row["ground_truth"] not in text  # the verdict never gives the answer away
        assert env.last_grid == _answers(row)[-1] and env.simulations == 4
        assert env.get_reward() == 0.0  # the last grid was prose
        env.simulate(row["ground_truth"])
        assert env.get_reward() == pytest.approx(_published(row["ground_truth"], row)["score"])
    with pytest.raises(ValueError, match="ground_truth"):
        env.reset(prompt="no sample")


def test_design_environments_optimise_their_samples_together(monkeypatch):
    """Episodes reset on samples without stored optima: the first simulate computes every
    one of their optima in one batched optimisation."""
    from sphyr_jax.topopt import optimum as optimum_module
    from sphyr_jax.topopt.optimum import OptimumCache

    batches = []
    real = optimum_module.optimum_batch

    def counted(batch, *args, **kwargs):
        batches.append(batch.force.shape[0])  # samples in the batch
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(optimum_module, "optimum_batch", counted)
    samples = [s for s in scored_samples() if s.subject == "1_random_row_easy"]
    scorer = BatchingScorer(OptimumCache())
    envs = [DesignEnvironment(scorer) for _ in samples]
    for env, s in zip(envs, samples, strict=True):
        env.reset(input_grid=s.input_grid, ground_truth=s.ground_truth,
                  gravity_dir=list(s.gravity_dir))
    rewards = []
    for env, s in zip(envs, samples, strict=True):
        env.simulate(s.ground_truth)
        rewards.append(env.get_reward())
    assert batches == [3] and scorer.cache.computed == len(samples) == 3
    assert rewards == pytest.approx([get_structural_metrics(
        s.ground_truth, s.ground_truth, s.input_grid).topology_score for s in samples])


def test_threads_asking_at_once_share_scoring_calls(rows, cache):
    import threading

    scorer = BatchingScorer(cache, window_s=0.05)
    records = [{**row, "completion": a} for row in rows for a in _answers(row)[:2]]
    expected = score_records(records, cache=cache)
    results = [None] * len(records)
    start = threading.Barrier(len(records))

    def ask(i):
        start.wait()
        results[i] = scorer.score([records[i]])[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(records))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert json.dumps(results) == json.dumps(expected)
    assert scorer.calls < len(records) and scorer.scored == len(records)
