"""A prompt dataset in the layout each trainer reads: veRL's parquet, OpenRLHF's JSONL.

Every exported row carries its sample's label
(:func:`sphyr_jax.scoring.labels.problem_label`), which the reward reads back
(:mod:`sphyr_jax.rl.verl`, :mod:`sphyr_jax.rl.openrlhf`), so the reward needs
nothing but the row.

* ``verl`` (parquet, read by veRL's ``RLHFDataset``): ``data_source``
  (``sphyr/<subject>``), ``prompt`` (chat messages, one user message),
  ``ability``, ``reward_model`` (``{"style": "rule", "ground_truth": label}``)
  and ``extra_info`` (``index``, ``subject``, ``gravity_dir``,
  ``rotation_count``, ``sample_index`` and ``optimum``, the stored optimum
  or null; every row has every key, as parquet's struct columns need).
* ``openrlhf`` (JSONL, read with ``--data.input_key prompt
  --data.label_key label``): ``prompt`` (text), ``label``, ``subject`` and
  ``index``.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Sequence
from typing import Literal

from sphyr_jax.evaluation.prompts import DEFAULT_SEED, Style
from sphyr_jax.io import atomic_write_bytes, atomic_write_text
from sphyr_jax.rl.datasets import Split
from sphyr_jax.scoring.labels import problem_label

Trainer = Literal["verl", "openrlhf"]
TRAINERS = ("verl", "openrlhf")
ABILITY = "spatial-physical-reasoning"
"""The ``ability`` of veRL rows."""


def _prompt_text(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m.get("content", "") for m in prompt if m.get("role") == "user")


def verl_row(row: dict) -> dict:
    """A prompt-dataset row in veRL's layout (see the module docstring)."""
    return {
        "data_source": f"sphyr/{row['subject']}",
        "prompt": [{"role": "user", "content": _prompt_text(row["prompt"])}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": problem_label(row)},
        "extra_info": {"index": row.get("index"), "subject": row["subject"],
                       "gravity_dir": [float(v) for v in row["gravity_dir"]],
                       "rotation_count": row.get("rotation_count", 0),
                       "sample_index": row.get("sample_index"),
                       "optimum": row.get("optimum")},
    }


def openrlhf_row(row: dict) -> dict:
    """A prompt-dataset row in OpenRLHF's layout (see the module docstring)."""
    return {"prompt": _prompt_text(row["prompt"]), "label": problem_label(row),
            "subject": row["subject"], "index": row.get("index")}


def trainer_rows(rows: Iterable[dict], trainer: Trainer) -> list[dict]:
    """Prompt-dataset rows (:func:`~sphyr_jax.rl.prompt_dataset`) in a trainer's layout."""
    if trainer not in TRAINERS:
        raise ValueError(f"trainer must be one of {TRAINERS}, got {trainer!r}")
    convert = verl_row if trainer == "verl" else openrlhf_row
    return [convert(row) for row in rows]


def write_rows(rows: Sequence[dict], path: str | os.PathLike, trainer: Trainer) -> None:
    """Write a trainer's rows atomically: parquet for veRL, JSONL for OpenRLHF."""
    if trainer == "openrlhf":
        atomic_write_text(path, "".join(json.dumps(r, separators=(",", ":")) + "\n"
                                        for r in rows))
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(list(rows)), buffer)
    atomic_write_bytes(path, buffer.getvalue())


def export_dataset(dataset_dir, output: str | os.PathLike, trainer: Trainer, *,
                   subjects: Sequence[str] | None = None, split: Split = "train",
                   rotations: Sequence[int] = (0,),
                   style: Style = "default", template: str | None = None, few_shot: int = 0,
                   sample_count: int | None = None, seed: int = DEFAULT_SEED) -> int:
    """Write a dataset's prompts in a trainer's layout; returns the number of rows.

    Args:
        dataset_dir: a dataset folder, subject file or hub name.
        output: the file to write (parquet for ``verl``, JSONL for ``openrlhf``).
        trainer: ``"verl"`` or ``"openrlhf"``.
        subjects: subject names (None: every subject present).
        split: ``"train"`` (a generated corpus; a benchmark set is refused) or
            ``"test"`` (a benchmark set).
        rotations: clockwise quarter turns, one row per sample and turn.
        style: the prompt style of the evaluation harness.
        template: a prompt template with ``{GRID}`` (instead of ``style``).
        few_shot: solved examples shown before the task.
        sample_count: samples per subject after the published shuffle (None: all).
        seed: the shuffle's seed.

    The prompts are :func:`~sphyr_jax.rl.prompt_dataset`'s of the same options.

    Raises:
        UserInputError: as :func:`~sphyr_jax.rl.prompt_dataset`.
    """
    from sphyr_jax.rl.datasets import prompt_dataset

    dataset = prompt_dataset(dataset_dir, subjects, split=split, rotations=rotations, style=style,
                             template=template, few_shot=few_shot, sample_count=sample_count,
                             seed=seed)
    rows = trainer_rows(dataset.to_list(), trainer)
    write_rows(rows, output, trainer)
    return len(rows)
