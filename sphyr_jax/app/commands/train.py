"""``train``: train a density model against compliance, checkpoint it and score it.

The model (``sphyr_jax.training``) learns with no labels: its loss is the
compliance of its completions through the differentiable FEA.  With
--problems=rules (the default) training problems are drawn by the benchmark
generators' own rules (--sources: v1 and v2, 10x10 and 20x20 in one run),
layouts near a benchmark sample refused; --problems=canonical keeps the
in-graph sampler of one grid or voxel shape (--shape).  The run writes
model.eqx + model.json (the checkpoint: evaluate --model=checkpoint:DIR),
config.json (the training configuration), metrics.json (curve, times, load
average) and, unless --eval=false, the leaderboard of the model on --eval_data
beside the empty / solid baselines (leaderboard.json, .md, .png).  With
--eval_only it scores the model in --checkpoint (a folder or a built-in name,
e.g. physics) instead of training.
"""

from __future__ import annotations

import sys

from absl import flags

from sphyr_jax.app import common

NAME = "train"
SUMMARY = ("Train a density model against compliance (no labels), checkpoint it and score it "
           "beside the baselines.")


def _defaults():
    from sphyr_jax.training.config import (
        DrawConfig,
        LossConfig,
        ModelConfig,
        ProblemConfig,
        TrainConfig,
    )

    return TrainConfig(), DrawConfig(), ProblemConfig(), ModelConfig(), LossConfig()


_T, _R, _P, _M, _L = _defaults()


def _text(values) -> list[str]:
    return [str(v) for v in values]


flags.DEFINE_string("workdir", None, "Output folder (checkpoint, config, metrics, leaderboard).")
flags.DEFINE_bool("eval_only", False, "Score the model in --checkpoint; no training.")
flags.DEFINE_string("checkpoint", None, "A trained model for --eval_only: a folder "
                    "(model.eqx + model.json) or a built-in name (physics); default --workdir.")
flags.DEFINE_list("eval_data", ["dataset", "dataset_3_rotations", "dataset_2_rotations",
                                "dataset_1_rotations"],
                  "Embedded set names, dataset folders or subject files to score on (a folder's "
                  "rotation tag or the records' gravity_dir gives the load direction); '' none.")
flags.DEFINE_list("eval_results", [], "Results trees (<model>/<subject>_results.json) whose "
                  "records are scored with the stored completions beside the model.")
flags.DEFINE_list("eval_subjects", [], "Subjects to score (default: all available).")
flags.DEFINE_integer("eval_limit", None, "Score only the first N records of each subject file.",
                     lower_bound=1)
flags.DEFINE_bool("eval_rotations", False, "Also score every record turned into the axis "
                  "directions its source lacks (the model only; stored completions are not).")
flags.DEFINE_bool("eval", True, "Score after training.")
flags.DEFINE_integer("steps", _T.steps, "Training steps.", lower_bound=1)
flags.DEFINE_float("learning_rate", _T.learning_rate, "Peak Adam learning rate.")
flags.DEFINE_integer("warmup_steps", _T.warmup_steps, "Linear warmup steps.", lower_bound=0)
flags.DEFINE_float("clip_norm", _T.clip_norm, "Global gradient-norm clip.")
flags.DEFINE_integer("log_every", _T.log_every, "Steps per training-curve entry.", lower_bound=1)
flags.DEFINE_integer("width", _M.width, "Feature channels of the model.", lower_bound=1)
flags.DEFINE_list("dilations", _text(_M.dilations), "Dilation of each residual conv block.")
flags.DEFINE_float("init_density", _M.init_density, "Initial density of design cells.")
flags.DEFINE_bool("canonical", _M.canonical, "Take every input into the canonical frame (load "
                  "down or down-right): exact equivariance with --mirror_average.")
flags.DEFINE_bool("mirror_average", _M.mirror_average, "Average over the reflection keeping "
                  "the (canonical) load direction.")
flags.DEFINE_enum("hard_values", _M.hard_values, ["decimal", "binary"],
                  "How hard subjects' cells are written: densities to one decimal, or "
                  "0.0/1.0 at threshold 0.5.")
flags.DEFINE_bool("energy_channel", _M.energy_channel,
                  "Give the model one more input channel: the strain energy density of the "
                  "input with every masked cell solid, solved by the finite elements.")
flags.DEFINE_float("volume_weight", _L.volume_weight, "Price on the volume fraction.")
flags.DEFINE_float("excess_weight", _L.excess_weight,
                   "Price on the material above a problem's target volume fraction.")
