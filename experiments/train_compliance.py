"""Train a density model against differentiable compliance, then score it on every subject.

The model is trained only on random problems (no dataset answers): all eight
SPhyR mask variants, both formats, all four load directions.  It then completes
the inputs of every subject and load direction of the evaluation data, which
are scored physically beside the empty / solid baselines (and stored model
completions with ``--eval_results``).  Writes the checkpoint (``model.eqx`` +
``model.json``), ``<workdir>/metrics.json`` (training curve, summary) and the
leaderboard (``leaderboard.json``, ``leaderboard.md``, ``leaderboard_<source>.png``).

    python experiments/train_compliance.py --flagfile=configs/train_smoke.cfg \
        --workdir=runs/smoke --optimum_cache_dir=runs/optima

    # score a trained model again (or on other data) without training:
    python experiments/train_compliance.py --eval_only --checkpoint=runs/smoke \
        --workdir=runs/smoke_eval --optimum_cache_dir=runs/optima
"""

from __future__ import annotations

import pathlib
import sys

from absl import app, flags, logging

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a source checkout
    sys.path.insert(0, str(REPO))

import sphyr_jax  # noqa: E402
from sphyr_jax import training  # noqa: E402
from sphyr_jax.data import embedded  # noqa: E402
from sphyr_jax.progress import ProgressBar  # noqa: E402

FLAGS = flags.FLAGS
_D = training.TrainConfig()
_P, _M, _L = _D.problem, _D.model, _D.loss
DEFAULT_EVAL_DATA = [embedded("dataset")] + [
    embedded(f"dataset_{tag}") for tag in ("3_rotations", "2_rotations", "1_rotations")]

flags.DEFINE_string("workdir", None, "Output folder (checkpoint, metrics.json, leaderboard).")
flags.DEFINE_bool("eval_only", False, "Score the model in --checkpoint; no training.")
flags.DEFINE_string("checkpoint", None, "Folder of a trained model (model.eqx + model.json) "
                    "for --eval_only (default: --workdir).")
flags.DEFINE_list("eval_data", DEFAULT_EVAL_DATA,
                  "Dataset folders or subject files to score on (a folder's rotation tag, e.g. "
                  "_3_rotations, or the records' gravity_dir gives the load direction); '' none.")
flags.DEFINE_list("eval_results", [], "Results trees (<model>/<subject>_results.json) whose "
                  "records are scored with the stored completions beside the model.")
flags.DEFINE_list("eval_subjects", [], "Subjects to score (default: all available).")
flags.DEFINE_integer("eval_limit", None, "Score only the first N records of each subject file.")
flags.DEFINE_bool("eval_rotations", False, "Also score every record turned into the load "
                  "directions its source lacks (the model only; stored completions are not).")
flags.DEFINE_bool("eval", True, "Score after training.")
flags.DEFINE_string("optimum_cache_dir", "", "Folder persisting reference optima ('' = memory).")
flags.DEFINE_integer("seed", _D.seed, "Seed of model init, pool and problems.")
flags.DEFINE_integer("steps", _D.steps, "Training steps.")
flags.DEFINE_integer("batch_size", _D.batch_size, "Random problems per step.")
flags.DEFINE_float("learning_rate", _D.learning_rate, "Peak Adam learning rate.")
flags.DEFINE_integer("warmup_steps", _D.warmup_steps, "Linear warmup steps.")
flags.DEFINE_float("clip_norm", _D.clip_norm, "Global gradient-norm clip.")
flags.DEFINE_integer("log_every", _D.log_every, "Steps per training-curve entry.")
flags.DEFINE_integer("width", _M.width, "Feature channels of the model.")
flags.DEFINE_list("dilations", [str(d) for d in _M.dilations], "Dilation of each conv block.")
flags.DEFINE_float("init_density", _M.init_density, "Initial density of design cells.")
flags.DEFINE_bool("canonical", _M.canonical, "Turn every input so its load points down "
                  "(exact quarter-turn equivariance).")
flags.DEFINE_bool("mirror_average", _M.mirror_average, "Average the logits of the input and "
                  "its mirror image (exact mirror equivariance).")
flags.DEFINE_float("volume_weight", _L.volume_weight, "Material price on the volume fraction.")
flags.DEFINE_float("penal", _L.penal, "Final SIMP exponent of the soft term.")
flags.DEFINE_float("initial_penal", _L.initial_penal, "Initial SIMP exponent (continuation).")
flags.DEFINE_float("rounded_weight", _L.rounded_weight, "Final weight of the rounded term.")
flags.DEFINE_float("rounded_start", _L.rounded_start, "Progress where the rounded term starts.")
flags.DEFINE_float("initial_sharpness", _L.initial_sharpness, "Initial logit scale.")
flags.DEFINE_float("leak", _L.leak, "Floor added to the sigmoid derivative.")
flags.DEFINE_list("shape", [str(v) for v in _P.shape], "Grid of the training problems: "
                  "nely,nelx or nz,ny,nx (voxels; a 3D model, loads pointing down).")
