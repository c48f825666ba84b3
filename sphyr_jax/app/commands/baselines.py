"""``baselines``: results files of the fixed baselines (empty, solid, random) on a dataset."""

from __future__ import annotations

from sphyr_jax.app import common

NAME = "baselines"
SUMMARY = "Write results files of the fixed baselines (empty, solid, random fills)."


def main() -> int:
    from sphyr_jax.evaluation.baselines import write_baseline_results

    dataset = common.dataset()
    root = common.require("results_root", NAME)
    paths = write_baseline_results(dataset, root, seed=common.FLAGS.seed or 0)
    print(f"wrote {len(paths)} results files under {root}")
    return 0
