"""Flags several commands share, and the start-up and helpers built on them.

Each flag is defined once: the shared ones here, each command's own in its
module under :mod:`sphyr_jax.app.commands`.  A command names the shared flags
it reads in its ``SHARED`` tuple; any other flag of the app given to it is a
mistake the app reports (and its ``--help`` lists only what it reads).
Validators run at parse time, so a bad value stops the app before any work
with one line naming the flag.
"""

from __future__ import annotations

import pathlib

from absl import flags

from sphyr_jax.errors import UserInputError

DATASET_VERSIONS = ("v1", "v2", "v2-20")

flags.DEFINE_integer("num_devices", None, "Devices batches are split over (default: all).",
                     lower_bound=1)
flags.DEFINE_integer("cpu_devices", None,
                     "XLA CPU devices to create (default: one per core; CPU only).",
                     lower_bound=1)
flags.DEFINE_string("cache_dir", None, "Folder persisting reference optima between runs.")
flags.DEFINE_string("compilation_cache_dir", None,
                    "JAX persistent compilation cache (default: $SPHYR_JAX_COMPILATION_CACHE "
                    "or ~/.cache/sphyr_jax/jax; '' disables it).")
flags.DEFINE_bool("progress", True, "Progress on stderr: a live bar per stage on a terminal "
                  "(the default); --progress also writes one line per stage elsewhere (a log, "
                  "a pipe), --noprogress shows nothing.")
flags.DEFINE_string("output_json", None, "Also write the command's result as JSON here.")
flags.DEFINE_enum("optimum", "reference", ["reference", "strong"],
                  "Yardstick: 'reference' reproduces the published optimum and scores; "
                  "'strong' searches harder (a stiffer optimum: stricter scores).")
flags.DEFINE_bool("design_efficiency", False,
                  "Also optimise at each completion's own budget (slower).")
flags.DEFINE_string("dataset_dir", None,
                    "Dataset folder, subject file or hub name (default: the embedded set of "
                    "--dataset_version).")
flags.DEFINE_enum("dataset_version", "v1", list(DATASET_VERSIONS),
                  "Which SPhyR set the embedded data come from when --dataset_dir is not given.")
flags.DEFINE_string("results_root", None, "Folder of <model>/<subject>_results.json.")
flags.DEFINE_string("output_dir", None, "Output folder.")
flags.DEFINE_integer("seed", None, "Random seed (each command documents its default).")

FLAGS = flags.FLAGS


RUNTIME = ("cpu_devices", "compilation_cache_dir")
"""Start-up flags (:func:`setup`): every command reads them."""
SCORING = ("num_devices", "cache_dir", "optimum")
"""Flags of every command that computes optima (:func:`cache`)."""


def dataset(dim: int = 2) -> str:
    """``--dataset_dir``, else the embedded set of ``--dataset_version``."""
    if FLAGS.dataset_dir:
        return FLAGS.dataset_dir
    from sphyr_jax.data.datasets import dataset_source

    return dataset_source(FLAGS.dataset_version, dim)


def setup() -> None:
    """Process-wide start-up; must run before JAX initialises its backends."""
    from sphyr_jax.runtime import (
        enable_compilation_cache,
        enable_x64,
        release_memory_after_compiles,
    )
    from sphyr_jax.sharding import configure_host_devices

    configure_host_devices(FLAGS.cpu_devices)
    enable_x64()
    enable_compilation_cache(FLAGS.compilation_cache_dir)  # '' leaves it off
    release_memory_after_compiles()


def progress():
    """The progress reporter the flags ask for (a context manager: its bars close on exit).

    As ``git`` does: progress is drawn when stderr is a terminal (live bars, cleared
    when a stage ends, so no line is left behind), and elsewhere only when
    ``--progress`` is given (one line per stage), so a command run in a pipe, a log
    or a fresh install's first try writes nothing on stderr that is not a problem.
    ``--noprogress`` silences it everywhere.
    """
    import sys

    from sphyr_jax.progress import ProgressBar

    asked = FLAGS["progress"].present and FLAGS.progress
    on_terminal = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return ProgressBar(enabled=FLAGS.progress and (on_terminal or asked))


def cache():
    """The optimum cache the flags ask for."""
    from sphyr_jax.topopt.optimum import OptimumCache

    return OptimumCache(FLAGS.cache_dir, yardstick=FLAGS.optimum, num_devices=FLAGS.num_devices)


def write_json(obj) -> None:
    """Write ``obj`` to ``--output_json`` (atomically) when that flag is set."""
    if FLAGS.output_json:
        from sphyr_jax.io import atomic_write_json

        atomic_write_json(FLAGS.output_json, obj, indent=2)


def require(flag_name: str, command: str, exists: bool = False) -> str:
    """The value of a flag the command cannot run without (a path that must exist)."""
    value = getattr(FLAGS, flag_name)
    if value in (None, ""):
        raise UserInputError(f"{command} needs --{flag_name}")
    if exists and not pathlib.Path(value).exists():
        raise UserInputError(f"--{flag_name}={value} does not exist")
    return value
