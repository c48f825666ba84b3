"""The reward function, the episode logic, the verdict and the feedback experiment (no server)."""

import json

import numpy as np
import pytest
from rl_support import DATA, fill, published_order, warm_optima

from sphyr_jax.data.datasets import load_subject
from sphyr_jax.evaluation.prompts import build_prompt
from sphyr_jax.problem.grids import as_grid, grid_to_text
from sphyr_jax.problem.loadcase import load_case_from_grid
from sphyr_jax.rl import (
    EpisodeError,
    SampleLibrary,
    TopologyEnvironment,
    TopologyReward,
    build_samples,
    prompt_dataset,
    revision_prompt,
    run_feedback_experiment,
    topology_reward,
    verdict,
)
from sphyr_jax.rl.reward import MAX_COMPLETION_CHARS
from sphyr_jax.scoring.metrics import ALL_METRIC_FIELDS, get_structural_metrics
from sphyr_jax.topopt.optimum import OptimumCache

RTOL = 1e-12


@pytest.fixture(scope="module", autouse=True)
def _optima(optimum_cache):
    """Every optimum these tests need, computed in one batch."""
    warm_optima(optimum_cache)


def _records(subject):
    return load_subject(DATA, subject)


def _expected(answer, row, cache):
    """The topology score of ``answer`` to a dataset row, straight from get_structural_metrics."""
    return get_structural_metrics(answer, row["ground_truth"], row["input_grid"],
                                  tuple(row["gravity_dir"]), cache=cache).topology_score


# ----------------------------------------------------------------------------
# The reward function.


@pytest.fixture(scope="module")
def rows():
    """Two subjects, two samples each, one of them also turned once (6 prompts)."""
    ds = prompt_dataset(DATA, ["1_random_cell_easy", "1_random_row_hard"], split="test",
                        rotations=(0, 1), sample_count=2)
    return ds.select([0, 1, 2, 4, 5, 6])


def _group(row):
    """Completions of one prompt, GRPO-shaped: good, perturbed and invalid ones."""
    gt, inp = row["ground_truth"], row["input_grid"]
    hard = row["subject"].endswith("_hard")
    return [
        f"Here is the completed grid:\n```\n{gt}\n```\nDone.",  # the answer in prose
        fill(inp, "0.0" if hard else "0"),  # the masked cells left empty
        fill(inp, "1.0" if hard else "1"),  # the masked cells filled solid
        inp,  # 'V' left in place: invalid
        "\n".join(gt.splitlines()[:-1]),  # a row short: invalid
        "I cannot solve this.",  # no grid: invalid
    ]


