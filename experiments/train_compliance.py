"""Train a density model against differentiable compliance, then score it on every subject.

The same run as ``python -m sphyr_jax train`` (this script hands its flags to
that command, whose module defines them: ``python -m sphyr_jax train --help``).
The model is trained only on random problems (no dataset answers) drawn by the
benchmark generators' rules, then completes the inputs of every subject and
load direction of the evaluation data, scored physically beside the empty /
solid baselines (and stored model completions with ``--eval_results``).

    python experiments/train_compliance.py --flagfile=configs/train_smoke.cfg \
        --workdir=runs/smoke --cache_dir=runs/optima

    # score a trained model again (or on other data) without training:
    python experiments/train_compliance.py --eval_only --checkpoint=runs/smoke \
        --workdir=runs/smoke_eval --cache_dir=runs/optima
"""

from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a source checkout
    sys.path.insert(0, str(REPO))

from sphyr_jax.app import cli  # noqa: E402

if __name__ == "__main__":
    cli.run([sys.argv[0], "train", *sys.argv[1:]])
