"""Train a language model against physics with TRL's GRPO and sphyr_jax's topology reward.

An example of the wiring, not run by the test suite (it needs ``torch``,
``transformers`` and ``trl``, and a GPU to be useful)::

    pip install -e ".[env]" trl
    python experiments/grpo_trl.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --subjects 1_random_cell_easy,5_random_cell_easy --rotations 0,1,2,3 \\
        --optima runs/optima --output runs/grpo

Each GRPO step generates ``--generations`` completions per prompt; the reward
function scores all of them in one batched call: every distinct sample's
optimum is computed once (and kept in ``--optima`` across runs), every
completion is one batched finite-element solve, and a completion that is not
a complete grid scores 0.  The prompts are the benchmark's own (any subjects,
clockwise turns and prompt style of the evaluation harness).
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--dataset_dir", default=None,
                        help="dataset folder (default: the embedded v1 set)")
    parser.add_argument("--subjects", default="1_random_cell_easy,5_random_cell_easy")
    parser.add_argument("--rotations", default="0")
    parser.add_argument("--style", default="default")
    parser.add_argument("--optima", default=None, help="folder keeping optima between runs")
    parser.add_argument("--output", default="runs/grpo")
    parser.add_argument("--generations", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    import sphyr_jax as sj
    from sphyr_jax.data import embedded

    sj.enable_x64()  # float64 before any scoring: E_min = 1e-9 needs it
    sj.enable_compilation_cache()

    from trl import GRPOConfig, GRPOTrainer

    from sphyr_jax.rl import TopologyReward, prompt_dataset

    dataset = prompt_dataset(
        args.dataset_dir or embedded("dataset"), subjects=args.subjects.split(","),
        rotations=[int(r) for r in args.rotations.split(",")], style=args.style,
        conversational=True)  # chat prompts; completions come back as chat messages
    reward = TopologyReward(cache_dir=args.optima)  # one cache for the whole run
    config = GRPOConfig(
        output_dir=args.output,
        num_generations=args.generations,
        per_device_train_batch_size=args.generations,  # one prompt's group per device step
        max_completion_length=512,  # a 10 x 10 grid is ~200 characters
        max_steps=args.steps,
        logging_steps=10,
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=reward, args=config,
                          train_dataset=dataset)
    trainer.train()
    print(f"optima computed: {reward.cache.computed}, looked up: {reward.cache.hits}")


if __name__ == "__main__":
    main()
