"""``rescore``: add the physical metrics to every record of a results tree.

Exit status: 0 when every results file was scored and written; 1 when some
file was skipped (unreadable, corrupt, read-only, a link loop; each is named on
stderr with the reason and left byte for byte as it was) or none was found; 2
for a usage mistake (no ``--results_root``, a folder that does not exist).
"""

from __future__ import annotations

import sys

from absl import flags

from sphyr_jax.app import common

NAME = "rescore"
SUMMARY = "Score every record of a results tree in place and print the leaderboard."

flags.DEFINE_bool("dry_run", False, "Compute the metrics but write nothing.")
flags.DEFINE_integer("chunk", 4096, "Records scored per batch (bounds memory).", lower_bound=1)

SHARED = ("results_root", "design_efficiency", "output_json", "progress", *common.SCORING)

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.scoring.results import format_leaderboard, rescore_tree

    root = common.require("results_root", NAME, exists=True)
    with common.progress() as progress:
        summary = rescore_tree(root, dry_run=FLAGS.dry_run,
                               design_efficiency=FLAGS.design_efficiency, cache=common.cache(),
                               num_devices=FLAGS.num_devices, progress=progress,
                               chunk=FLAGS.chunk, log=lambda m: print(m, file=sys.stderr))
    if summary.files == 0 and not summary.skipped:
        print(f"no <model>/<subject>_results.json files under {root}", file=sys.stderr)
        return 1
    if FLAGS.dry_run:
        print("dry run: nothing was written")
    print()
    print(format_leaderboard(summary.leaderboard))
    print()
    print(summary.line())
    common.write_json({"rows": summary.leaderboard, "per_file": summary.per_file,
                       "skipped": summary.skipped, "invalid": summary.invalid,
                       "summary": summary.line()})
    if summary.skipped:
        print(f"{len(summary.skipped)} file(s) skipped and left untouched (listed above); "
              "exit status 1", file=sys.stderr)
        return 1
    return 0
