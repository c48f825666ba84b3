"""SPhyR subjects and dataset loading (local files, local Hugging Face folders, the hub).

Conventions: a *subject* is ``<variant>_<easy|hard>`` (16 of them, see
:func:`list_subjects`).  A record is ``{"index": int, "input_grid": grid,
"ground_truth": grid}`` plus an optional ``"gravity_dir": [row, col]``; the
loader always returns grids as lists of token rows (strings), whatever the
source stored (token lists in ``.jsonl`` files, newline/space text in ``.json``
files and on the hub).  Row 0 is the first printed row (the top).

Sources understood by :func:`load_subject`:

* a local folder holding ``<subject>.jsonl`` or ``<subject>.json`` (a JSON list
  of records, or JSON lines), as written by :func:`sphyr_jax.data.convert.convert_raw_dir`;
* a local Hugging Face dataset: ``<folder>/<subject>`` saved with
  ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a folder saved with
  ``DatasetDict.save_to_disk`` whose splits are named after subjects, or a
  folder of data files (``<subject>.parquet`` / ``.arrow``, or ``<subject>/``
  holding ``*.parquet``, ``*.arrow``, ``*.json``, ``*.jsonl``);
* a single data file (``.jsonl`` / ``.json``) whatever the subject name;
* the hub: ``"philippds/SPhyR"`` or an explicit ``"hf://owner/name"``, loaded
  with ``datasets.load_dataset(repo, subject, split=...)`` — the published
  copy has one configuration per subject and a single ``test`` split.

Local sources never touch the network; any other string that is not an
existing path is an error rather than a hub look-up.  The Hugging Face
``datasets`` library is imported only when a source needs it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import tempfile
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from sphyr_jax.errors import UserInputError
from sphyr_jax.io import CorruptFileError, read_json, read_jsonl_numbered
from sphyr_jax.problem.grids import InvalidProblemError, as_grid, check_rectangular, grid_ndim
from sphyr_jax.problem.loadcase import check_gravity

VARIANTS = (
    "1_random_cell",
    "5_random_cell",
    "10_random_cell",
    "1_random_row",
    "3_random_row",
    "1_random_column",
    "3_random_column",
    "full",
)
DIFFICULTIES = ("easy", "hard")
SUBJECT_SUFFIX_3D = "_3d"
HUB_ID = "philippds/SPhyR"
HUB_SPLIT = "test"
EMBEDDED_ROOT = pathlib.Path(__file__).resolve().parent / "sets"
"""Where the embedded sets live: package data, in a checkout and in an installed wheel alike."""
EMBEDDED_SETS = (
    "dataset",
    "dataset_1_rotations",
    "dataset_2_rotations",
    "dataset_3_rotations",
    "dataset_3d",
    "dataset_v2",
    "dataset_v2_20",
)
"""The embedded sets, by name (see :func:`embedded`)."""
DATASET_FOLDERS = {"v1": "dataset", "v2": "dataset_v2", "v2-20": "dataset_v2_20"}
"""The embedded set of each dataset version (a name of :data:`EMBEDDED_SETS`)."""
DATASET_VERSIONS = tuple(DATASET_FOLDERS)

_HUB_PREFIXES = ("hf://", "hub://", "hf:")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_TABLE_SUFFIXES = (".parquet", ".arrow")
_TEXT_SUFFIXES = (".jsonl", ".json")


class DatasetError(UserInputError):
    """A subject that cannot be found or whose records are malformed."""


def list_subjects(dim: int = 2) -> list[str]:
    """The 16 SPhyR subjects, variant by variant, ``easy`` before ``hard``.

    ``dim=3`` gives the 16 voxel subjects, the same names with a ``_3d``
    suffix (``full_easy_3d``, ...).
    """
    if dim not in (2, 3):
        raise ValueError(f"dim must be 2 or 3, got {dim!r}")
    suffix = SUBJECT_SUFFIX_3D if dim == 3 else ""
    return [f"{variant}_{level}{suffix}" for variant in VARIANTS for level in DIFFICULTIES]


def embedded(name: str = "dataset") -> str:
    """The folder of an embedded set, for :func:`load_subject` and every ``dataset_dir``.

    The sets ship inside the package (``sphyr_jax/data/sets/<name>``), so they
    are found wherever sphyr_jax is installed and whatever the working folder:

    * ``dataset``: 20 generated 10x10 samples x the 16 SPhyR subjects (v1 style,
      loads pointing down);
    * ``dataset_1_rotations``, ``dataset_2_rotations``, ``dataset_3_rotations``:
      the same samples turned with their load direction (left, up, right);
    * ``dataset_3d``: 6 voxel samples x the 16 ``_3d`` subjects;
    * ``dataset_v2``, ``dataset_v2_20``: the SPhyR-v2 sets, 100 samples each,
      10x10 and 20x20.

    Args:
        name: one of :data:`EMBEDDED_SETS`.

    Returns:
        The folder's path.

    Raises:
        DatasetError: an unknown name, or a set missing from this installation.

    Examples:
        >>> from sphyr_jax.data import embedded, load_subject
        >>> records = load_subject(embedded("dataset_v2"), "full_easy")
        >>> len(records), sorted(records[0])
        (100, ['gravity_dir', 'ground_truth', 'index', 'input_grid'])
    """
    if name not in EMBEDDED_SETS:
        raise DatasetError(f"no embedded set {name!r}; sets: {', '.join(EMBEDDED_SETS)}")
    folder = EMBEDDED_ROOT / name
    if not folder.is_dir():
        raise DatasetError(f"the embedded set {name!r} is missing from this installation "
                           f"({folder}); reinstall sphyr-jax")
    return str(folder)


def dataset_source(version: str = "v1", dim: int = 2) -> str:
    """The embedded set of a dataset version: ``v1``, ``v2`` (10x10) or ``v2-20`` (20x20).

    ``v1`` is the ``dataset`` set (``dataset_3d`` for ``dim=3``), ``v2`` is
    ``dataset_v2`` and ``v2-20`` is ``dataset_v2_20`` (see :func:`embedded`).

    Args:
        version: one of :data:`DATASET_VERSIONS`.
        dim: 2, or 3 for the voxel set (v1 only).

    Returns:
        The folder, for :func:`load_subject`.

    Raises:
        DatasetError: an unknown version, or a voxel set of a v2 version.
    """
    if version not in DATASET_FOLDERS:
        raise DatasetError(f"unknown dataset version {version!r}; versions: "
                           f"{', '.join(DATASET_VERSIONS)}")
    name = DATASET_FOLDERS[version]
    if dim == 3:
        if version != "v1":
            raise DatasetError(f"there is no voxel set of dataset version {version!r}")
        name += SUBJECT_SUFFIX_3D
    return embedded(name)


def subject_ndim(subject: str) -> int:
    """3 for a ``*_3d`` subject name, else 2."""
    return 3 if isinstance(subject, str) and subject.endswith(SUBJECT_SUFFIX_3D) else 2


def is_hard(subject: str) -> bool:
    """Whether a subject uses one-decimal densities (``*_hard``) rather than 0/1.

    Raises:
        DatasetError: if the name does not end in ``_easy`` or ``_hard``.
    """
    if isinstance(subject, str):
        if subject.endswith(SUBJECT_SUFFIX_3D):
            subject = subject[: -len(SUBJECT_SUFFIX_3D)]
        if subject.endswith("_hard"):
            return True
        if subject.endswith("_easy"):
            return False
    raise DatasetError(
        f"not a subject name (expected <variant>_easy|_hard[_3d]): {subject!r}")


def subject_rng(seed: int, subject: str) -> np.random.Generator:
    """The random stream of one subject: NumPy's generator seeded with ``[seed, crc32(subject)]``.

    It depends on the seed and the subject's name alone, so a subject's draws
    (the v2 masks, the ``random`` baseline's fills) do not change when other
    subjects are added, dropped or reordered.
    """
    return np.random.default_rng([int(seed), zlib.crc32(subject.encode("utf-8"))])


def _gravity(value, where: str, ndim: int = 2) -> list:
    try:
        checked = check_gravity(value, ndim=ndim)
    except InvalidProblemError as exc:
        raise DatasetError(f"{where}: {exc}") from exc
    return [int(v) if v.is_integer() else v for v in checked]


def normalise_record(record: Any, where: str, position: int = 0,
                     ndim: int | None = None) -> dict:
    """Validate one record and bring its grids to token lists.

    Args:
        record: a mapping with ``input_grid`` and ``ground_truth`` (text or
            token lists) and usually ``index``.
        where: file/line description used in error messages.
        position: fallback ``index`` when the record has none.
        ndim: 2 or 3 (3D grids: layers of rows; in text, layers separated by
            a blank line); None reads nested lists three deep as 3D and
            anything else as 2D.

    Returns:
        ``{"index", "input_grid", "ground_truth"}`` plus ``"gravity_dir"`` when
        the record carries a non-null one; other keys are dropped.

    Raises:
        DatasetError: for a non-mapping, a missing or unreadable grid, ragged
            grids, grids of different shapes, a non-integer index or a
            malformed gravity direction.
    """
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    out: dict[str, Any] = {}
    index = record.get("index", position)
    if isinstance(index, bool) or not isinstance(index, int):
        if isinstance(index, float) and index.is_integer():
            index = int(index)
        elif isinstance(index, str) and index.strip().lstrip("-").isdigit():
            index = int(index)
        else:
            raise DatasetError(f"{where}: index must be an integer, got {index!r}")
    out["index"] = index
    shapes = []
    if ndim is None and record.get("ground_truth") is not None:
        ndim = grid_ndim(record["ground_truth"])
    for key in ("input_grid", "ground_truth"):
        if record.get(key) is None:
            raise DatasetError(f"{where}: record has no {key!r}")
        try:
            grid = as_grid(record[key], ndim=ndim)
            shapes.append(check_rectangular(grid, what=key))
        except InvalidProblemError as exc:
            raise DatasetError(f"{where}: bad {key}: {exc}") from exc
        out[key] = grid
    if shapes[0] != shapes[1]:
        raise DatasetError(
            f"{where}: input_grid is {'x'.join(map(str, shapes[0]))} but ground_truth is "
            f"{'x'.join(map(str, shapes[1]))}"
        )
    if record.get("gravity_dir") is not None:
        out["gravity_dir"] = _gravity(record["gravity_dir"], where, len(shapes[1]))
    return out


def _normalise_all(rows: Iterable, where: str, per_line: bool, ndim=None) -> list[dict]:
    records = []
    for position, row in enumerate(rows):
        label = f"{where}, line {row[0]}" if per_line else f"{where}, record {position}"
        record = row[1] if per_line else row
        records.append(normalise_record(record, label, position, ndim))
    return records


def _jsonl_rows(path: pathlib.Path) -> list[tuple[int, Any]]:
    """(line number, value) pairs of a JSON-lines file."""
    try:
        return read_jsonl_numbered(path)
    except CorruptFileError as exc:
        raise DatasetError(str(exc)) from exc


def _load_text_file(path: pathlib.Path, ndim=None) -> list[dict]:
    """Records of a ``.jsonl`` file, or of a ``.json`` list / JSON-lines file."""
    if path.suffix == ".jsonl":
        return _normalise_all(_jsonl_rows(path), str(path), per_line=True, ndim=ndim)
    try:
        data = read_json(path)
    except CorruptFileError as exc:
        # A .json file may hold JSON lines: the first value parses, then "Extra data".
        cause = exc.__cause__
        if isinstance(cause, json.JSONDecodeError) and cause.msg == "Extra data":
            return _normalise_all(_jsonl_rows(path), str(path), per_line=True, ndim=ndim)
        raise DatasetError(str(exc)) from exc
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return _normalise_all(data, str(path), per_line=False, ndim=ndim)


def _hf():
    try:
        import datasets as hf_datasets
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DatasetError(
            "the Hugging Face `datasets` package is needed for this source: pip install datasets"
        ) from exc
    return hf_datasets


def _is_saved_dataset(folder: pathlib.Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _pick_split(dataset_dict, split: str | None, where: str):
    names = list(dataset_dict.keys())
    if split is not None:
        if split not in dataset_dict:
            raise DatasetError(f"{where}: no split {split!r} (available: {names})")
        return dataset_dict[split]
    if len(names) == 1:
        return dataset_dict[names[0]]
    for name in (HUB_SPLIT, "train"):
        if name in dataset_dict:
            return dataset_dict[name]
    raise DatasetError(f"{where}: several splits {names}; pass split=")


def _rows_of(dataset, where: str, ndim=None) -> list[dict]:
    return _normalise_all(dataset, where, per_line=False, ndim=ndim)


def _load_saved(folder: pathlib.Path, split: str | None, subject: str | None,
                ndim=None) -> list[dict]:
    """A ``save_to_disk`` folder; ``subject`` selects a split named after it."""
    hf = _hf()
    loaded = hf.load_from_disk(str(folder))
    if hasattr(loaded, "keys"):  # DatasetDict
        if subject is not None:
            if subject not in loaded:
                raise DatasetError(f"{folder}: no subject {subject!r} (splits: {list(loaded)})")
            loaded = loaded[subject]
        else:
            loaded = _pick_split(loaded, split, str(folder))
    return _rows_of(loaded, str(folder), ndim)


def _read_table(path: pathlib.Path, ndim=None) -> list[dict]:
    """Records of one parquet / arrow file, read through ``datasets``."""
    hf = _hf()
    try:
        if path.suffix == ".arrow":
            return _rows_of(hf.Dataset.from_file(str(path), in_memory=True), str(path), ndim)
        # A throw-away cache: nothing lands in the user's Hugging Face cache.
        with tempfile.TemporaryDirectory(prefix="sphyr_parquet_") as cache:
            dataset = hf.Dataset.from_parquet(str(path), keep_in_memory=True, cache_dir=cache)
            return _rows_of(dataset, str(path), ndim)
    except DatasetError:
        raise
    except Exception as exc:  # pyarrow / datasets raise many types for unreadable files
        raise DatasetError(f"{path}: cannot read data file: {exc}") from exc


def _load_data_files(files: list[pathlib.Path], ndim=None) -> list[dict]:
    """Records of several data files, in the given order."""
    records: list[dict] = []
    for path in files:
        records.extend(
            _load_text_file(path, ndim) if path.suffix in _TEXT_SUFFIXES
            else _read_table(path, ndim)
        )
    return records


def _data_files_in(folder: pathlib.Path, split: str | None) -> list[pathlib.Path]:
    files = sorted(
        f
        for f in folder.rglob("*")
        if f.is_file()
        and f.suffix in _TABLE_SUFFIXES + _TEXT_SUFFIXES
        and not f.name.startswith(".")
        and f.name not in ("dataset_info.json", "state.json", "dataset_dict.json")
    )
    if split is not None:
        files = [f for f in files if f.name.startswith(split)]
    return files


def _load_local(root: pathlib.Path, subject: str, split: str | None,
                ndim=None) -> list[dict]:
    if root.is_file():
        if root.suffix in _TEXT_SUFFIXES:
            return _load_text_file(root, ndim)
        if root.suffix in _TABLE_SUFFIXES:
            return _read_table(root, ndim)
        raise DatasetError(f"{root}: unsupported data file (want .jsonl/.json/.parquet/.arrow)")
    for suffix in _TEXT_SUFFIXES:
        candidate = root / f"{subject}{suffix}"
        if candidate.is_file():
            return _load_text_file(candidate, ndim)
    for suffix in _TABLE_SUFFIXES:
        candidate = root / f"{subject}{suffix}"
        if candidate.is_file():
            return _read_table(candidate, ndim)
    folder = root / subject
    if folder.is_dir():
        if _is_saved_dataset(folder):
            return _load_saved(folder, split, None, ndim)
        files = _data_files_in(folder, split)
        if files:
            return _load_data_files(files, ndim)
        raise DatasetError(f"{folder}: no data files for subject {subject!r}")
    if (root / "dataset_dict.json").is_file():
        return _load_saved(root, split, subject, ndim)
    raise DatasetError(
        f"subject {subject!r} not found in {root} (looked for {subject}.jsonl, {subject}.json, "
        f"{subject}.parquet, {subject}.arrow and a {subject}/ folder)"
    )


def _hub_repo(source: str) -> str | None:
    for prefix in _HUB_PREFIXES:
        if source.startswith(prefix):
            return source[len(prefix) :]
    return source if source == HUB_ID else None


def _load_hub(repo: str, subject: str, split: str | None, ndim=None) -> list[dict]:
    if not _REPO_ID.fullmatch(repo):
        raise DatasetError(f"not a Hugging Face dataset id: {repo!r}")
    hf = _hf()
    dataset = hf.load_dataset(repo, subject, split=split or HUB_SPLIT)
    if hasattr(dataset, "keys"):  # a DatasetDict despite split=
        dataset = _pick_split(dataset, None, f"{repo}/{subject}")
    return _rows_of(dataset, f"{repo} ({subject})", ndim)


def load_subject(
    source: str | os.PathLike,
    subject: str,
    split: str | None = None,
    limit: int | None = None,
) -> list[dict]:
    """Load the records of one subject, grids as token lists.

    Args:
        source: a local folder or data file, or a hub dataset
            (``"philippds/SPhyR"`` or ``"hf://owner/name"``); see the module
            docstring for the layouts understood.
        subject: e.g. ``"full_easy"`` (ignored when ``source`` is a single
            file, except that a ``*_3d`` name reads text grids as 3D: layers
            separated by blank lines).
        split: split to read from Hugging Face sources.  None means the only
            split, else ``"test"`` (the published copy's single split), else
            ``"train"``.  Plain ``.jsonl`` / ``.json`` files have no splits.
        limit: keep only the first ``limit`` records (None for all).

    Returns:
        Records ``{"index", "input_grid", "ground_truth"}`` (plus
        ``"gravity_dir"`` when present), in stored order.

    Raises:
        DatasetError: for a missing source, subject or split, or a malformed
            file or record (the message names the file and line or record).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    if not isinstance(subject, str) or not subject:
        raise DatasetError(f"subject must be a non-empty string, got {subject!r}")
    ndim = 3 if subject_ndim(subject) == 3 else None
    if isinstance(source, str) and not os.path.exists(source):
        repo = _hub_repo(source)
        if repo is None:
            raise DatasetError(
                f"no such local dataset: {source!r} (hub datasets are written "
                f"{HUB_ID!r} or 'hf://owner/name')"
            )
        records = _load_hub(repo, subject, split, ndim)
    else:
        root = pathlib.Path(source)
        if not root.exists():
            raise DatasetError(f"no such local dataset: {os.fspath(source)!r}")
        records = _load_local(root, subject, split, ndim)
    return records if limit is None else records[:limit]
