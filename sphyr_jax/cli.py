"""The sphyr_jax app: ``python -m sphyr_jax <command> [--flags]``.

Commands: ``validate``, ``rescore``, ``convert``, ``generate``, ``baselines``,
``plot``.  Every flag is defined here, once; each command turns flags into
plain arguments of a library function.  Flag files: ``--flagfile=configs/
<command>.cfg`` (one ``--flag=value`` per line, ``#`` comments).

Start-up: float64 on, one XLA CPU device per core (unless ``XLA_FLAGS``
says otherwise), and JAX's persistent compilation cache in
``--compilation_cache_dir`` so a second run skips compilation.
"""

from __future__ import annotations

import json
import pathlib
import sys

from absl import app, flags

COMMANDS = ("validate", "rescore", "convert", "generate", "baselines", "plot")
_REPO_DATA = pathlib.Path(__file__).resolve().parents[1] / "data"

# --- shared -----------------------------------------------------------------
flags.DEFINE_integer("num_devices", None, "Devices batches are split over (default: all).")
flags.DEFINE_integer("cpu_devices", None,
                     "XLA CPU devices to create (default: one per core; CPU only).")
flags.DEFINE_string("cache_dir", None, "Folder persisting reference optima between runs.")
flags.DEFINE_string("compilation_cache_dir", None,
                    "JAX persistent compilation cache (default: $SPHYR_JAX_COMPILATION_CACHE "
                    "or ~/.cache/sphyr_jax/jax; '' disables it).")
flags.DEFINE_bool("progress", True, "Show progress bars on stderr.")
flags.DEFINE_string("output_json", None, "Also write the command's result as JSON here.")
flags.DEFINE_enum("optimum", "reference", ["reference", "strong"],
                  "Yardstick: 'reference' reproduces the published optimum and scores; "
                  "'strong' searches harder (a stiffer optimum: stricter scores).")
flags.DEFINE_bool("design_efficiency", False,
                  "Also optimise at each completion's own budget (slower).")
# --- rescore ----------------------------------------------------------------
flags.DEFINE_string("results_root", None,
                    "Folder of <model>/<subject>_results.json (default: data/results).")
flags.DEFINE_bool("dry_run", False, "Compute the metrics but write nothing.")
flags.DEFINE_integer("chunk", 4096, "Records scored per batch (bounds memory).")
# --- validate / baselines ---------------------------------------------------
flags.DEFINE_string("subject", "full_easy", "Subject to validate.")
flags.DEFINE_integer("samples", 20, "Records of the subject to validate.")
flags.DEFINE_string("dataset_dir", None,
                    "Dataset folder, subject file or hub name (default: data/dataset).")
# --- convert / generate -----------------------------------------------------
flags.DEFINE_string("raw_dir", None, "Folder of *_SPhyR_2D.csv raw samples.")
flags.DEFINE_string("output_dir", None, "Output folder.")
flags.DEFINE_integer("seed", None, "Random seed (convert: 42, generate/baselines: 0).")
flags.DEFINE_enum("format", "jsonl", ["jsonl", "json"], "Subject file format.")
flags.DEFINE_integer("num_samples", 20, "Samples to generate.")
flags.DEFINE_integer("grid_size", 10, "Generated grid size (square).")
flags.DEFINE_float("volume_fraction", None, "Generated budget (default: drawn per sample).")
flags.DEFINE_list("gravity_dirs", ["down"], "Load directions to draw from: down,up,left,right.")
# --- plot -------------------------------------------------------------------
flags.DEFINE_string("input", None, "Results file, validate JSON or leaderboard JSON to plot.")
flags.DEFINE_integer("index", 0, "Record of a results file to plot.")
flags.DEFINE_string("output", "plot.png", "PNG to write.")

FLAGS = flags.FLAGS


def _data_dir(name: str) -> str:
    for base in (_REPO_DATA, pathlib.Path.cwd() / "data"):
        if (base / name).is_dir():
            return str(base / name)
    raise app.UsageError(f"no embedded data/{name} folder found; pass it explicitly")


def _setup() -> None:
    """Process-wide start-up; must run before JAX initialises its backends."""
    from sphyr_jax.sharding import configure_host_devices

    configure_host_devices(FLAGS.cpu_devices)
    from sphyr_jax.runtime import enable_compilation_cache, enable_x64

    enable_x64()
    enable_compilation_cache(FLAGS.compilation_cache_dir)  # '' leaves it off


def _progress():
    from sphyr_jax.progress import ProgressBar

    return ProgressBar(enabled=FLAGS.progress)


