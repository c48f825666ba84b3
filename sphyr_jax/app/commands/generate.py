"""``generate``: new SPhyR-style samples from the project's own optimiser.

What each --dataset_version writes under --output_dir:
  v1 (default)  raw/<NN>_SPhyR_2D.csv, one raw CSV per sample (plus raw/gravity.json
                when a load is not down), and the 16 subject files <subject>.jsonl made
                from them by convert (mask seed 42).  One load run on one edge, supports
                on the opposite edge, --gravity_dirs directions, --volume_fraction or a
                budget drawn per sample, near-copies (3 cells) rejected.
  v2, v2-20     the 16 subject files <subject>.jsonl only (no raw CSVs: the raw layout
                cannot hold supports off the bottom edge), records with gravity_dir.
                Load and support groups on any edge, eight load directions, samples held
                far apart, volume fraction 0.3 (sphyr_jax.data.generate_v2).  v2-20 is
                v2 on a 20 x 20 grid.

It prints a summary table (--output_json=F: the summary as JSON, with every sample).
"""

from __future__ import annotations

from absl import flags

from sphyr_jax.app import common

NAME = "generate"
SUMMARY = ("Generate new samples (v1-style: raw CSVs + subjects; SPhyR-v2: subjects) with the "
           "project's optimiser.")

flags.DEFINE_integer("num_samples", 20, "Samples to generate.", lower_bound=1)
flags.DEFINE_integer("grid_size", 10, "Generated grid size (square; v2-20: 20).", lower_bound=3)
flags.DEFINE_float("volume_fraction", None,
                   "Generated budget (v1 only; default: drawn per sample).",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_list("gravity_dirs", ["down"],
                  "Load directions to draw from: down,up,left,right (v1 only; v2 draws from "
                  "the eight axis and diagonal directions).")

SHARED = ("output_dir", "seed", "dataset_version", "num_devices", "output_json", "progress")

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


def _table(summary: dict) -> str:
    """The summary as a two-column table, in the order a reader asks."""
    rows = [("kept", summary["kept"]), ("drawn", summary["drawn"]),
            ("solved", summary["solved"]), ("unused", summary["unused"])]
    rows += [(f"rejected: {reason}", count) for reason, count in summary["rejected"].items()]
    rows += [("seconds", f"{summary['seconds']:.1f}"),
             ("samples per second", f"{summary['samples_per_second']:.3g}"),
             ("device", summary["device"])]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value:>8}" for name, value in rows)


def _generate(output_dir: str, seed: int, progress) -> dict:
    from sphyr_jax.errors import UserInputError

    if FLAGS.dataset_version == "v1":
        from sphyr_jax.data.generate import generate_dataset

        return generate_dataset(
            output_dir, FLAGS.num_samples, seed=seed, grid_size=FLAGS.grid_size,
            volume_fraction=FLAGS.volume_fraction, gravity_dirs=tuple(FLAGS.gravity_dirs),
            num_devices=FLAGS.num_devices, progress=progress)

    from sphyr_jax.data.generate_v2 import MIN_GRID_SIZE, generate_v2_dataset

    grid_size = _v2_grid_size(FLAGS.dataset_version)
    if grid_size < MIN_GRID_SIZE:
        raise UserInputError(f"v2 grids must be at least {MIN_GRID_SIZE} cells wide, "
                             f"got --grid_size={grid_size}")
    summary = generate_v2_dataset(output_dir, FLAGS.num_samples, seed=seed,
                                  grid_size=grid_size, num_devices=FLAGS.num_devices,
                                  progress=progress)
    summary["dataset_version"] = FLAGS.dataset_version
    return summary


def main() -> int:
    from sphyr_jax.data.generation import GenerationError, summary_line
    from sphyr_jax.errors import UserInputError

    output_dir = common.require("output_dir", NAME)
    seed = FLAGS.seed or 0
    try:
        with common.progress() as progress:
            summary = _generate(output_dir, seed, progress)
    except GenerationError as exc:  # too few samples kept within the attempt bound
        raise UserInputError(str(exc)) from exc
    raw = " and raw/ CSVs" if FLAGS.dataset_version == "v1" else ""
    print(f"\n{FLAGS.dataset_version} samples written to {output_dir}: 16 subject files{raw}\n")
    print(_table(summary))
    print()
    print(summary_line(summary))
    common.write_json(summary)
    return 0