flags.DEFINE_float("penal", _L.penal, "Final SIMP exponent of the soft term.")
flags.DEFINE_float("initial_penal", _L.initial_penal, "Initial SIMP exponent (continuation).")
flags.DEFINE_float("rounded_weight", _L.rounded_weight, "Final weight of the rounded term.")
flags.DEFINE_float("rounded_start", _L.rounded_start, "Progress where the rounded term starts.")
flags.DEFINE_float("initial_sharpness", _L.initial_sharpness, "Initial logit scale.")
flags.DEFINE_float("leak", _L.leak, "Floor added to the sigmoid derivative.")
flags.DEFINE_enum("problems", "rules", ["rules", "canonical"],
                  "rules: drawn by the generators' rules (--sources); canonical: the in-graph "
                  "sampler of one shape (--shape), voxels included.")
flags.DEFINE_list("variant_weights", _text(_R.variant_weights),
                  "Relative frequency of the mask variants (1/5/10 cells, 1/3 rows, 1/3 "
                  "columns, full).")
flags.DEFINE_float("hard_fraction", _R.hard_fraction, "Share of one-decimal (hard) problems.")
flags.DEFINE_float("pool_fraction", _R.pool_fraction,
                   "Share of full masks showing a pool design's known cells.")
flags.DEFINE_list("sources", list(_R.sources), "rules: '<v1|v2>:<grid size>' sources.")
flags.DEFINE_list("source_weights", _text(_R.source_weights),
                  "rules: relative frequency of each source within its grid size.")
flags.DEFINE_list("size_weights", _text(_R.size_weights),
                  "rules: relative frequency of the steps of each grid size (ascending).")
flags.DEFINE_list("batch_sizes", _text(_R.batch_sizes),
                  "rules: problems per step of each grid size (ascending).")
flags.DEFINE_list("pool_sizes", _text(_R.pool_sizes), "rules: solved layouts per source.")
flags.DEFINE_integer("bank_size", _R.bank_size, "rules: layouts drawn per source.",
                     lower_bound=1)
flags.DEFINE_bool("exclude_benchmarks", _R.exclude_benchmarks,
                  "rules: refuse layouts near a benchmark sample.")
flags.DEFINE_integer("batch_size", _T.batch_size, "canonical: problems per step.", lower_bound=1)
flags.DEFINE_list("shape", _text(_P.shape), "canonical: grid nely,nelx or voxels nz,ny,nx.")
flags.DEFINE_list("load_run", _text(_P.load_run), "canonical: load run length min,max.")
flags.DEFINE_list("support_run", _text(_P.support_run),
                  "canonical: support run length min,max.")
flags.DEFINE_list("direction_weights", _text(_P.direction_weights),
                  "canonical: relative frequency of down, right, up, left.")
flags.DEFINE_float("mirror_fraction", _P.mirror_fraction, "canonical: share mirrored.")
flags.DEFINE_integer("pool_size", _P.pool_size, "canonical: designs in the pool.",
                     lower_bound=1)
flags.DEFINE_list("pool_volume", _text(_P.pool_volume), "canonical: pool budget range min,max.")
flags.DEFINE_integer("pool_iterations", _P.pool_iterations,
                     "canonical: SIMP iterations per pool design.", lower_bound=1)

SHARED = ("seed", "progress", "output_json", *common.SCORING)

FLAGS = flags.FLAGS


def _numbers(name: str, kind=float) -> tuple:
    from sphyr_jax.errors import UserInputError

    try:
        return tuple(kind(v) for v in FLAGS[name].value)
    except ValueError as exc:
        raise UserInputError(f"--{name}={','.join(FLAGS[name].value)}: {exc}") from None


