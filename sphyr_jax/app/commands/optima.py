"""``optima``: the optimum of every record of a dataset, written beside it.

Writes <dataset_dir>/optima/<subject>.jsonl for every subject the folder holds
(one line {"index", "optimum"} per record; the records are left as they are).
Scoring that reads the folder (evaluate, the reward, the environment) then uses
each stored optimum while its key matches the record, instead of optimising.
"""

from __future__ import annotations

from sphyr_jax.app import common

NAME = "optima"
SUMMARY = ("Store the optimum of every record of a dataset folder beside it "
           "(<dataset_dir>/optima/).")

SHARED = ("dataset_dir", "dataset_version", "optimum", "output_json", "progress",
          *common.ENGINE)


def main() -> int:
    from sphyr_jax.data.corpus import add_optima

    with common.progress() as progress, common.engine() as engine:
        summary = add_optima(common.dataset(), engine=engine, yardstick=common.FLAGS.optimum,
                             progress=progress)
    count = sum(summary["records"].values())
    print(f"optima of {count} records ({len(summary['records'])} subjects, "
          f"{summary['yardstick']} yardstick) written to {summary['dataset_dir']}/optima/")
    common.write_json(summary)
    return 0
