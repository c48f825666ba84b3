"""The reward run by each trainer's own code: TRL's GRPOTrainer, veRL's reward managers and
OpenRLHF's reward client.

Every trainer here is the installed package, called as a training run calls it: TRL's
``GRPOTrainer`` trains a tiny scripted Llama for two steps on CPU, veRL's reward managers
score a ``DataProto`` built with veRL's own code (and its dataset class reads the exported
parquet), OpenRLHF's ``SingleTurnAgentExecutor`` asks the reward endpoint.  What each
trainer logs or receives is checked against ``get_structural_metrics`` of the completions
it generated.  The samples are benchmark samples: these runs check the reward's wiring,
they train nothing to keep.  ``experiments/grpo_trl.py`` runs as a user runs it, for one
step on a one-sample generated corpus (its ``split="train"``).

Needs the ``[trl]`` and ``[verl]`` extras, torch, and ``openrlhf`` (installed without its
dependencies); skipped in a plain clone without them, a failure under CI.
"""

from __future__ import annotations

import asyncio
import importlib
from types import SimpleNamespace

import pytest
from conftest import IN_CI, SETS


def _need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f"{module} is not installed ({exc}): the trainer extras are missing"
        if IN_CI:
            pytest.fail(message + " (CI=true: .ci/run installs them)", pytrace=False)
        pytest.skip(message)


DATA = SETS / "dataset"
SUBJECT = "full_easy"


@pytest.fixture(scope="module")
def frameworks():
    for name in ("torch", "transformers", "trl", "verl", "openrlhf.utils.agent", "datasets"):
        _need(name)
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def rows(frameworks):
    """Two conversational prompt-dataset rows of full_easy."""
    from sphyr_jax.rl import prompt_dataset

    return prompt_dataset(DATA, [SUBJECT], split="test", sample_count=2,
                          conversational=True).to_list()


@pytest.fixture(scope="module")
def scorer(rows):
    """One scorer with every optimum the tests need (computed in one batch)."""
    from sphyr_jax.rl.batching import BatchingScorer
    from sphyr_jax.scoring.records import optimum_fields
    from sphyr_jax.topopt.optimum import OptimumCache

    cache = OptimumCache()
    optimum_fields(rows, cache=cache)
    return BatchingScorer(cache)


def _variants(row) -> list[str]:
    """Four answers to a row: its dataset answer, the answer with three solid design cells
    emptied, the input with every masked cell empty, and prose without a grid."""
    answer = [line.split() for line in row["ground_truth"].splitlines()]
    masked = [line.split() for line in row["input_grid"].splitlines()]
    thinned = [r[:] for r in answer]
    emptied = 0
    for i, r in enumerate(thinned):
        for j, t in enumerate(r):
            if emptied < 3 and masked[i][j] == "V" and t == "1":
                r[j] = "0"
                emptied += 1
    empty = [["0" if t == "V" else t for t in r] for r in masked]
    return ["\n".join(map(" ".join, g)) for g in (answer, thinned, empty)] + [
        "The structure cannot be determined."]


def _expected(completion: str, row) -> dict:
    """The published scoring of one completion: ``get_structural_metrics``."""
    from sphyr_jax.rl.reward import reward_of
    from sphyr_jax.scoring.metrics import get_structural_metrics

    m = get_structural_metrics(completion, row["ground_truth"], row["input_grid"],
                               row["gravity_dir"], static=True).as_dict()
    return {"reward": reward_of(m), "valid": float(bool(m["valid_output_grid"])),
            "load_carrying": float(bool(m["load_carrying"])),
            "topology_score": m["topology_score"] or 0.0, "metrics": m}


def _row_of(prompt, rows):
    text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
    (row,) = [r for r in rows if r["prompt"][-1]["content"] in text]
    return row


# ----------------------------------------------------------------------------
# TRL


def _grpo_config(out, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(out), max_steps=2, per_device_train_batch_size=4,
                num_generations=4, max_completion_length=8, learning_rate=1e-4,
                logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                seed=0, dataloader_num_workers=0, beta=0.0, disable_tqdm=True)
    base.update(kw)
    return GRPOConfig(**base)


