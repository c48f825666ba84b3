"""Train a language model against physics with TRL's GRPO and sphyr_jax's topology reward.

An example of the wiring (it needs ``torch``, ``transformers`` and ``trl``, and a
GPU to be useful; without one it trains on the CPU in float32)::

    pip install -e ".[trl]" torch
    python -m sphyr_jax generate --dataset_version=v2 --num_samples=5000 \\
        --output_dir=runs/corpus                   # the training corpus (once)
    python experiments/grpo_trl.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --corpus runs/corpus --subjects 1_random_cell_easy,5_random_cell_easy \\
        --optima runs/optima --output runs/grpo

It trains on a generated corpus (``prompt_dataset(..., split="train")``), never
on the benchmark: the corpus's samples are held apart from every benchmark
sample, and each record carries its reference optimum, so the reward does not
optimise for it.  Each GRPO step generates ``--generations`` completions per
prompt; the reward function scores all of them in one batched call: every
completion is one batched finite-element solve, a sample without a current
stored optimum gets it computed once (and kept in ``--optima`` across runs),
and a completion that is not a complete grid scores 0.  The prompts are the
benchmark's own wording (any subjects, clockwise turns and prompt style of the
evaluation harness); evaluate the trained model on the benchmark afterwards
(``python -m sphyr_jax evaluate``).
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--corpus", required=True,
                        help="a training corpus folder (python -m sphyr_jax generate "
                             "--dataset_version=v2 --output_dir=...)")
    parser.add_argument("--subjects", default="1_random_cell_easy,5_random_cell_easy")
    parser.add_argument("--rotations", default="0")
    parser.add_argument("--style", default="default")
    parser.add_argument("--optima", default=None, help="folder keeping optima between runs")
    parser.add_argument("--output", default="runs/grpo")
    parser.add_argument("--generations", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    import sphyr_jax as sj

    sj.enable_x64()  # float64 before any scoring: E_min = 1e-9 needs it
    sj.enable_compilation_cache()

    import torch
    from trl import GRPOConfig, GRPOTrainer

    from sphyr_jax.rl import TopologyReward, prompt_dataset

    dataset = prompt_dataset(
        args.corpus, split="train", subjects=args.subjects.split(","),
        rotations=[int(r) for r in args.rotations.split(",")], style=args.style,
        conversational=True)  # chat prompts; completions come back as chat messages
    reward = TopologyReward(cache_dir=args.optima)  # one cache for the whole run
    gpu = torch.cuda.is_available()
    config = GRPOConfig(
        output_dir=args.output,
        num_generations=args.generations,
        per_device_train_batch_size=args.generations,  # one prompt's group per device step
        max_completion_length=512,  # a 10 x 10 grid is ~200 characters
        max_steps=args.steps,
        logging_steps=10,
        use_cpu=not gpu,
        bf16=gpu and torch.cuda.is_bf16_supported(),  # TRL's default, bf16, needs a GPU for it
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=reward, args=config,
                          train_dataset=dataset)
    trainer.train()
    trainer.save_state()  # the log history, rewards included: <output>/trainer_state.json
    print(f"optima computed: {reward.cache.computed}, looked up: {reward.cache.hits}")


if __name__ == "__main__":
    main()
