"""``generate``: new SPhyR-style samples from the project's own optimiser."""

from __future__ import annotations

import json

from absl import flags

from sphyr_jax.app import common

NAME = "generate"
SUMMARY = "Generate new samples (any grid size) with the project's optimiser."

flags.DEFINE_integer("num_samples", 20, "Samples to generate.", lower_bound=1)
flags.DEFINE_integer("grid_size", 10, "Generated grid size (square).", lower_bound=2)
flags.DEFINE_float("volume_fraction", None, "Generated budget (default: drawn per sample).",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_list("gravity_dirs", ["down"], "Load directions to draw from: down,up,left,right.")

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.data.generate import generate_dataset

    output_dir = common.require("output_dir", NAME)
    summary = generate_dataset(
        output_dir, FLAGS.num_samples, seed=FLAGS.seed or 0, grid_size=FLAGS.grid_size,
        volume_fraction=FLAGS.volume_fraction, gravity_dirs=tuple(FLAGS.gravity_dirs),
        num_devices=FLAGS.num_devices, progress=common.progress())
    print(json.dumps(summary, default=str))
    common.write_json(summary)
    return 0
