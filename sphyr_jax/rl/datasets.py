"""Prompt datasets for trainers: a generated corpus to train on, the benchmark to test on.

:func:`prompt_dataset` builds a ``datasets.Dataset`` whose ``prompt`` column
holds the benchmark's prompts and whose other columns are what
:func:`~sphyr_jax.rl.reward.topology_reward` reads.  Training reads a
generated corpus (``split="train"``: a folder made by ``python -m sphyr_jax
generate --dataset_version=v2``, :mod:`sphyr_jax.data.corpus`, whose samples
are held apart from every benchmark sample and whose records carry their own
optimum, so the reward never optimises for them); the benchmark sets are the
test data (``split="test"``) and are refused for training.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from sphyr_jax.data.corpus import is_corpus
from sphyr_jax.data.datasets import HUB_ID, list_subjects, load_subject
from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.prompts import DEFAULT_SEED, PromptSpec, Style
from sphyr_jax.rl.samples import build_samples

Split = Literal["train", "test"]
SPLITS = ("train", "test")


def _check_split(dataset_dir, split: str) -> None:
    """Training reads a generated corpus, testing anything else (the benchmark sets)."""
    if split not in SPLITS:
        raise UserInputError(f"split must be one of {SPLITS}, got {split!r}")
    local = os.path.exists(dataset_dir)
    corpus = local and is_corpus(dataset_dir)
    if split == "train" and not corpus and (local or str(dataset_dir).endswith(HUB_ID)):
        raise UserInputError(
            f"split='train' reads a generated training corpus, and {os.fspath(dataset_dir)!r} "
            "is not one (benchmark sets are test data: split='test'); make one with "
            "python -m sphyr_jax generate --dataset_version=v2 --num_samples=N --output_dir=DIR")
    if split == "test" and corpus:
        raise UserInputError(f"{os.fspath(dataset_dir)!r} is a generated training corpus: "
                             "split='train'")


def prompt_dataset(dataset_dir: str | os.PathLike, subjects: Sequence[str] | None = None, *,
                   split: Split = "train", rotations: Sequence[int] = (0,),
                   style: Style = "default", template: str | None = None, few_shot: int = 0,
                   sample_count: int | None = None, seed: int = DEFAULT_SEED,
                   conversational: bool = False):
    """A ``datasets.Dataset`` of prompts with the columns :func:`topology_reward` reads.

    Args:
        dataset_dir: ``split="train"``: a generated corpus (a folder written
            by :func:`sphyr_jax.data.corpus.build_corpus`, or its copy on the
            hub); ``split="test"``: a benchmark set (a folder, subject file or
            hub name, :func:`sphyr_jax.data.datasets.load_subject`).
        subjects: subject names (default: the 16 of the benchmark).
        split: ``"train"`` (a corpus; a benchmark set is refused) or ``"test"``.
        rotations: clockwise quarter turns; every subject appears once per turn.
        style: prompt style (:data:`sphyr_jax.evaluation.prompts.STYLES`).
        template: a prompt template with a ``{GRID}`` placeholder (wins over ``style``).
        few_shot: solved examples of the same subject in each prompt.
        sample_count: first N samples of each subject in the shuffled order
            (None: all; a large corpus is read whole, so bound it here).
        seed: the order's shuffle seed (published: 42).
        conversational: ``prompt`` as chat messages (``[{"role": "user", ...}]``).

    Returns:
        A dataset with columns ``prompt``, ``input_grid`` and ``ground_truth``
        (text), ``gravity_dir`` ([row, col]), ``subject``, ``rotation_count``,
        ``sample_index`` (position in the shuffled order) and ``index`` (the
        dataset record's), plus ``optimum`` when the records carry stored
        optima (a corpus always does; turned records do not keep it).

    Raises:
        UserInputError: an unknown subject, style, rotation or split, a
            benchmark set for training, or a missing dataset.
    """
    import datasets

    _check_split(dataset_dir, split)
    names = list(subjects) if subjects is not None else list_subjects()
    known = set(list_subjects())
    for name in names:
        if name not in known:
            raise UserInputError(f"unknown subject {name!r}; subjects: {sorted(known)}")
    rows = []
    for name in names:
        records = load_subject(dataset_dir, name)
        for turns in rotations:
            spec = PromptSpec(style=style, template=template, rotations=int(turns),
                              few_shot=few_shot)
            for s in build_samples(records, name, spec, sample_count, seed):
                rows.append({
                    "prompt": [{"role": "user", "content": s.prompt}] if conversational
                    else s.prompt,
                    "input_grid": s.input_grid,
                    "ground_truth": s.ground_truth,
                    "gravity_dir": [float(v) for v in s.gravity_dir],
                    "subject": s.subject,
                    "rotation_count": s.rotation_count,
                    "sample_index": s.index,
                    "index": s.record_index,
                    "optimum": s.optimum,  # unturned rows only: a turn is another problem
                })
    if not any(row["optimum"] is not None for row in rows):
        for row in rows:
            del row["optimum"]
    return datasets.Dataset.from_list(rows)