class _Batches:
    """A trainer callback keeping each step's generation batch as TRL logged it."""

    def __init__(self):
        self.steps: list[dict] = []
        self.trainer = None

    def callback(self):
        from transformers import TrainerCallback

        owner = self

        class Keep(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                logs = owner.trainer._logs
                owner.steps.append({
                    "prompts": list(logs["prompt"]), "completions": list(logs["completion"]),
                    "rewards": {k: list(v) for k, v in logs["rewards"].items()},
                    "environments": list(owner.trainer.environments or [])})

        return Keep()


def test_grpo_trainer_logs_the_topology_reward_of_what_it_generated(rows, scorer, tmp_path):
    """GRPOTrainer with ``reward_funcs=TopologyReward``: every reward it logs is the published
    scoring of the completion it generated, and the components arrive through ``log_metric``."""
    from datasets import Dataset
    from trainer_support import grid_tokenizer, scripted_model
    from trl import GRPOTrainer

    from sphyr_jax.rl import TopologyReward

    variants = _variants(rows[0])
    tok = grid_tokenizer(variants)
    model = scripted_model(tok, {"\n": variants})
    reward = TopologyReward(cache=scorer.cache)
    batches = _Batches()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=_grpo_config(tmp_path),
                          train_dataset=Dataset.from_list(rows), processing_class=tok,
                          callbacks=[batches.callback()])
    batches.trainer = trainer
    trainer.train()
    logged = [e for e in trainer.state.log_history if "rewards/topology_reward/mean" in e]
    assert len(logged) == len(batches.steps) == 2
    seen = set()
    for entry, batch in zip(logged, batches.steps, strict=True):
        expected = []
        for prompt, completion, got in zip(batch["prompts"], batch["completions"],
                                           batch["rewards"]["topology_reward"], strict=True):
            text = completion[-1]["content"]
            seen.add(text)
            e = _expected(text, _row_of(prompt, rows))
            assert got == pytest.approx(e["reward"], abs=1e-6)  # TRL keeps float32
            expected.append(e)
        n = len(expected)
        assert entry["rewards/topology_reward/mean"] == pytest.approx(
            sum(e["reward"] for e in expected) / n, abs=1e-6)
        assert entry["topology_reward/valid_share"] == pytest.approx(
            sum(e["valid"] for e in expected) / n, abs=1e-6)
        assert entry["topology_reward/load_carrying_share"] == pytest.approx(
            sum(e["load_carrying"] for e in expected) / n, abs=1e-6)
        assert entry["topology_reward/topology_score"] == pytest.approx(
            entry["rewards/topology_reward/mean"], abs=1e-6)
    assert seen <= set(variants) and len(seen) >= 2  # the model sampled among the answers


def test_grpo_trainer_runs_design_episodes_through_the_simulate_tool(rows, scorer, tmp_path):
    """GRPOTrainer with ``environment_factory=DesignEnvironment``: each rollout calls
    ``simulate`` with a grid, the tool's reply is the simulation's verdict, and the reward
    TRL logs for the rollout is the published scoring of that grid."""
    from datasets import Dataset
    from trainer_support import grid_tokenizer, scripted_model, tool_call_text
    from trl import GRPOTrainer

    from sphyr_jax.rl import DesignEnvironment
    from sphyr_jax.rl.feedback import verdict

    calls = [tool_call_text(v) for v in _variants(rows[0])[:3]]
    tok = grid_tokenizer(calls)
    model = scripted_model(tok, {"\n": ["<tool_call>"], "<tool_call>": calls,
                                 **{c: ["</tool_call>"] for c in calls}})
    DesignEnvironment.use(scorer)
    try:
        batches = _Batches()
        trainer = GRPOTrainer(
            model=model, reward_funcs=[], train_dataset=Dataset.from_list(rows),
            processing_class=tok, environment_factory=DesignEnvironment,
            args=_grpo_config(tmp_path, max_completion_length=512,
                              max_tool_calling_iterations=1),
            callbacks=[batches.callback()])
        batches.trainer = trainer
        calls_before = scorer.calls
        trainer.train()
    finally:
        DesignEnvironment.use(None)
    logged = [e for e in trainer.state.log_history if "rewards/DesignEnvironment/mean" in e]
    assert len(logged) == len(batches.steps) == 2
    for entry, batch in zip(logged, batches.steps, strict=True):
        rewards = batch["rewards"]["DesignEnvironment"]
        expected, grids = [], []
        for prompt, completion, got in zip(batch["prompts"], batch["completions"], rewards,
                                           strict=True):
            row = _row_of(prompt, rows)
            call = completion[0]["tool_calls"][0]["function"]
            assert call["name"] == "simulate"
            grid = call["arguments"]["grid"]
            grids.append(grid)
            e = _expected(grid, row)
            tool = [m for m in completion if m["role"] == "tool"][0]
            assert tool["content"] == verdict(e["metrics"], (10, 10))
            assert got == pytest.approx(e["reward"], abs=1e-6)
            expected.append(e["reward"])
        # each rollout's environment simulated its rollout's grid, once
        assert sorted(env.last_grid for env in batch["environments"]) == sorted(grids)
        assert all(env.simulations == 1 for env in batch["environments"])
        assert entry["rewards/DesignEnvironment/mean"] == pytest.approx(
            sum(expected) / len(expected), abs=1e-6)
        assert entry["tools/call_frequency"] >= 1.0 and entry["tools/failure_frequency"] == 0
    assert scorer.calls - calls_before == 8  # one simulate per rollout, 4 rollouts a step


