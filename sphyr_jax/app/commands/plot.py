"""``plot``: a PNG of a results record, a validate table or a leaderboard."""

from __future__ import annotations

from absl import flags

from sphyr_jax.app import common

NAME = "plot"
SUMMARY = "Draw a results record, a validate JSON or a leaderboard JSON as a PNG."

flags.DEFINE_string("input", None, "Results file, validate JSON or leaderboard JSON to plot.")
flags.DEFINE_integer("index", 0, "Record of a results file to plot.", lower_bound=0)
flags.DEFINE_string("output", "plot.png", "PNG to write.")

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.app.plotting import render_file

    source = common.require("input", NAME, exists=True)
    out = render_file(source, FLAGS.output, index=FLAGS.index, cache=common.cache())
    print(f"wrote {out}")
    return 0
