"""Train a density model against differentiable compliance, then score it on a subject.

The model is trained only on random problems (no dataset answers), then
completes a SPhyR subject's inputs, which are scored physically.  Writes
``<workdir>/metrics.json`` (evaluation means, baselines, training curve),
``<workdir>/eval_records.json`` and the checkpoint (``model.eqx`` +
``model.json``).

    python experiments/train_compliance.py --flagfile=configs/train_smoke.cfg \\
        --workdir=runs/smoke --eval_limit=40
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
from sphyr_jax.datasets import is_hard, list_subjects, load_subject  # noqa: E402

FLAGS = flags.FLAGS
_D = training.TrainConfig()
_P, _M, _L = _D.problem, _D.model, _D.loss

flags.DEFINE_string("workdir", None, "Output folder (checkpoint, metrics.json).")
flags.DEFINE_string("eval_data", str(REPO / "data" / "dataset"),
                    "Evaluation subject source: a .jsonl/.json file or a dataset folder.")
flags.DEFINE_string("eval_subject", "full_easy", "Subject to evaluate (folder sources).")
flags.DEFINE_integer("eval_limit", None, "Evaluate only the first N records.")
flags.DEFINE_bool("eval", True, "Evaluate after training.")
flags.DEFINE_bool("baselines", False, "Also score all-empty / all-solid completions.")
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
flags.DEFINE_float("volume_weight", _L.volume_weight, "Material price on the volume fraction.")
flags.DEFINE_float("penal", _L.penal, "Final SIMP exponent of the soft term.")
flags.DEFINE_float("initial_penal", _L.initial_penal, "Initial SIMP exponent (continuation).")
flags.DEFINE_float("rounded_weight", _L.rounded_weight, "Final weight of the rounded term.")
flags.DEFINE_float("rounded_start", _L.rounded_start, "Progress where the rounded term starts.")
flags.DEFINE_float("initial_sharpness", _L.initial_sharpness, "Initial logit scale.")
flags.DEFINE_float("leak", _L.leak, "Floor added to the sigmoid derivative.")
flags.DEFINE_list("load_run", [str(v) for v in _P.load_run], "Load run length min,max.")
flags.DEFINE_list("support_run", [str(v) for v in _P.support_run], "Support run length min,max.")
flags.DEFINE_list("mask_weights", [str(v) for v in _P.mask_weights],
                  f"Relative frequency of the mask kinds {training.MASK_KINDS}.")
flags.DEFINE_list("row_counts", [str(v) for v in _P.row_counts], "Random-row mask counts.")
flags.DEFINE_list("column_counts", [str(v) for v in _P.column_counts], "Random-column counts.")
flags.DEFINE_list("cell_counts", [str(v) for v in _P.cell_counts], "Random-cell mask draws.")
flags.DEFINE_bool("random_gravity", _P.random_gravity, "Train on all four load directions.")
flags.DEFINE_float("pool_fraction", _P.pool_fraction, "Share of problems from the design pool.")
flags.DEFINE_integer("pool_size", _P.pool_size, "Designs in the pool.")
flags.DEFINE_list("pool_volume", [str(v) for v in _P.pool_volume], "Pool budget range min,max.")
flags.DEFINE_integer("pool_iterations", _P.pool_iterations, "SIMP iterations per pool design.")
flags.DEFINE_bool("hard", None, "Train for one-decimal subjects (default: as the eval subject).")
flags.mark_flag_as_required("workdir")


def _ints(values):
    return tuple(int(v) for v in values)


def _floats(values):
    return tuple(float(v) for v in values)


def eval_subject_and_format() -> tuple[str, bool]:
    """The subject to load and whether it is a one-decimal (hard) subject."""
    path = pathlib.Path(FLAGS.eval_data)
    subject = path.stem if path.is_file() and path.stem in list_subjects() else FLAGS.eval_subject
    return subject, is_hard(subject)


def config_from_flags(hard: bool) -> training.TrainConfig:
    """The training configuration the flags describe."""
    problem = training.ProblemConfig(
        load_run=_ints(FLAGS.load_run), support_run=_ints(FLAGS.support_run),
        mask_weights=_floats(FLAGS.mask_weights), row_counts=_ints(FLAGS.row_counts),
        column_counts=_ints(FLAGS.column_counts), cell_counts=_ints(FLAGS.cell_counts),
        random_gravity=FLAGS.random_gravity, pool_fraction=FLAGS.pool_fraction,
        pool_size=FLAGS.pool_size, pool_volume=_floats(FLAGS.pool_volume),
        pool_iterations=FLAGS.pool_iterations, hard=hard)
    model = training.ModelConfig(width=FLAGS.width, dilations=_ints(FLAGS.dilations),
                                 init_density=FLAGS.init_density)
    loss = training.LossConfig(
        volume_weight=FLAGS.volume_weight, penal=FLAGS.penal, initial_penal=FLAGS.initial_penal,
        rounded_weight=FLAGS.rounded_weight, rounded_start=FLAGS.rounded_start,
        initial_sharpness=FLAGS.initial_sharpness, leak=FLAGS.leak)
    return training.TrainConfig(
        steps=FLAGS.steps, batch_size=FLAGS.batch_size, learning_rate=FLAGS.learning_rate,
        warmup_steps=FLAGS.warmup_steps, clip_norm=FLAGS.clip_norm, log_every=FLAGS.log_every,
        seed=FLAGS.seed, problem=problem, model=model, loss=loss)


def main(argv):
    del argv
    sphyr_jax.enable_x64()
    from sphyr_jax.optimum import OptimumCache

    subject, hard = eval_subject_and_format()
    records = (load_subject(FLAGS.eval_data, subject, limit=FLAGS.eval_limit)
               if FLAGS.eval else [])
    cfg = config_from_flags(hard if FLAGS.hard is None else FLAGS.hard)
    cache = OptimumCache(FLAGS.optimum_cache_dir or None)
    out = training.run_experiment(cfg, FLAGS.workdir, records, hard, cache,
                                  baselines=FLAGS.baselines, log=logging.info)
    logging.info("wrote %s", pathlib.Path(FLAGS.workdir) / "metrics.json")
    print({k: v for k, v in out.items() if k.startswith(("eval_", "baseline_", "train_"))})


if __name__ == "__main__":
    app.run(main)