# ----------------------------------------------------------------------------
# veRL


def _data_proto(tok, batch_rows, responses):
    """A rollout's DataProto, built with veRL's own class: left-padded prompts,
    right-padded responses ending in the end of turn, the rows' non-tensor fields."""
    import numpy as np
    import torch
    from verl import DataProto

    p_ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                     return_dict=False) for r in batch_rows]
    r_ids = [tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
             for text in responses]
    P, R, n = max(map(len, p_ids)), max(map(len, r_ids)), len(batch_rows)
    prompts = torch.full((n, P), tok.pad_token_id, dtype=torch.long)
    resp = torch.full((n, R), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(p_ids, r_ids, strict=True)):
        prompts[i, P - len(p):] = torch.tensor(p)
        resp[i, :len(r)] = torch.tensor(r)
        mask[i, P - len(p):P] = 1
        mask[i, P:P + len(r)] = 1

    def column(key):
        out = np.empty(n, dtype=object)
        out[:] = [r[key] for r in batch_rows]
        return out

    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": resp,
                 "input_ids": torch.cat([prompts, resp], 1), "attention_mask": mask,
                 "position_ids": torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)},
        non_tensors={k: column(k) for k in ("data_source", "reward_model", "extra_info")})


@pytest.fixture(scope="module")
def verl_rows(rows, tmp_path_factory):
    """The rows as ``export --format=verl`` writes them, read back by veRL's RLHFDataset."""
    from omegaconf import OmegaConf
    from trainer_support import grid_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from sphyr_jax.rl.export import trainer_rows, write_rows

    folder = tmp_path_factory.mktemp("verl")
    path = folder / "train.parquet"
    write_rows(trainer_rows(rows, "verl"), path, "verl")
    data = RLHFDataset(data_files=[str(path)], tokenizer=grid_tokenizer(),
                       config=OmegaConf.create({"filter_overlong_prompts": False,
                                                "cache_dir": str(folder)}))
    items = [data[i] for i in range(len(data))]
    for item, row in zip(items, rows, strict=True):
        assert item["data_source"] == f"sphyr/{SUBJECT}"
        assert item["raw_prompt"] == row["prompt"]
        assert item["extra_info"]["subject"] == SUBJECT
        assert list(item["extra_info"]["gravity_dir"]) == row["gravity_dir"]
    return [{"prompt": row["prompt"], **{k: item[k] for k in
                                         ("data_source", "reward_model", "extra_info")}}
            for item, row in zip(items, rows, strict=True)]


def _verl_batch(rows, verl_rows):
    """Every variant of row 0 against both rows (8 responses) and what they should score."""
    batch_rows, responses, expected = [], [], []
    for variant in _variants(rows[0]):
        for row, vrow in zip(rows, verl_rows, strict=True):
            batch_rows.append(vrow)
            responses.append(variant)
            expected.append(_expected(variant, row))
    return batch_rows, responses, expected


def _check_manager_output(out, expected):
    scores = out["reward_tensor"].sum(-1).tolist()
    assert scores == pytest.approx([e["reward"] for e in expected], abs=1e-6)
    info = out["reward_extra_info"]
    for key in ("valid", "load_carrying", "topology_score"):
        assert list(info[key]) == pytest.approx([e[key] for e in expected], abs=1e-12)
    assert len({e["reward"] for e in expected}) >= 3  # the batch tells answers apart


def test_verl_reward_managers_score_a_data_proto_like_the_published_metrics(
        rows, verl_rows, scorer, monkeypatch):
    """veRL's BatchRewardManager (one call of compute_score_batch) and per-sample
    NaiveRewardManager on a DataProto of the exported rows: scores and logged components
    equal get_structural_metrics of the decoded responses."""
    from trainer_support import grid_tokenizer
    from verl.workers.reward_manager import BatchRewardManager, NaiveRewardManager

    from sphyr_jax.rl import verl as verl_reward

    monkeypatch.setitem(verl_reward._SCORERS, (None, "reference"), scorer)
    batch_rows, responses, expected = _verl_batch(rows, verl_rows)
    tok = grid_tokenizer(_variants(rows[0]))
    data = _data_proto(tok, batch_rows, responses)
    calls = scorer.calls
    out = BatchRewardManager(tokenizer=tok, num_examine=0,
                             compute_score=verl_reward.compute_score_batch)(data,
                                                                            return_dict=True)
    _check_manager_output(out, expected)
    assert scorer.calls - calls == 1  # one scoring call for the batch
    out = NaiveRewardManager(tokenizer=tok, num_examine=0,
                             compute_score=verl_reward.compute_score)(data, return_dict=True)
    _check_manager_output(out, expected)


