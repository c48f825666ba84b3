"""``plot``: a PNG of a results record, a validate table or a leaderboard."""

from __future__ import annotations

from absl import flags

from sphyr_jax.app import common

NAME = "plot"
SUMMARY = ("Draw a results record, a validate JSON, a rescore leaderboard JSON or a trainer's "
           "leaderboard.json as a PNG.")

flags.DEFINE_string("input", None, "A results file, a validate --output_json, a rescore "
                    "--output_json or a trainer's leaderboard.json.")
flags.DEFINE_integer("index", 0, "Record of a results file to plot.", lower_bound=0)

SHARED = (*common.SCORING, "output")

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.app.plotting import render_file
    from sphyr_jax.errors import UserInputError

    try:
        import matplotlib  # noqa: F401  (the [plot] extra)
    except ImportError as exc:
        raise UserInputError("plot needs matplotlib: pip install 'sphyr-jax[plot]'") from exc

    source = common.require("input", NAME, exists=True)
    out = render_file(source, FLAGS.output or "plot.png", index=FLAGS.index, cache=common.cache())
    print(f"wrote {out}")
    return 0