def config_from_flags():
    """The training configuration the flags describe."""
    from sphyr_jax import training

    if FLAGS.problems == "rules":
        problem = training.DrawConfig(
            sources=tuple(FLAGS.sources), source_weights=_numbers("source_weights"),
            size_weights=_numbers("size_weights"), batch_sizes=_numbers("batch_sizes", int),
            variant_weights=_numbers("variant_weights"), hard_fraction=FLAGS.hard_fraction,
            pool_fraction=FLAGS.pool_fraction, bank_size=FLAGS.bank_size,
            pool_sizes=_numbers("pool_sizes", int), exclude_benchmarks=FLAGS.exclude_benchmarks)
    else:
        problem = training.ProblemConfig(
            shape=_numbers("shape", int), load_run=_numbers("load_run", int),
            support_run=_numbers("support_run", int),
            variant_weights=_numbers("variant_weights"), hard_fraction=FLAGS.hard_fraction,
            direction_weights=_numbers("direction_weights"),
            mirror_fraction=FLAGS.mirror_fraction, pool_fraction=FLAGS.pool_fraction,
            pool_size=FLAGS.pool_size, pool_volume=_numbers("pool_volume"),
            pool_iterations=FLAGS.pool_iterations)
    model = training.ModelConfig(
        width=FLAGS.width, dilations=_numbers("dilations", int), init_density=FLAGS.init_density,
        canonical=FLAGS.canonical, mirror_average=FLAGS.mirror_average,
        ndim=len(problem.shape), hard_values=FLAGS.hard_values,
        energy_channel=FLAGS.energy_channel)
    loss = training.LossConfig(
        volume_weight=FLAGS.volume_weight, excess_weight=FLAGS.excess_weight, penal=FLAGS.penal,
        initial_penal=FLAGS.initial_penal, rounded_weight=FLAGS.rounded_weight,
        rounded_start=FLAGS.rounded_start, initial_sharpness=FLAGS.initial_sharpness,
        leak=FLAGS.leak)
    return training.TrainConfig(
        steps=FLAGS.steps, batch_size=FLAGS.batch_size, learning_rate=FLAGS.learning_rate,
        warmup_steps=FLAGS.warmup_steps, clip_norm=FLAGS.clip_norm, log_every=FLAGS.log_every,
        seed=FLAGS.seed or 0, problem=problem, model=model, loss=loss)


def command_line() -> str:
    """``python -m sphyr_jax train`` with every flag the run was given, flag files expanded."""
    from sphyr_jax.app.cli import command_flags

    given = [FLAGS[name].serialize() for name in command_flags(NAME) if FLAGS[name].present]
    return " ".join(["python -m sphyr_jax", NAME, *given])


def _source(name: str) -> str:
    """An embedded set's folder for its name, else the path as given."""
    from sphyr_jax.data import EMBEDDED_SETS, embedded

    return embedded(name) if name in EMBEDDED_SETS else name


def eval_groups() -> list:
    """The evaluation groups the flags describe (subject x direction x source)."""
    from sphyr_jax import training

    subjects = FLAGS.eval_subjects or None
    sources = [_source(s) for s in FLAGS.eval_data if s]
    groups = training.load_dataset_groups(sources, subjects, FLAGS.eval_limit)
    for root in FLAGS.eval_results:
        groups += training.load_results_groups(root, subjects, FLAGS.eval_limit)
    if FLAGS.eval_rotations:
        groups = training.add_turned_groups(groups)
    return groups


def _print_summary(out: dict) -> None:
    for source, s in out.get("summary", {}).items():
        means = ", ".join(f"{n} {m['topology_score']:.3f} ({100 * m['load_carrying']:.0f}%)"
                          for n, m in s["mean"].items())
        print(f"{source}: mean over groups: {means}")
        for name, lost in s["model_not_above"].items():
            print(f"  model not above {name} on {len(lost)} groups: "
                  + ", ".join(f"{a}/{b} {c:.3f}<={d:.3f}" for a, b, c, d in lost))
    for key in ("train_seconds", "eval_seconds", "load_average"):
        if key in out:
            print(f"{key} {out[key]:.3g}" if key == "load_average" else f"{key} {out[key]:.0f}")


def main() -> int:
    from sphyr_jax import training

    workdir = common.require("workdir", NAME)
    groups = eval_groups() if (FLAGS.eval or FLAGS.eval_only) else []
    print(f"{len(groups)} evaluation groups, {sum(len(g.records) for g in groups)} records",
          file=sys.stderr)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with common.progress() as progress:
        if FLAGS.eval_only:
            model = training.load_model(FLAGS.checkpoint or workdir)
            out = training.evaluate_model(model, groups, workdir, common.cache(), log,
                                          FLAGS.num_devices, progress=progress)
        else:
            out = training.run_experiment(config_from_flags(), workdir, groups, common.cache(),
                                          log=log, num_devices=FLAGS.num_devices,
                                          progress=progress, command=command_line())
    _print_summary(out)
    common.write_json({k: v for k, v in out.items() if k != "curve"})
    return 0