def test_verl_reward_loop_batches_a_chunk_into_one_scoring_call(
        rows, verl_rows, scorer, monkeypatch, tmp_path):
    """veRL 0.9.1's trainer path: the reward loop worker made from the trainer's own config
    with ``reward.custom_reward_function.path=pkg://sphyr_jax.rl.verl`` and
    ``name=compute_score_async`` awaits one call per sample, scored in one batch."""
    import os

    import verl
    from omegaconf import OmegaConf, open_dict
    from trainer_support import grid_tokenizer
    from verl.experimental.reward_loop import RewardLoopWorker

    from sphyr_jax.rl import verl as verl_reward
    from sphyr_jax.rl.batching import BatchingScorer

    # veRL decodes each response on its executor threads before the reward is awaited: a
    # window longer than a loaded machine's decode spread keeps the chunk together
    scorer = BatchingScorer(scorer.cache, window_s=0.2)
    monkeypatch.setitem(verl_reward._SCORERS, (None, "reference"), scorer)
    tok = grid_tokenizer(_variants(rows[0]))
    tok.save_pretrained(tmp_path)  # veRL's worker loads the tokenizer from the model path
    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__),
                                      "trainer/config/_generated_ppo_trainer.yaml"))
    with open_dict(cfg):
        cfg.actor_rollout_ref.model.path = str(tmp_path)
        cfg.reward.custom_reward_function.path = "pkg://sphyr_jax.rl.verl"
        cfg.reward.custom_reward_function.name = "compute_score_async"
        cfg.reward.num_workers = 1
    batch_rows, responses, expected = _verl_batch(rows, verl_rows)
    data = _data_proto(tok, batch_rows, responses)
    worker = RewardLoopWorker(cfg)
    calls = scorer.calls
    outs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    # the first response decoded may be scored alone before the others arrive; the rest
    # of the chunk is scored together
    assert scorer.calls - calls <= 2 and scorer.largest >= len(expected) - 1
    assert [o["reward_score"] for o in outs] == pytest.approx([e["reward"] for e in expected],
                                                              abs=1e-6)
    for o, e in zip(outs, expected, strict=True):
        for key in ("valid", "load_carrying", "topology_score"):
            assert o["reward_extra_info"][key] == pytest.approx(e[key], abs=1e-12)


# ----------------------------------------------------------------------------
# OpenRLHF


class _Engine:
    """Stands in for OpenRLHF's vLLM actor: answers a scripted response."""

    def __init__(self, tok, text):
        self.ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        await asyncio.sleep(0)
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=self.ids, finish_reason="stop",
                                                        logprobs=None)])


def _rollouts(executor, tok, prompt, label, answers):
    params = SimpleNamespace(max_tokens=64, logprobs=None)

    async def run():
        return await asyncio.gather(*[
            executor.execute(prompt, label, params, 4096, tok, _Engine(tok, a)) for a in answers])

    return asyncio.run(run())


