"""One text form of a sample's problem: the label every trainer integration carries.

A trainer hands a reward function one string per sample besides the
completion: veRL's ``reward_model.ground_truth``, OpenRLHF's ``label``, a
TRL dataset's ``label`` column.  :func:`problem_label` writes everything
scoring needs into that string, and :func:`read_label` reads it back as the
record fields :func:`sphyr_jax.scoring.records.score_records` reads, so a
completion scored through any trainer gets the metrics it gets everywhere
else.

The label is compact JSON (no spaces) with a version tag::

    {"sphyr":1,"input":"0 L L\\nV V V\\nS S 0","answer":"0 L L\\n1 1 0\\nS S 0",
     "gravity":[1.0,0.0],"subject":"full_easy","optimum":{...}}

* ``input`` and ``answer``: the masked grid and the dataset answer as text
  (rows on lines, cells separated by one space; voxel layers separated by a
  blank line); ``input`` is null when the record has none.
* ``gravity``: the load direction, (row, col) or (layer, row, col).
* ``subject``: the subject name (null when unknown).
* ``optimum`` (only when the record carries one): its stored optimum
  (:func:`sphyr_jax.topopt.optimum.stored_optimum`) with the densities packed
  as base64 of little-endian float64 (``"densities_f64"`` and ``"shape"``),
  about half the size of the numbers written out and read back bit for bit.

A 10 x 10 label is about 0.5 kB, 1.6 kB with its optimum; 20 x 20, 1.7 and
6 kB.  Reading is memoised: the last :data:`MAX_CACHED_LABELS` distinct labels
are kept parsed (a least-recently-used cache keyed by the string), so the
reward's hot path parses each sample once however many completions share it.
"""

from __future__ import annotations

import base64
import functools
import json
import math

import numpy as np

from sphyr_jax.problem.grids import grid_to_text

LABEL_VERSION = 1
"""The label format's version, written under the key ``"sphyr"``."""
MAX_CACHED_LABELS = 8192
"""Distinct labels kept parsed (least recently used dropped first)."""
_PREFIX = '{"sphyr":'
_FIELDS = ("input_grid", "ground_truth", "gravity_dir", "subject", "optimum")


class LabelError(ValueError):
    """A string that is not a label this version of sphyr_jax can read (says why)."""


def _text(grid) -> str | None:
    if grid is None:
        return None
    return grid if isinstance(grid, str) else grid_to_text(grid)


def _packed_optimum(field: dict) -> dict:
    densities = np.asarray(field["densities"], dtype="<f8")
    packed = {k: v for k, v in field.items() if k != "densities"}
    packed["densities_f64"] = base64.b64encode(densities.tobytes()).decode("ascii")
    packed["shape"] = list(densities.shape)
    return packed


def _unpacked_optimum(packed) -> dict:
    if not isinstance(packed, dict) or "densities_f64" not in packed:
        raise LabelError("the label's optimum has no densities_f64")
    field = {k: v for k, v in packed.items() if k not in ("densities_f64", "shape")}
    try:
        raw = base64.b64decode(packed["densities_f64"], validate=True)
        shape = tuple(int(n) for n in packed["shape"])
        field["densities"] = np.frombuffer(raw, dtype="<f8").reshape(shape).tolist()
    except (TypeError, ValueError, KeyError) as exc:
        raise LabelError(f"the label's optimum densities are unreadable: {exc}") from exc
    return field


def problem_label(record: dict, *, subject: str | None = None) -> str:
    """The label of a sample: its problem as one self-contained string.

    Args:
        record: a dataset record or prompt-dataset row: ``ground_truth``
            (text or token lists), optional ``input_grid``, ``gravity_dir``
            (default down), ``subject`` and ``optimum`` (a stored optimum).
        subject: the subject, when the record does not name it.

    Returns:
        Compact JSON (see the module docstring); :func:`read_label` reads it back.

    Raises:
        LabelError: the record has no ground truth, or an optimum without densities.
    """
    answer = record.get("ground_truth")
    if answer is None:
        raise LabelError("a label needs the record's ground_truth")
    gravity = record.get("gravity_dir")
    out = {"sphyr": LABEL_VERSION, "input": _text(record.get("input_grid")),
           "answer": _text(answer),
           "gravity": [1.0, 0.0] if gravity is None else [float(v) for v in gravity],
           "subject": record.get("subject", subject)}
    optimum = record.get("optimum")
    if optimum is not None:
        try:
            out["optimum"] = _packed_optimum(optimum)
        except (KeyError, TypeError, ValueError) as exc:
            raise LabelError(f"the record's optimum cannot be packed: {exc}") from exc
    return json.dumps(out, separators=(",", ":"), allow_nan=False)


def is_label(value) -> bool:
    """Whether a value looks like a label (a cheap prefix test; :func:`read_label` checks)."""
    return isinstance(value, str) and value.startswith(_PREFIX)


@functools.lru_cache(maxsize=MAX_CACHED_LABELS)
def _parsed(label: str) -> tuple:
    try:
        obj = json.loads(label)
    except (TypeError, ValueError) as exc:
        raise LabelError(f"not a sphyr_jax label (not JSON: {exc})") from None
    if not isinstance(obj, dict) or "sphyr" not in obj:
        raise LabelError("not a sphyr_jax label (no \"sphyr\" version tag)")
    if obj["sphyr"] != LABEL_VERSION:
        raise LabelError(f"label version {obj['sphyr']!r}; this sphyr_jax reads version "
                         f"{LABEL_VERSION}")
    answer, masked = obj.get("answer"), obj.get("input")
    if not isinstance(answer, str) or not (masked is None or isinstance(masked, str)):
        raise LabelError("a label's answer and input are grid text")
    gravity = obj.get("gravity")
    if not isinstance(gravity, list) or len(gravity) not in (2, 3) or not all(
            isinstance(v, (int, float)) and math.isfinite(v) for v in gravity):
        raise LabelError(f"a label's gravity is 2 or 3 finite numbers, got {gravity!r}")
    subject = obj.get("subject")
    optimum = obj.get("optimum")
    return (masked, answer, tuple(float(v) for v in gravity),
            subject if isinstance(subject, str) else None,
            None if optimum is None else _unpacked_optimum(optimum))


def read_label(label: str) -> dict:
    """The record fields of a label: ``input_grid``, ``ground_truth`` (text),
    ``gravity_dir`` (a tuple), ``subject`` and ``optimum`` (None when absent).

    Parsed labels are memoised (see the module docstring): the returned dict
    is new on every call, its values shared (do not modify them).

    Raises:
        LabelError: the string is not a label of this version.
    """
    if not isinstance(label, str):
        raise LabelError(f"a label is a string, got {type(label).__name__}")
    return dict(zip(_FIELDS, _parsed(label), strict=True))
