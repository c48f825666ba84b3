"""``convert``: raw SPhyR CSVs to the 16 subject files."""

from __future__ import annotations

import sys

from absl import flags

from sphyr_jax.app import common

NAME = "convert"
SUMMARY = "Convert a folder of raw SPhyR CSVs into the 16 subject files."

flags.DEFINE_string("raw_dir", None, "Folder of *_SPhyR_2D.csv (or _3D) raw samples.")
flags.DEFINE_bool("skip_unsolvable", False,
                  "Leave out raw samples with no load or no support cell (named on stderr) "
                  "instead of stopping.")

SHARED = ("output_dir", "seed", "format")

FLAGS = flags.FLAGS


def main() -> int:
    from sphyr_jax.data.convert import convert_raw_dir
    from sphyr_jax.errors import UserInputError

    fmt = FLAGS.format or "jsonl"
    if fmt not in ("jsonl", "json"):
        raise UserInputError(f"convert writes --format=jsonl or json, not {fmt}")
    raw_dir = common.require("raw_dir", NAME, exists=True)
    output_dir = common.require("output_dir", NAME)
    seed = 42 if FLAGS.seed is None else FLAGS.seed
    written = convert_raw_dir(raw_dir, output_dir, seed=seed, fmt=fmt,
                              skip_unsolvable=FLAGS.skip_unsolvable,
                              log=lambda m: print(m, file=sys.stderr))
    print(f"converted {raw_dir} -> {output_dir}: {len(written)} subject files")
    return 0
