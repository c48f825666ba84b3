"""``baselines``: results files of the fixed baselines (empty, solid, random) on a dataset."""

from __future__ import annotations

from absl import flags

from sphyr_jax.app import common

NAME = "baselines"
SUMMARY = "Write results files of the fixed baselines (empty, solid, random fills)."

CHOICES = ("empty", "solid", "random", "copy_input", "answer")

flags.DEFINE_list("baseline_models", list(CHOICES[:4]),
                  "Baselines to write: empty, solid, random, copy_input, answer (the dataset "
                  "answer itself).")
SHARED = ("dataset_dir", "dataset_version", "results_root", "seed")

flags.register_validator("baseline_models", lambda v: bool(v) and set(v) <= set(CHOICES),
                         message=f"--baseline_models takes names among {', '.join(CHOICES)}")


def main() -> int:
    from sphyr_jax.evaluation.baselines import write_baseline_results

    dataset = common.dataset()
    root = common.require("results_root", NAME)
    paths = write_baseline_results(dataset, root, seed=common.FLAGS.seed or 0,
                                   models=tuple(common.FLAGS.baseline_models))
    print(f"wrote {len(paths)} results files under {root}")
    return 0