def test_openrlhf_client_gets_rewards_from_the_endpoint_batched(rows, scorer):
    """OpenRLHF's own SingleTurnAgentExecutor (installed 0.11.2) against the endpoint: 8
    concurrent rollouts of one sample each are scored in one call; their rewards, scores and
    extra_logs are the published scoring of the responses (the prompt and the end-of-turn
    token stripped from each query)."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor
    from trainer_support import grid_tokenizer

    from sphyr_jax.rl.batching import BatchingScorer
    from sphyr_jax.rl.export import trainer_rows
    from sphyr_jax.rl.openrlhf import create_reward_app
    from sphyr_jax.rl.server import ServerThread

    row = rows[0]
    label = trainer_rows([row], "openrlhf")[0]["label"]
    variants = _variants(row)
    answers = [variants[i % 4] for i in range(8)]
    tok = grid_tokenizer(variants)
    prompt = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    batching = BatchingScorer(scorer.cache, window_s=0.2)
    with ServerThread(create_reward_app(batching)) as server:
        executor = SingleTurnAgentExecutor([f"{server.url}/get_reward"])
        _rollouts(executor, tok, prompt, label, answers)  # warm: the batches have company
        calls = batching.calls
        outs = _rollouts(executor, tok, prompt, label, answers)
    assert batching.calls - calls == 1 and batching.largest >= 8
    for out, answer in zip(outs, answers, strict=True):
        e = _expected(answer, row)
        # one list entry per sample of the request, as OpenRLHF's own reward server answers
        assert out["reward"] == [pytest.approx(e["reward"], abs=1e-12)]
        assert out["scores"] == out["reward"]
        assert out["extra_logs"] == {"valid": [e["valid"]], "load_carrying": [e["load_carrying"]],
                                     "topology_score": [pytest.approx(e["topology_score"])]}


def test_openrlhf_python_file_form_scores_like_the_endpoint(rows, scorer, tmp_path,
                                                             monkeypatch):
    """``--reward.remote_url file.py``: OpenRLHF loads the file and calls its reward_func in
    threads, one sample per call; a file that imports sphyr_jax's gives the same rewards."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor
    from trainer_support import grid_tokenizer

    from sphyr_jax.rl import verl as verl_reward
    from sphyr_jax.rl.export import trainer_rows

    monkeypatch.setitem(verl_reward._SCORERS, (None, "reference"), scorer)
    path = tmp_path / "sphyr_reward.py"
    path.write_text("from sphyr_jax.rl.openrlhf import reward_func  # noqa: F401\n")
    row = rows[1]
    label = trainer_rows([row], "openrlhf")[0]["label"]
    variants = _variants(rows[0])
    tok = grid_tokenizer(variants)
    prompt = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    outs = _rollouts(SingleTurnAgentExecutor(str(path)), tok, prompt, label, variants)
    for out, answer in zip(outs, variants, strict=True):
        e = _expected(answer, row)
        assert out["reward"] == [pytest.approx(e["reward"], abs=1e-12)]
        assert out["extra_logs"]["load_carrying"] == [e["load_carrying"]]


def test_grpo_script_trains_on_a_corpus_split_and_logs_its_reward(frameworks, tmp_path):
    """``experiments/grpo_trl.py`` run as documented (a model folder, a corpus folder): it
    trains on the corpus's ``split="train"`` rows, scores with their stored optima, and the
    reward it logs is the published scoring of the one answer the scripted model writes."""
    import json
    import re
    import subprocess
    import sys

    from conftest import REPO, child_env
    from trainer_support import grid_tokenizer, scripted_model

    from sphyr_jax.data import corpus as cp
    from sphyr_jax.data.exclusion import BenchmarkIndex, default_exclusion_dirs
    from sphyr_jax.data.generate_v2 import QUICK_V2_OPTIONS
    from sphyr_jax.rl import prompt_dataset

    spec = cp.CorpusSpec(1, grid_size=10, seed=5, options=QUICK_V2_OPTIONS, format="parquet",
                         batch_size=1, window=1, optima_samples=1, file_samples=1)
    corpus = tmp_path / "corpus"
    cp.build_corpus(spec, corpus, exclusion=BenchmarkIndex.from_dirs(
        default_exclusion_dirs(10), 10))
    (row,) = prompt_dataset(corpus, [SUBJECT], split="train", conversational=True).to_list()
    answer = _variants(row)[1]  # the corpus answer with three solid cells emptied
    expected = _expected(answer, row)
    assert 0.0 < expected["reward"] < 1.0  # a score only this row's own grids give
    tok = grid_tokenizer([answer])
    model_dir = tmp_path / "model"
    scripted_model(tok, {"\n": [answer]}).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)

    out = tmp_path / "grpo"
    run = subprocess.run(
        [sys.executable, "experiments/grpo_trl.py", f"--model={model_dir}",
         f"--corpus={corpus}", f"--subjects={SUBJECT}", "--generations=2", "--steps=1",
         f"--output={out}"],
        cwd=REPO, env=child_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True,
        timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    # the sample's optimum is the one stored in the corpus: looked up, never computed
    assert re.search(r"optima computed: 0, looked up: [1-9]", run.stdout), run.stdout[-2000:]
    state = json.loads((out / "trainer_state.json").read_text())
    (logged,) = [e for e in state["log_history"] if "rewards/topology_reward/mean" in e]
    assert logged["step"] == 1
    assert logged["rewards/topology_reward/mean"] == pytest.approx(expected["reward"], abs=1e-6)
    assert logged["rewards/topology_reward/std"] == pytest.approx(0.0, abs=1e-6)
    assert logged["topology_reward/valid_share"] == expected["valid"] == 1.0
    assert logged["topology_reward/load_carrying_share"] == expected["load_carrying"] == 1.0
