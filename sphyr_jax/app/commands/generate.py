"""``generate``: new SPhyR-style samples from the project's own optimiser.

``--dataset_version=v1`` (the default) draws v1-style samples (one load run on
one edge, supports on the opposite edge, axis directions, near-copies judged
by 3 cells, raw CSVs plus subjects); ``v2`` and ``v2-20`` draw SPhyR-v2 samples
(:mod:`sphyr_jax.data.generate_v2`: groups on any edge, eight load directions,
samples held far apart, volume fraction 0.3, records carrying ``gravity_dir``).
``v2-20`` is ``v2`` on a 20 x 20 grid.
"""

from __future__ import annotations

import json
import sys

from absl import flags

from sphyr_jax.app import common

NAME = "generate"
SUMMARY = "Generate new samples (v1-style or SPhyR-v2, any grid size) with the project's optimiser."

flags.DEFINE_integer("num_samples", 20, "Samples to generate.", lower_bound=1)
flags.DEFINE_integer("grid_size", 10, "Generated grid size (square; v2-20: 20).", lower_bound=2)
flags.DEFINE_float("volume_fraction", None,
                   "Generated budget (v1 only; default: drawn per sample).",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_list("gravity_dirs", ["down"],
                  "Load directions to draw from: down,up,left,right (v1 only; v2 draws from "
                  "the eight axis and diagonal directions).")

FLAGS = flags.FLAGS

V2_GRID = {"v2": 10, "v2-20": 20}


def _v2_grid_size(version: str) -> int:
    """The grid size of a v2 run: ``--grid_size`` if given, else the version's own."""
    from sphyr_jax.errors import UserInputError

    for name in ("volume_fraction", "gravity_dirs"):
        if FLAGS[name].present:
            raise UserInputError(f"--{name} applies to v1 generation only; v2 samples have "
                                 "volume fraction 0.3 and eight load directions")
    if not FLAGS["grid_size"].present:
        return V2_GRID[version]
    if version == "v2-20" and FLAGS.grid_size != 20:
        raise UserInputError(f"--dataset_version=v2-20 is 20x20; got --grid_size="
                             f"{FLAGS.grid_size} (use --dataset_version=v2 for other sizes)")
    return FLAGS.grid_size


def main() -> int:
    output_dir = common.require("output_dir", NAME)
    seed = FLAGS.seed or 0
    if FLAGS.dataset_version == "v1":
        from sphyr_jax.data.generate import generate_dataset

        summary = generate_dataset(
            output_dir, FLAGS.num_samples, seed=seed, grid_size=FLAGS.grid_size,
            volume_fraction=FLAGS.volume_fraction, gravity_dirs=tuple(FLAGS.gravity_dirs),
            num_devices=FLAGS.num_devices, progress=common.progress())
        print(json.dumps(summary, default=str))
        common.write_json(summary)
        return 0

    from sphyr_jax.data.generate_v2 import MIN_GRID_SIZE, generate_v2_dataset
    from sphyr_jax.data.generation import summary_line
    from sphyr_jax.errors import UserInputError

    grid_size = _v2_grid_size(FLAGS.dataset_version)
    if grid_size < MIN_GRID_SIZE:
        raise UserInputError(f"v2 grids must be at least {MIN_GRID_SIZE} cells wide, "
                             f"got --grid_size={grid_size}")
    summary = generate_v2_dataset(output_dir, FLAGS.num_samples, seed=seed, grid_size=grid_size,
                                  num_devices=FLAGS.num_devices, progress=common.progress())
    summary["dataset_version"] = FLAGS.dataset_version
    print(summary_line(summary), file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, default=str))
    common.write_json(summary)
    return 0
