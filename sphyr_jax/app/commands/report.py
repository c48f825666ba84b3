"""``report``: the paper's leaderboard tables and bar charts of a results tree."""

from __future__ import annotations

import sys

from absl import flags

from sphyr_jax.app import common

NAME = "report"
SUMMARY = "Write leaderboard tables (Markdown, LaTeX) and bar charts of a results tree."

flags.DEFINE_list("report_metrics", [],
                  "Metrics to report (default: every static and structural metric).")
flags.DEFINE_bool("figures", True, "Also draw a bar chart per metric and difficulty "
                  "(PNG and PDF; needs matplotlib).")

SHARED = ("results_root", "output_dir", "output_json")

FLAGS = flags.FLAGS


def _known_metrics(values) -> bool:
    if not values:
        return True
    from sphyr_jax.evaluation.report import METRICS  # only when the flag is given

    return set(values) <= {spec.key for spec in METRICS}


flags.register_validator("report_metrics", _known_metrics,
                         "--report_metrics names a metric that is not reported; see the "
                         "static and structural metric tables of the scoring guide "
                         "(docs/guides/scoring.md) for the names")


def main() -> int:
    from sphyr_jax.evaluation.report import write_report

    root = common.require("results_root", NAME, exists=True)
    out = common.require("output_dir", NAME)
    summary = write_report(root, out, metrics=FLAGS.report_metrics or None,
                           figures=FLAGS.figures, log=lambda m: print(m, file=sys.stderr))
    for experiment in summary.experiments:
        print(f"{experiment}: {out}/{experiment}.md, {out}/{experiment}.tex")
    for experiment, model, subject in summary.missing:
        print(f"missing: {experiment} {model} {subject}", file=sys.stderr)
    if summary.unscored:
        print(f"no table of {', '.join(summary.unscored)}: no record holds them; add them with "
              f"python -m sphyr_jax rescore --results_root={root}", file=sys.stderr)
    print(summary.line())
    common.write_json({"experiments": summary.experiments, "files": summary.files,
                       "missing": summary.missing})
    return 0
