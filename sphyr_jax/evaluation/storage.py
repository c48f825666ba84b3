"""A run's results files: the records it writes, their JSON text, reading them back.

A record is ``subject``, ``prompt``, ``ground_truth``, ``completion``,
``model``, ``index`` and ``gravity_dir`` when known, ``input_grid`` when the
prompt's last grid is not the masked one, and (once scored) every metric
field.  A results file is ``json.dumps(records, indent=2)`` of its records,
the published files' layout, joined from each record's cached text
(:func:`encode_record`) so saving a file after every answer re-encodes only
the records that changed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sphyr_jax.problem.grids import as_grid, grid_to_text

SCORED_FIELD = "topology_score"
"""A record holding this field has been scored."""


def make_record(task, completion: str, model: str) -> dict:
    """The results record of one answered task (no metrics yet).

    Args:
        task: the :class:`~sphyr_jax.evaluation.tasks.Task` answered.
        completion: the model's reply, as it came.
        model: the model's name.
    """
    query = task.query
    record = {"subject": task.subject, "prompt": query.prompt,
              "ground_truth": task.ground_truth, "completion": completion, "model": model}
    if query.index is not None:
        record["index"] = query.index
    if query.gravity_dir is not None:
        record["gravity_dir"] = list(query.gravity_dir)
    if not task.grid_in_prompt:  # e.g. a custom template: scoring must not guess the grid
        record["input_grid"] = grid_to_text(as_grid(query.input_grid))
    return record


def encode_record(record: dict) -> str:
    """One record as ``json.dumps(records, indent=2)`` prints it inside the list.

    Scalars go through the C encoder, so a results file is joined from cached
    pieces instead of re-encoded in Python on every save (byte-equal to
    ``json.dumps(records, indent=2, ensure_ascii=False)``).
    """
    if not record:
        return "  {}"
    fields = []
    for key, value in record.items():
        text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
        fields.append(f"    {json.dumps(key, ensure_ascii=False)}: "
                      + text.replace("\n", "\n    "))
    return "  {\n" + ",\n".join(fields) + "\n  }"


def file_text(pieces: Sequence[str]) -> str:
    """A results file's text from its records' :func:`encode_record` texts."""
    return ("[\n" + ",\n".join(pieces) + "\n]\n") if pieces else "[]\n"
