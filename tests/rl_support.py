"""Shared pieces of the reinforcement-learning tests: the data they use and its optima.

Every sample the RL tests score is listed by :func:`scored_samples`;
:func:`warm_optima` computes all their optima in one batched call into the
session's optimum cache, so the tests compile the yardstick once (for one
batch size) and never wait on an optimum afterwards.
"""

import random

from conftest import SETS

DATA = SETS / "dataset"


def published_order(subject, seed=42):
    """A subject's records in the published order, computed without the library's helpers."""
    from sphyr_jax.data.datasets import load_subject

    records = load_subject(DATA, subject)
    random.Random(seed).shuffle(records)
    return records


def scored_samples():
    """The samples the RL tests score (28 of them)."""
    from sphyr_jax.evaluation.prompts import PromptSpec
    from sphyr_jax.rl import build_samples

    def first(subject, n, turns=0):
        from sphyr_jax.data.datasets import load_subject

        return build_samples(load_subject(DATA, subject), subject, PromptSpec(rotations=turns),
                             sample_count=n)

    return (first("1_random_cell_easy", None) + first("1_random_cell_easy", 2, turns=1)
            + first("1_random_row_hard", 2) + first("1_random_row_hard", 1, turns=1)
            + first("1_random_row_easy", 3))


def warm_optima(cache):
    """Compute (or find) the optima of every scored sample, in one batch."""
    from sphyr_jax.scoring.records import score_records

    score_records([{"completion": s.ground_truth, "ground_truth": s.ground_truth,
                    "input_grid": s.input_grid, "gravity_dir": s.gravity_dir}
                   for s in scored_samples()], cache=cache)
    return cache


def fill(grid_text, value):
    """A grid's masked cells all set to ``value``."""
    return "\n".join(" ".join(value if t == "V" else t for t in row.split())
                     for row in grid_text.splitlines())