def _trl_call(reward, rows, completions_of):
    """Call a reward function the way TRL's GRPOTrainer does (columns repeated per completion)."""
    inputs, completions = [], []
    for row in rows:
        for completion in completions_of(row):
            inputs.append(row)
            completions.append(completion)
    keys = [k for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")]
    reward_kwargs = {k: [example[k] for example in inputs] for k in keys}
    reward_kwargs["trainer_state"] = object()
    return reward(prompts=[x["prompt"] for x in inputs], completions=completions,
                  completion_ids=[[1, 2, 3]] * len(completions), **reward_kwargs), inputs


def test_reward_as_trl_calls_it_equals_get_structural_metrics(rows, optimum_cache):
    reward = TopologyReward(cache=optimum_cache)
    assert reward.__name__ == "topology_reward"
    got, inputs = _trl_call(reward, rows, _group)
    assert len(got) == 6 * 6 and all(isinstance(r, float) for r in got)
    for i, (r, row) in enumerate(zip(got, inputs, strict=True)):
        completion = _group(row)[i % 6]
        if i % 6 >= 3:  # the three invalid ones
            assert r == 0.0
        else:
            assert r == pytest.approx(_expected(completion, row, optimum_cache), rel=RTOL, abs=0)
    answers = got[0::6]
    assert min(answers) > 0.99  # the dataset answer is (about) as stiff as the optimum
    # Chat messages give the same rewards; so does the shared module-level function.
    chat, _ = _trl_call(reward, rows, lambda row: [[{"role": "assistant", "content": c}]
                                                   for c in _group(row)])
    assert chat == got
    module_level, _ = _trl_call(topology_reward, rows.select([0]), _group)
    assert module_level == got[:6]


def test_reward_looks_each_optimum_up_once_and_keeps_it(rows, optimum_cache, tmp_path):
    # A folder holding the optima of the 6 samples (from the session's cache).
    disk = OptimumCache(tmp_path)
    for row in rows:
        case = load_case_from_grid(row["ground_truth"], row["input_grid"], row["gravity_dir"])
        disk.put(case, case.pinned, optimum_cache.get(case, case.pinned))
    reward = TopologyReward(cache_dir=tmp_path)
    first, _ = _trl_call(reward, rows, _group)  # 36 completions of 6 distinct samples
    assert (reward.cache.hits, reward.cache.misses, reward.cache.computed) == (6, 0, 0)
    assert _trl_call(reward, rows, _group)[0] == first
    assert (reward.cache.hits, reward.cache.misses) == (12, 0)  # kept across calls
    assert first == _trl_call(TopologyReward(cache=optimum_cache), rows, _group)[0]
    # A new reward function on the same folder reads them from disk again.
    again = TopologyReward(cache_dir=tmp_path)
    assert _trl_call(again, rows, _group)[0] == first and again.cache.computed == 0


HOSTILE = [
    None, 42, 3.5, {"no": "content"}, [], [{"role": "assistant", "content": None}],
    "", "nan " * 10, "V V V", "x" * 1_000_000, ("0 " * 10 + "\n") * 100_000,
    "\u0661 " * 100,
]


def test_invalid_and_hostile_completions_score_zero(rows, optimum_cache):
    row = rows[0]
    gt = row["ground_truth"]
    bad_values = [gt.replace("0", "1.5", 1), gt.replace("0", "-0.1", 1),
                  gt.replace("0", "nan", 1), gt.replace("0", "inf", 1),
                  gt.replace("0", "\uff10", 1)]  # a full-width zero
    completions = HOSTILE + bad_values + [gt]
    n = len(completions)
    reward = TopologyReward(cache=optimum_cache)
    got = reward(completions=completions, **{k: [row[k]] * n for k in
                                              ("input_grid", "ground_truth", "gravity_dir")})
    assert got[:-1] == [0.0] * (n - 1)
    assert got[-1] == pytest.approx(_expected(gt, row, optimum_cache), rel=RTOL)
    metrics = reward.metrics(completions=completions, ground_truth=[gt] * n,
                             input_grid=[row["input_grid"]] * n,
                             gravity_dir=[row["gravity_dir"]] * n)
    assert [m["valid_output_grid"] for m in metrics] == [False] * (n - 1) + [True]
    assert list(metrics[0]) == list(ALL_METRIC_FIELDS)  # every published metric
    assert metrics[0]["compliance"] is None and metrics[0]["topology_score"] == 0.0
    assert metrics[0]["invalid_reason"] == "no grid found in the completion"
    # The static metrics are those of the published harness for the valid answer.
    assert metrics[-1]["exact_match"] and metrics[-1]["isolated_clusters_count"] == 0
    # Long completions are read from their tail: the answer after 1 MB of prose counts.
    long = "y" * 1_000_000 + "\n" + gt
    assert len(long) > MAX_COMPLETION_CHARS
    assert reward(completions=[long], ground_truth=[gt], input_grid=[row["input_grid"]],
                  gravity_dir=[row["gravity_dir"]]) == got[-1:]


def test_reward_columns_are_checked():
    with pytest.raises(ValueError, match="ground_truth"):
        topology_reward(completions=["0 1"], input_grid=["V 1"])
    with pytest.raises(ValueError, match="one entry per completion"):
        topology_reward(completions=["a", "b"], ground_truth=["L S"])
    with pytest.raises(ValueError, match="gravity_dir"):
        topology_reward(completions=["a"], ground_truth=["L S"], gravity_dir=[[0, 0]])


# ----------------------------------------------------------------------------
# The training set.


def test_prompt_dataset_order_turns_and_chat():
    ds = prompt_dataset(DATA, ["full_easy"], split="test", rotations=(0, 1), sample_count=3,
                        conversational=True)
    assert len(ds) == 6 and ds.column_names == [
        "prompt", "input_grid", "ground_truth", "gravity_dir", "subject", "rotation_count",
        "sample_index", "index"]
    order = published_order("full_easy")[:3]
    for i, rec in enumerate(order):
        row = ds[i]
        assert row["index"] == rec["index"] and row["sample_index"] == i
        assert row["input_grid"] == grid_to_text(rec["input_grid"])
        assert row["prompt"] == [{"role": "user",
                                  "content": build_prompt(rec["input_grid"], "full_easy")}]
        assert row["gravity_dir"] == [1.0, 0.0] and row["rotation_count"] == 0
        turned = ds[3 + i]  # one clockwise quarter turn: down becomes left
        expected = np.rot90(np.array(rec["ground_truth"], dtype=object), -1)
        assert as_grid(turned["ground_truth"]) == expected.tolist()
        assert turned["gravity_dir"] == [0.0, -1.0] and turned["rotation_count"] == 1
        assert grid_to_text(np.rot90(np.array(rec["input_grid"], dtype=object), -1).tolist()) \
            in turned["prompt"][0]["content"]


# ----------------------------------------------------------------------------
# The verdict and the revision prompt.


def test_verdict_in_plain_words():
    invalid = verdict({"valid_output_grid": False}, (10, 10))
    assert "could not be read as a complete grid of 10 rows by 10 cells" in invalid
    collapsed = verdict({"valid_output_grid": True, "load_carrying": False,
                         "structural_efficiency": 0.0, "volume_ratio": 0.6,
                         "isolated_clusters_count": 2})
    assert collapsed.splitlines() == [
        "- It did NOT carry the load: no continuous path of material takes the load to the "
        "supports, so the structure would collapse.",
        "- It used 60% of the material budget; the unspent 40% costs nothing, so add material "
        "along the load path to make it stiffer.",
        "- 2 piece(s) of material touch no load and no support, so they carry nothing."]
    stiff = verdict({"valid_output_grid": True, "load_carrying": True,
                     "structural_efficiency": 0.874, "volume_ratio": 1.2,
                     "isolated_clusters_count": 0})
    assert stiff.splitlines() == [
        "- It carried the load.",
        "- Its stiffness is 87% of the best design's for this material budget (100% would "
        "match it).",
        "- It used 20% more material than the budget; the excess lowers the score, so remove "
        "material that carries no load."]
    on_budget = verdict({"valid_output_grid": True, "load_carrying": True,
                         "structural_efficiency": 1.0, "volume_ratio": 1.04})
    assert on_budget.splitlines()[1:] == [
        "- Its stiffness is 100% of the best design's for this material budget (100% would "
        "match it).", "- Its material matched the budget."]


def test_revision_prompt_shows_grid_previous_answer_and_verdict_not_the_answer():
    sample = build_samples(_records("1_random_row_hard"), "1_random_row_hard", sample_count=1)[0]
    metrics = {"valid_output_grid": True, "load_carrying": False, "volume_ratio": 0.5}
    previous = fill(sample.input_grid, "0.0")
    text = revision_prompt(sample, previous, metrics)
    assert sample.input_grid in text and previous in text
    assert verdict(metrics, sample.shape) in text
    assert "one decimal place" in text  # the hard subjects' fill rule
    assert sample.ground_truth not in text


# ----------------------------------------------------------------------------
# Episodes (the environment without a server).


def test_episode_with_a_revision_round(optimum_cache):
    env = TopologyEnvironment(DATA, cache=optimum_cache, subject="1_random_row_easy")
    first = env.reset(feedback_rounds=1, sample_index=2)
    sample = env.episode.sample
    assert first["prompt"] == sample.prompt and first["sample_index"] == 2
    assert (first["rows"], first["cols"], first["masked_cells"]) == (10, 10, 10)
    assert first["cell_values"] == "binary" and not first["done"]
    empty = fill(sample.input_grid, "0")
    obs = env.step(f"My answer:\n```text\n{empty}\n```")
    assert not obs["done"] and obs["ground_truth"] is None and obs["grid"] == sample.input_grid
    assert obs["reward"] == 0.0 and obs["valid_grid"] and not obs["metrics"]["load_carrying"]
    assert "It did NOT carry the load" in obs["prompt"] and empty in obs["prompt"]
    final = env.step(sample.ground_truth)
    assert final["done"] and final["ground_truth"] == sample.ground_truth
    assert final["prompt"] is None
    assert final["reward"] == pytest.approx(
        get_structural_metrics(sample.ground_truth, sample.ground_truth, sample.input_grid,
                               cache=optimum_cache).topology_score, rel=RTOL)
    with pytest.raises(EpisodeError, match="episode is over"):
        env.step(sample.ground_truth)
    assert env.state["step_count"] == 2 and env.state["sample_index"] == 2
    # Bad options are errors that leave the configuration as it was.
    for bad in ({"subject": "nope"}, {"sample_index": 20}, {"rotation_count": 4},
                {"sample_index": "1"}, {"feedback_rounds": -1}, {"prompt_style": "fancy"},
                {"replay_from": "../etc"}):
        with pytest.raises(EpisodeError):
            env.reset(**bad)
    nxt = env.reset()
    assert nxt["subject"] == "1_random_row_easy" and nxt["sample_index"] == 3
    assert env.feedback_rounds == 1


def _turned(grid):
    """A grid turned clockwise once (independently of the library)."""
    return grid_to_text(np.rot90(np.array(as_grid(grid), dtype=object), -1).tolist())


def test_replay_a_stored_run(tmp_path, optimum_cache):
    records = published_order("1_random_cell_easy")[:2]
    folder = tmp_path / "some-model_1_rotations"
    folder.mkdir()
    stored = [{"prompt": f"Fill the grid.\n\n{_turned(r['input_grid'])}\n\nOnly the grid.",
               "ground_truth": _turned(r["ground_truth"]), "completion": "..."}
              for r in records]
    (folder / "1_random_cell_easy_results.json").write_text(json.dumps(stored))
    env = TopologyEnvironment(SampleLibrary(DATA, results_root=tmp_path), cache=optimum_cache)
    obs = env.reset(subject="1_random_cell_easy", replay_from=folder.name)
    assert obs["prompt"] == stored[0]["prompt"] and obs["grid"] == _turned(records[0]["input_grid"])
    assert obs["rotation_count"] == 1 and env.episode.sample.gravity_dir == (0.0, -1.0)
    done = env.step(stored[0]["ground_truth"])
    assert done["reward"] == pytest.approx(get_structural_metrics(
        stored[0]["ground_truth"], stored[0]["ground_truth"], stored[0]["prompt"], (0, -1),
        cache=optimum_cache).topology_score, rel=RTOL)
    assert env.reset()["prompt"] == stored[1]["prompt"]
    back = env.reset(replay_from="")  # back to the dataset, from the start of its order
    assert back["sample_index"] == 0 and back["grid"] == grid_to_text(records[0]["input_grid"])
    with pytest.raises(EpisodeError, match="no stored run"):
        env.reset(replay_from="missing-model")
    with pytest.raises(EpisodeError, match="results root"):
        TopologyEnvironment(DATA).reset(replay_from=folder.name)


# ----------------------------------------------------------------------------
# The feedback experiment.


def _fixer(samples, fail_on=None):
    """A model that leaves the masked cells empty, and answers right once told it failed."""
    answers = {s.input_grid: s.ground_truth for s in samples}

    def model(prompt):
        grid = next(g for g in answers if g in prompt)
        if fail_on is not None and grid == fail_on:
            raise TimeoutError("the model did not answer")
        if prompt.startswith("You are revising"):
            return answers[grid]
        return "```\n" + fill(grid, "0") + "\n```"

    async def async_model(prompt):
        return model(prompt)

    return model, async_model


def test_feedback_experiment_table_by_hand(tmp_path, optimum_cache):
    samples = build_samples(_records("1_random_row_easy"), "1_random_row_easy", sample_count=3)
    model, async_model = _fixer(samples)
    result = run_feedback_experiment(async_model, samples, rounds=2, mode="feedback",
                                     output_dir=tmp_path, cache=optimum_cache)
    best = np.mean([get_structural_metrics(s.ground_truth, s.ground_truth, s.input_grid,
                                           cache=optimum_cache).topology_score
                    for s in samples])
    assert [(r["round"], r["episodes"]) for r in result.table] == [(0, 3), (1, 3), (2, 3)]
    assert [r["load_carrying_share"] for r in result.table] == [0.0, 1.0, 1.0]
    assert [r["valid_share"] for r in result.table] == [1.0, 1.0, 1.0]
    assert [r["mean_topology_score"] for r in result.table] == pytest.approx([0.0, best, best])
    assert [r["mean_best_so_far"] for r in result.table] == pytest.approx([0.0, best, best])
    lines = (tmp_path / "1_random_row_easy_trajectories.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines]
    assert len(episodes) == 3 and [len(e["trajectory"]) for e in episodes] == [3, 3, 3]
    second = episodes[0]["trajectory"][1]
    assert "It did NOT carry the load" in second["prompt"]
    assert second["completion"] == samples[0].ground_truth
    table = json.loads((tmp_path / "1_random_row_easy_rounds.json").read_text())
    assert table["mode"] == "feedback" and table["table"] == result.table
    assert f"| 1 | 3 | {best:.3f} | 100% | 100% | {best:.3f} |" in (
        tmp_path / "1_random_row_easy_rounds.md").read_text()

    # The control: three independent attempts at the original prompt (a sync
    # model that fails on one sample every time: an invalid answer, recorded).
    model, _ = _fixer(samples, fail_on=samples[1].input_grid)
    control = run_feedback_experiment(model, samples, rounds=2, mode="resample",
                                      output_dir=tmp_path / "control", cache=optimum_cache)
    assert [r["mean_topology_score"] for r in control.table] == [0.0, 0.0, 0.0]
    assert [r["load_carrying_share"] for r in control.table] == [0.0, 0.0, 0.0]
    assert [r["valid_share"] for r in control.table] == pytest.approx([2 / 3] * 3)
    failed = control.trajectories[1]["trajectory"][0]
    assert failed["error"] == "TimeoutError: the model did not answer" and not failed["valid_grid"]
    assert all(step["prompt"] == samples[0].prompt
               for step in control.trajectories[0]["trajectory"])
