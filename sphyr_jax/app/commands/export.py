"""``export``: a dataset's prompts in a trainer's data layout, each row with its label.

--format=verl writes veRL's parquet (data_source, prompt as chat messages,
ability, reward_model with the label as ground_truth, extra_info);
--format=openrlhf writes OpenRLHF's JSONL (prompt, label).  The reward reads
everything it needs from the label (sphyr_jax.rl.verl, sphyr_jax.rl.openrlhf,
serve --protocol=openrlhf).
"""

from __future__ import annotations

from absl import flags

from sphyr_jax.app import common

NAME = "export"
SUMMARY = "Write a dataset's prompts for a trainer: veRL parquet or OpenRLHF JSONL."

SHARED = ("dataset_dir", "dataset_version", "output", "format", "subjects", "sample_count",
          "rotations", "seed")

flags.DEFINE_enum("split", "train", ["train", "test"],
                  "train: a generated training corpus (a benchmark set is refused); test: a "
                  "benchmark set, for validation runs.")

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.errors import UserInputError
    from sphyr_jax.evaluation.prompts import DEFAULT_SEED
    from sphyr_jax.rl.export import TRAINERS, export_dataset

    if FLAGS.format not in TRAINERS:
        raise UserInputError(f"export needs --format={' or --format='.join(TRAINERS)}")
    from sphyr_jax.data.datasets import list_subjects
    from sphyr_jax.evaluation.tasks import dataset_subjects

    output = common.require("output", NAME)
    dataset = common.dataset()
    count = export_dataset(dataset, output, FLAGS.format,
                           subjects=FLAGS.subjects or [
                               s for s in dataset_subjects(dataset) if s in list_subjects()],
                           split=FLAGS.split, rotations=[FLAGS.rotations],
                           sample_count=common.sample_count(None),
                           seed=DEFAULT_SEED if FLAGS.seed is None else FLAGS.seed)
    print(f"wrote {count} rows of {dataset} to {output} ({FLAGS.format})")
    return 0
