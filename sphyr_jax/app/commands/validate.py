"""``validate``: score the dataset answer and reference completions of one subject."""

from __future__ import annotations

from absl import flags

from sphyr_jax.app import common

NAME = "validate"
SUMMARY = "Score a subject's answers and reference completions against the optimum (a table)."

flags.DEFINE_string("subject", "full_easy", "Subject to validate.")
flags.DEFINE_integer("samples", 20, "Records of the subject to validate.", lower_bound=1)

SHARED = ("dataset_dir", "dataset_version", "design_efficiency", "output_json", "progress",
          *common.SCORING)

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.data.datasets import load_subject, subject_ndim
    from sphyr_jax.errors import UserInputError
    from sphyr_jax.scoring.validation import validate_records

    source = common.dataset(subject_ndim(FLAGS.subject))
    records = load_subject(source, FLAGS.subject, limit=FLAGS.samples)
    if not records:
        raise UserInputError(f"no records of {FLAGS.subject} in {source}")
    with common.progress() as progress:
        report = validate_records(records, FLAGS.subject, cache=common.cache(),
                                  num_devices=FLAGS.num_devices,
                                  design_efficiency=FLAGS.design_efficiency, progress=progress)
    print(f"\n{FLAGS.subject}: {report.samples} samples from {source} "
          f"(optimum={report.optimum})\n")
    print(report.table())
    print(report.line())
    common.write_json(report.as_dict())
    return 0
