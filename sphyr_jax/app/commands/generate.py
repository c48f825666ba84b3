"""``generate``: new SPhyR-style samples from the project's own optimiser.

What each --dataset_version writes under --output_dir:
  v1 (default)  raw/<NN>_SPhyR_2D.csv, one raw CSV per sample (plus raw/gravity.json
                when a load is not down), and the 16 subject files <subject>.jsonl made
                from them by convert (mask seed 42).  One load run on one edge, supports
                on the opposite edge, --gravity_dirs directions, --volume_fraction or a
                budget drawn per sample, near-copies (3 cells) rejected.
  v2, v2-20     a training corpus (sphyr_jax.data.corpus): load and support groups on
                any edge, eight load directions, samples held far apart and away from
                every shipped benchmark set of the grid size (plus --exclude), volume
                fraction 0.3, each record with its own reference optimum.  Parquet shards
                per subject in the Hugging Face layout with a dataset card (--format,
                default above 1,000 samples) or the 16 <subject>.jsonl files.  The same
                --seed gives the same bytes on --engine=local or --engine=ray; a run
                started again in the same --output_dir finishes an interrupted one.
                --verify_optima=K recomputes K stored optima at the end.  v2-20 is v2 on a
                20 x 20 grid.
                --draw_order=sequential: the shipped benchmark sets' own draw order (one
                random stream; the 16 <subject>.jsonl files, no exclusion, no stored
                optima): `--seed=0 --num_samples=100` rewrites dataset_v2 byte for byte.

It prints a summary table (--output_json=F: the summary as JSON).
"""

from __future__ import annotations

import sys

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

flags.DEFINE_enum("draw_order", "keyed", ["keyed", "sequential"],
                  "v2: 'keyed' (candidate i from its own seed: a corpus, any engine) or "
                  "'sequential' (the shipped benchmark sets' single stream).")
flags.DEFINE_list("exclude", [], "v2 corpus: more dataset folders to hold the samples apart "
                  "from (the shipped benchmark sets of the grid size always are).")
flags.DEFINE_integer("min_layout_distance", 6,
                     "v2 corpus: cells whose load/support role must differ between two of its "
                     "samples (a 10x10 grid holds about a thousand layouts 6 cells apart; "
                     "benchmark samples are always kept 6 away).", lower_bound=1)
flags.DEFINE_integer("min_structure_distance", 8,
                     "v2 corpus: cells whose material must differ between two of its samples' "
                     "easy answers (benchmark samples are always kept 8 away).", lower_bound=0)
flags.DEFINE_integer("verify_optima", 0, "v2 corpus: recompute this many random stored optima "
                     "at the end and fail on a mismatch.", lower_bound=0)

SHARED = ("output_dir", "seed", "dataset_version", "num_devices", "output_json", "progress",
          "format", *common.ENGINE)
CORPUS_FLAGS = ("format", "exclude", "verify_optima", "min_layout_distance",
                "min_structure_distance", *common.ENGINE)

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


def _refuse(names, why: str) -> None:
    from sphyr_jax.errors import UserInputError

    for name in names:
        if FLAGS[name].present:
            raise UserInputError(f"--{name} {why}")


def _corpus(output_dir: str, seed: int, grid_size: int, progress) -> dict:
    from sphyr_jax.data.corpus import CorpusSpec, build_corpus, verify_optima
    from sphyr_jax.data.exclusion import load_exclusion_index
    from sphyr_jax.errors import UserInputError

    _refuse(["num_devices"], "does not apply to a v2 corpus (each task solves on one device)")
    if FLAGS.format == "json":
        raise UserInputError("a v2 corpus is written as --format=parquet or jsonl")
    spec = CorpusSpec(FLAGS.num_samples, grid_size=grid_size, seed=seed, format=FLAGS.format,
                      min_layout=FLAGS.min_layout_distance,
                      min_structure=FLAGS.min_structure_distance)
    exclusion = load_exclusion_index(grid_size, FLAGS.exclude)
    with common.engine() as engine:
        summary = build_corpus(spec, output_dir, engine=engine, exclusion=exclusion,
                               progress=progress)
        if FLAGS.verify_optima:
            summary["verified"] = verify_optima(output_dir, FLAGS.verify_optima, seed=seed,
                                                engine=engine)
    summary["excluded"] = exclusion.describe()
    summary["engine"] = FLAGS.engine
    return summary


def _generate(output_dir: str, seed: int, progress) -> dict:
    from sphyr_jax.errors import UserInputError

    if FLAGS.dataset_version == "v1":
        _refuse(("draw_order", *CORPUS_FLAGS), "applies to v2 generation only")
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
    if FLAGS.draw_order == "keyed":
        summary = _corpus(output_dir, seed, grid_size, progress)
    else:
        _refuse(CORPUS_FLAGS, "applies to --draw_order=keyed only (a corpus)")
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
    from sphyr_jax.data.corpus import OptimumMismatchError

    try:
        with common.progress() as progress:
            summary = _generate(output_dir, seed, progress)
    except OptimumMismatchError as exc:  # the corpus is written, but an optimum is off
        print(f"error: --verify_optima: {exc}", file=sys.stderr)
        return 1
    except GenerationError as exc:  # too few samples kept within the attempt bound
        raise UserInputError(str(exc)) from exc
    raw = " and raw/ CSVs" if FLAGS.dataset_version == "v1" else ""
    if summary.get("format") == "parquet":
        raw = (f" of {summary['files']} parquet shard(s) each, Hugging Face layout with a "
               "dataset card")
    print(f"\n{FLAGS.dataset_version} samples written to {output_dir}: 16 subject files{raw}\n")
    print(_table(summary))
    print()
    print(summary_line(summary))
    common.write_json(summary)
    return 0