def _cache():
    from sphyr_jax.optimum import OptimumCache

    return OptimumCache(FLAGS.cache_dir, optimum=FLAGS.optimum,
                        num_devices=FLAGS.num_devices)


def _write_json(obj) -> None:
    if FLAGS.output_json:
        from sphyr_jax.io import atomic_write_json

        atomic_write_json(FLAGS.output_json, obj, indent=2)


def cmd_validate() -> int:
    from sphyr_jax.datasets import load_subject, subject_ndim
    from sphyr_jax.validation import validate_records

    embedded = "dataset_3d" if subject_ndim(FLAGS.subject) == 3 else "dataset"
    source = FLAGS.dataset_dir or _data_dir(embedded)
    records = load_subject(source, FLAGS.subject, limit=FLAGS.samples)
    if not records:
        raise app.UsageError(f"no records of {FLAGS.subject} in {source}")
    report = validate_records(records, FLAGS.subject, cache=_cache(),
                              num_devices=FLAGS.num_devices,
                              design_efficiency=FLAGS.design_efficiency,
                              progress=_progress())
    print(f"\n{FLAGS.subject}: {report.samples} samples from {source} "
          f"(optimum={report.optimum})\n")
    print(report.table())
    print(report.line())
    _write_json(report.as_dict())
    return 0


def cmd_rescore() -> int:
    from sphyr_jax.results import format_leaderboard, rescore_tree

    root = FLAGS.results_root or _data_dir("results")
    summary = rescore_tree(root, dry_run=FLAGS.dry_run,
                           design_efficiency=FLAGS.design_efficiency, cache=_cache(),
                           num_devices=FLAGS.num_devices, progress=_progress(),
                           chunk=FLAGS.chunk, log=lambda m: print(m, file=sys.stderr))
    if summary.files == 0:
        print(f"nothing could be read under {root}", file=sys.stderr)
        return 1
    if FLAGS.dry_run:
        print("dry run: nothing was written")
    print()
    print(format_leaderboard(summary.leaderboard))
    print()
    print(summary.line())
    _write_json({"rows": summary.leaderboard, "per_file": summary.per_file,
                 "corrupt": summary.corrupt, "summary": summary.line()})
    return 0


def cmd_convert() -> int:
    from sphyr_jax.convert import convert_raw_dir

    if not FLAGS.raw_dir or not FLAGS.output_dir:
        raise app.UsageError("convert needs --raw_dir and --output_dir")
    seed = 42 if FLAGS.seed is None else FLAGS.seed
    written = convert_raw_dir(FLAGS.raw_dir, FLAGS.output_dir, seed=seed, fmt=FLAGS.format)
    print(f"converted {FLAGS.raw_dir} -> {FLAGS.output_dir}: {len(written)} subject files")
    return 0


def cmd_generate() -> int:
    from sphyr_jax.generate import generate_dataset

    if not FLAGS.output_dir:
        raise app.UsageError("generate needs --output_dir")
    summary = generate_dataset(
        FLAGS.output_dir, FLAGS.num_samples, seed=FLAGS.seed or 0, grid_size=FLAGS.grid_size,
        volume_fraction=FLAGS.volume_fraction, gravity_dirs=tuple(FLAGS.gravity_dirs),
        num_devices=FLAGS.num_devices, progress=_progress())
    print(json.dumps(summary, default=str))
    _write_json(summary)
    return 0


def cmd_baselines() -> int:
    from sphyr_jax.baselines import write_baseline_results

    dataset = FLAGS.dataset_dir or _data_dir("dataset")
    if not FLAGS.results_root:
        raise app.UsageError("baselines needs --results_root")
    paths = write_baseline_results(dataset, FLAGS.results_root, seed=FLAGS.seed or 0)
    print(f"wrote {len(paths)} results files under {FLAGS.results_root}")
    return 0


def cmd_plot() -> int:
    from sphyr_jax.plotting import render_file

    if not FLAGS.input:
        raise app.UsageError("plot needs --input")
    out = render_file(FLAGS.input, FLAGS.output, index=FLAGS.index, cache=_cache())
    print(f"wrote {out}")
    return 0


def main(argv) -> int:
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"usage: python -m sphyr_jax <{'|'.join(COMMANDS)}> [--flags]")
    _setup()
    return globals()[f"cmd_{argv[1]}"]()


def run() -> None:
    """Console-script entry point."""
    app.run(main)


if __name__ == "__main__":
    run()