flags.DEFINE_list("load_run", [str(v) for v in _P.load_run], "Load run length min,max.")
flags.DEFINE_list("support_run", [str(v) for v in _P.support_run], "Support run length min,max.")
flags.DEFINE_list("variant_weights", [str(v) for v in _P.variant_weights],
                  f"Relative frequency of the mask variants {training.MASK_VARIANTS}.")
flags.DEFINE_float("hard_fraction", _P.hard_fraction, "Share of one-decimal (hard) problems.")
flags.DEFINE_list("direction_weights", [str(v) for v in _P.direction_weights],
                  f"Relative frequency of the load directions {training.DIRECTION_NAMES}.")
flags.DEFINE_float("mirror_fraction", _P.mirror_fraction, "Share of mirrored problems.")
flags.DEFINE_float("pool_fraction", _P.pool_fraction, "Share of problems from the design pool.")
flags.DEFINE_integer("pool_size", _P.pool_size, "Designs in the pool.")
flags.DEFINE_list("pool_volume", [str(v) for v in _P.pool_volume], "Pool budget range min,max.")
flags.DEFINE_integer("pool_iterations", _P.pool_iterations, "SIMP iterations per pool design.")
flags.mark_flag_as_required("workdir")


def _ints(values):
    return tuple(int(v) for v in values)


def _floats(values):
    return tuple(float(v) for v in values)


def config_from_flags() -> training.TrainConfig:
    """The training configuration the flags describe."""
    shape = _ints(FLAGS.shape)
    problem = training.ProblemConfig(
        shape=shape, load_run=_ints(FLAGS.load_run), support_run=_ints(FLAGS.support_run),
        variant_weights=_floats(FLAGS.variant_weights), hard_fraction=FLAGS.hard_fraction,
        direction_weights=_floats(FLAGS.direction_weights),
        mirror_fraction=FLAGS.mirror_fraction, pool_fraction=FLAGS.pool_fraction,
        pool_size=FLAGS.pool_size, pool_volume=_floats(FLAGS.pool_volume),
        pool_iterations=FLAGS.pool_iterations)
    model = training.ModelConfig(width=FLAGS.width, dilations=_ints(FLAGS.dilations),
                                 init_density=FLAGS.init_density, canonical=FLAGS.canonical,
                                 mirror_average=FLAGS.mirror_average, ndim=len(shape))
    loss = training.LossConfig(
        volume_weight=FLAGS.volume_weight, penal=FLAGS.penal, initial_penal=FLAGS.initial_penal,
        rounded_weight=FLAGS.rounded_weight, rounded_start=FLAGS.rounded_start,
        initial_sharpness=FLAGS.initial_sharpness, leak=FLAGS.leak)
    return training.TrainConfig(
        steps=FLAGS.steps, batch_size=FLAGS.batch_size, learning_rate=FLAGS.learning_rate,
        warmup_steps=FLAGS.warmup_steps, clip_norm=FLAGS.clip_norm, log_every=FLAGS.log_every,
        seed=FLAGS.seed, problem=problem, model=model, loss=loss)


def eval_groups() -> list:
    """The evaluation groups the flags describe (subject x direction x source)."""
    subjects = FLAGS.eval_subjects or None
    sources = [s for s in FLAGS.eval_data if s]
    groups = training.load_dataset_groups(sources, subjects, FLAGS.eval_limit)
    for root in FLAGS.eval_results:
        groups += training.load_results_groups(root, subjects, FLAGS.eval_limit)
    if FLAGS.eval_rotations:
        groups = training.add_turned_groups(groups)
    return groups


def main(argv):
    del argv
    sphyr_jax.enable_x64()
    sphyr_jax.enable_compilation_cache()
    from sphyr_jax.topopt.optimum import OptimumCache

    cache = OptimumCache(FLAGS.optimum_cache_dir or None)
    groups = eval_groups() if (FLAGS.eval or FLAGS.eval_only) else []
    logging.info("%d evaluation groups, %d records", len(groups),
                 sum(len(g.records) for g in groups))
    with ProgressBar() as progress:  # the scoring's stages on stderr
        if FLAGS.eval_only:
            model = training.load_checkpoint(FLAGS.checkpoint or FLAGS.workdir)
            out = training.evaluate_model(model, groups, FLAGS.workdir, cache, logging.info,
                                          progress=progress)
        else:
            out = training.run_experiment(config_from_flags(), FLAGS.workdir, groups, cache,
                                          log=logging.info, progress=progress)
    for source, s in out.get("summary", {}).items():
        means = ", ".join(f"{n} {m['topology_score']:.3f} ({100 * m['load_carrying']:.0f}%)"
                          for n, m in s["mean"].items())
        print(f"{source}: mean over groups: {means}")
        for name, lost in s["model_not_above"].items():
            print(f"  model not above {name} on {len(lost)} groups: "
                  + ", ".join(f"{a}/{b} {c:.3f}<={d:.3f}" for a, b, c, d in lost))
    if "train_seconds" in out:
        print(f"train_seconds {out['train_seconds']:.0f}")
    if "eval_seconds" in out:
        print(f"eval_seconds {out['eval_seconds']:.0f}")


if __name__ == "__main__":
    app.run(main)
