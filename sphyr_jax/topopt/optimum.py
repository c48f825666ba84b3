"""Optima of masked regions by yardstick name, and their cache.

The entry points a scorer calls: :func:`optimum_batch` (and :func:`optimum`
for one sample) take ``yardstick="reference"`` (the published recipe,
:mod:`sphyr_jax.topopt.yardstick`) or ``"strong"`` (the harder search,
:mod:`sphyr_jax.topopt.strong`), or a settings object of either
(:mod:`sphyr_jax.topopt.options`), pick the settings for the grid's dimension
once (:func:`~sphyr_jax.topopt.options.grid_options`) and return an
:class:`~sphyr_jax.topopt.result.OptimumResult` either way.
:class:`OptimumCache` keeps optima in memory and on disk, keyed by the sample
and every setting of its yardstick (:func:`optimum_key`).
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import pathlib
from collections.abc import Sequence

import jax
import numpy as np

from sphyr_jax.fem.array_types import Densities
from sphyr_jax.io import CorruptFileError, atomic_write_json, read_json
from sphyr_jax.problem.loadcase import LoadCase, stack_load_cases
from sphyr_jax.topopt import strong
from sphyr_jax.topopt import yardstick as _yardstick
from sphyr_jax.topopt.options import (
    Options,
    Progress,
    ReferenceOptions,
    Yardstick,
    grid_options,
    yardstick_name,
    yardstick_options,
)
from sphyr_jax.topopt.result import OptimumResult


def optimum_batch(load_case: LoadCase, seeds: Densities | None = None, *,
                  yardstick: Yardstick = "reference",
                  progress: Progress | None = None) -> OptimumResult:
    """Optima of many samples with either yardstick.

    Args:
        load_case: batched load cases (leading axis B).
        seeds: optional (B, *cells) seed designs (default: the answers).
        yardstick: ``"reference"`` (the published recipe, default),
            ``"strong"`` or a settings object of either.
        progress: optional callable(stage, done, total).

    Returns:
        An :class:`~sphyr_jax.topopt.result.OptimumResult` (NumPy arrays).
    """
    options = grid_options(yardstick_options(yardstick), load_case.ndim)
    if isinstance(options, ReferenceOptions):
        return _yardstick.reference_optimum_batch(load_case, seeds, options=options,
                                                  progress=progress)
    return strong.strong_optimum_batch(load_case, seeds, options=options, progress=progress)


def optimum(load_case: LoadCase, seed: Densities | None = None, *,
            yardstick: Yardstick = "reference") -> OptimumResult:
    """The optimum of one sample (see :func:`optimum_batch`).

    Returns:
        An :class:`~sphyr_jax.topopt.result.OptimumResult` of scalars and a
        single design.
    """
    batch = stack_load_cases([load_case])
    seeds = None if seed is None else np.asarray(seed)[None]
    res = optimum_batch(batch, seeds, yardstick=yardstick)
    return jax.tree.map(lambda a: a[0], res)


# ----------------------------------------------------------------------------
# Cache.


def optimum_key(load_case: LoadCase, seed: Densities | None = None, *,
                options: Yardstick | None = None) -> str:
    """Content hash of everything an optimum depends on (one sample).

    The problem (masks, pinned densities, direction, budget), the seed design
    and every setting of the yardstick, its name and recipe version included
    (``options.key()``; default: ``reference``), so a changed recipe gives
    new keys and never reuses an optimum of the old one.
    """
    options = yardstick_options("reference" if options is None else options)
    return _key(_settings_text(options), load_case, seed)


def _settings_text(options: Options) -> bytes:
    """What a key says of the yardstick: its name, recipe version and every setting."""
    return json.dumps(options.key(), sort_keys=True).encode()


def _key(settings: bytes, load_case: LoadCase, seed) -> str:
    h = hashlib.sha256()
    h.update(settings)
    h.update(repr(load_case.shape).encode())
    for name in ("load_mask", "support_mask", "design_mask"):
        h.update(np.asarray(getattr(load_case, name), bool).tobytes())
    h.update(np.round(np.asarray(load_case.pinned, np.float64), 9).tobytes())
    h.update(np.round(np.asarray(load_case.gravity, np.float64), 12).tobytes())
    h.update(np.round(np.asarray(load_case.volume_fraction, np.float64), 12).tobytes())
    if seed is not None:
        h.update(np.round(np.asarray(seed, np.float64), 9).tobytes())
    return h.hexdigest()


def stored_optimum(load_case: LoadCase, seed, result: OptimumResult,
                   yardstick: Yardstick | Options = "reference") -> dict:
    """The ``optimum`` field a record carries: one sample's optimum with its key.

    A scorer trusts the field only when ``key`` equals the key it would look
    the sample up under (:func:`read_stored_optimum`): the same problem, the
    same seed (the dataset answer's densities) and the same yardstick and
    recipe version.  An edited answer or another yardstick gives another key,
    and the optimum is computed again.

    Args:
        load_case: the sample (one, unbatched).
        seed: its seed design, the dataset answer's densities (L/S solid).
        result: its optimum (:func:`optimum`, or one row of a batch).
        yardstick: the yardstick that produced ``result``.

    Returns:
        ``{"yardstick", "key", "compliance", "densities", "iterations",
        "converged"}``, JSON-ready (a non-finite compliance is None).
    """
    options = grid_options(yardstick_options(yardstick), load_case.ndim)
    entry = _entry(result)
    c = entry["compliance"]
    return {"yardstick": yardstick_name(options),
            "key": optimum_key(load_case, seed, options=options),
            "compliance": c if math.isfinite(c) else None,
            "densities": entry["densities"].tolist(),
            "iterations": entry["iterations"],
            "converged": entry["converged"]}


def read_stored_optimum(field, load_case: LoadCase, seed,
                        yardstick: Yardstick | Options = "reference") -> OptimumResult | None:
    """The optimum an ``optimum`` field holds, if it is this sample's under this yardstick.

    Args:
        field: a record's ``optimum`` (:func:`stored_optimum`), or None.
        load_case: the sample.
        seed: its seed design (the dataset answer's densities).
        yardstick: the yardstick the scorer uses.

    Returns:
        The optimum (one sample), or None when the field is missing, malformed
        or its key is not the sample's key under ``yardstick`` (a stale or
        foreign optimum is never used).
    """
    options = grid_options(yardstick_options(yardstick), load_case.ndim)
    entry = _stored_entry(field, optimum_key(load_case, seed, options=options), load_case.shape)
    return None if entry is None else _result([entry])


def _stored_entry(field, key: str, shape: tuple) -> dict | None:
    """A cache entry from a record's ``optimum`` field if its key is ``key`` (else None)."""
    if not isinstance(field, dict) or field.get("key") != key:
        return None
    try:
        densities = np.asarray(field["densities"], np.float64)
        c = field["compliance"]
        entry = {"densities": densities,
                 "compliance": math.inf if c is None else float(c),
                 "iterations": int(field["iterations"]),
                 "converged": bool(field["converged"])}
    except (KeyError, TypeError, ValueError):
        return None
    return entry if densities.shape == tuple(shape) else None


DEFAULT_MAX_MEMORY_ENTRIES = 10_000
"""Optima an :class:`OptimumCache` keeps in memory by default (least recently
used dropped first; a 20x20 optimum takes a few kilobytes)."""


class OptimumCache:
    """Optima keyed by :func:`optimum_key`, in memory and optionally on disk.

    One cache serves one yardstick: ``yardstick`` (``"reference"``, the default,
    or ``"strong"``) or explicit ``options`` of either (they win); the keys
    include the yardstick, so both can share a directory.  With a directory
    every optimum is also stored as ``<key>.json`` (written atomically), so
    re-runs and other processes reuse it.  An unreadable cache file is reported
    in ``corrupt`` and left exactly as found (never deleted or overwritten);
    its optimum is recomputed and kept in memory.

    Memory is bounded: at most ``max_memory_entries`` optima stay in memory,
    the least recently used dropped first (a long run over many distinct
    samples keeps a flat footprint); files on disk are never dropped, and a
    dropped optimum is read back from its file when asked for again.

    Attributes:
        hits, misses, computed: optima found (memory, disk or a record's stored
            optimum), not found, and computed, since the cache was made.
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, options=None,
                 max_batch: int = 64, yardstick: Yardstick = "reference",
                 num_devices: int | None = None,
                 max_memory_entries: int | None = DEFAULT_MAX_MEMORY_ENTRIES):
        """Args:
            directory: folder of ``<key>.json`` files (None: memory only).
            options: yardstick settings (win over ``yardstick``).
            max_batch: samples optimised per batch (bounds the optimiser's memory).
            yardstick: ``"reference"`` or ``"strong"``.
            num_devices: devices batches are split over (None: all local).
            max_memory_entries: optima kept in memory (None: no bound).
        """
        self.options = yardstick_options(yardstick if options is None else options,
                                         num_devices=num_devices)
        self.yardstick = yardstick_name(self.options)
        self.max_batch = max(1, int(max_batch))
        if max_memory_entries is not None and int(max_memory_entries) < 1:
            raise ValueError(f"max_memory_entries must be >= 1 or None, got {max_memory_entries}")
        self.max_memory_entries = None if max_memory_entries is None else int(max_memory_entries)
        self.directory = pathlib.Path(directory) if directory else None
        self._memory: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._settings: dict[int, bytes] = {}  # per grid dimension
        self.hits = 0
        self.misses = 0
        self.computed = 0
        self.corrupt: list[str] = []
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def memory_entries(self) -> int:
        """Optima held in memory now (at most ``max_memory_entries``)."""
        return len(self._memory)

    def key(self, case: LoadCase, seed=None) -> str:
        """The key this cache files the optimum of ``case`` and ``seed`` under
        (:func:`optimum_key` with the cache's settings for the grid's dimension)."""
        ndim = case.ndim
        settings = self._settings.get(ndim)
        if settings is None:
            settings = self._settings[ndim] = _settings_text(grid_options(self.options, ndim))
        return _key(settings, case, seed)

    def _remember(self, key: str, entry: dict) -> dict:
        memory = self._memory
        memory[key] = entry
        memory.move_to_end(key)
        if self.max_memory_entries is not None:
            while len(memory) > self.max_memory_entries:
                memory.popitem(last=False)
        return entry

    def _load(self, key: str) -> dict | None:
        found = self._memory.get(key)
        if found is not None:
            self._memory.move_to_end(key)
            return found
        if self.directory is None:
            return None
        path = self.directory / f"{key}.json"
        if not path.exists():
            return None
        try:
            entry = read_json(path)
            entry = {
                "densities": np.asarray(entry["densities"], np.float64),
                "compliance": float("inf") if entry["compliance"] is None
                else float(entry["compliance"]),
                "iterations": int(entry["iterations"]),
                "converged": bool(entry["converged"]),
            }
        except (CorruptFileError, KeyError, TypeError, ValueError):
            self.corrupt.append(str(path))
            return None
        return self._remember(key, entry)

    def put(self, case: LoadCase, seed, result: OptimumResult) -> None:
        """Store the optimum ``result`` (one sample) of ``case`` and ``seed``."""
        self._store(self.key(case, seed), _entry(result))

    def _store(self, key: str, entry: dict) -> dict:
        self._remember(key, entry)
        path = None if self.directory is None else self.directory / f"{key}.json"
        if path is not None and str(path) not in self.corrupt:  # corrupt files stay as found
            c = entry["compliance"]
            atomic_write_json(path, {
                "densities": entry["densities"].tolist(),
                "compliance": c if np.isfinite(c) else None,
                "iterations": entry["iterations"],
                "converged": entry["converged"],
            })
        return entry

    def get_many(self, cases: Sequence[LoadCase], seeds=None, *, progress=None,
                 stored: Sequence | None = None) -> OptimumResult:
        """Optima of many samples; computes the missing ones in one batch.

        Args:
            cases: the samples (unbatched load cases).
            seeds: their seed designs (None: the optimiser's default).
            progress: optional callable(stage, done, total).
            stored: optional ``optimum`` fields of the samples' records
                (:func:`stored_optimum`), None where a sample has none; a field
                whose key is the sample's key here is used (kept in memory,
                not written to disk), any other is ignored.

        Returns:
            An :class:`~sphyr_jax.topopt.result.OptimumResult`, one row per case.
        """
        keys = [self.key(c, None if seeds is None else seeds[i]) for i, c in enumerate(cases)]
        entries: dict[str, dict] = {}
        missing: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in entries or key in missing:
                self.hits += 1
                continue
            found = self._load(key)
            if found is None and stored is not None:
                found = _stored_entry(stored[i], key, cases[i].shape)
                if found is not None:
                    self._remember(key, found)
            if found is None:
                missing[key] = i
                self.misses += 1
            else:
                entries[key] = found
                self.hits += 1
        pending = list(missing.items())
        # Even batches of at most max_batch samples (the optimiser's memory
        # grows with the batch).
        step = max(1, math.ceil(len(pending) / max(1, math.ceil(len(pending) / self.max_batch))))
        if progress is not None and pending:
            progress("optima", 0, len(pending))
        for lo in range(0, len(pending), step):
            part = pending[lo: lo + step]
            idx = [i for _, i in part]
            batch = stack_load_cases([cases[i] for i in idx])
            sd = None if seeds is None else np.stack([np.asarray(seeds[i]) for i in idx])
            res = optimum_batch(batch, sd, yardstick=self.options,
                                progress=_within(progress, lo, len(pending)))
            self.computed += len(idx)
            if progress is not None:
                progress("optima", lo + len(part), len(pending))
            for j, (key, _) in enumerate(part):
                entries[key] = self._store(key, _entry(jax.tree.map(lambda a, j=j: a[j], res)))
        return _result([entries[k] for k in keys])

    def get(self, case: LoadCase, seed=None) -> OptimumResult:
        """The optimum of one sample (see :meth:`get_many`)."""
        res = self.get_many([case], None if seed is None else [seed])
        return jax.tree.map(lambda a: a[0], res)


def _within(progress, offset: int, total: int):
    """The optimiser's own "optima" count as part of the cache's count (one stage, not two)."""
    if progress is None:
        return None

    def report(stage: str, done: int, part_total: int) -> None:
        if stage == "optima":
            progress(stage, offset + done, total)
        else:
            progress(stage, done, part_total)

    return report


def cache_for(cache: OptimumCache | None, yardstick: Yardstick | None = None,
              num_devices: int | None = None) -> OptimumCache:
    """The given cache, checked against ``yardstick``, or a fresh one for it.

    Args:
        cache: an optimum cache or None.
        yardstick: ``"reference"``, ``"strong"``, a settings object, or None
            (the cache's yardstick, else ``"reference"``).
        num_devices: devices a fresh cache's batches are split over.

    Raises:
        ValueError: ``yardstick`` is unknown or differs from the cache's.
    """
    if cache is None:
        return OptimumCache(yardstick=yardstick or "reference", num_devices=num_devices)
    if yardstick is not None and yardstick_name(yardstick_options(yardstick)) != cache.yardstick:
        raise ValueError(f"yardstick {yardstick!r} asked for, but the cache holds "
                         f"{cache.yardstick!r} optima")
    return cache


def _entry(result: OptimumResult) -> dict:
    """A cache entry from the optimum of one sample."""
    return {
        "densities": np.asarray(result.densities, np.float64),
        "compliance": float(result.compliance),
        "iterations": int(result.iterations),
        "converged": bool(result.converged),
    }


def _result(entries: Sequence[dict]) -> OptimumResult:
    """Cache entries as one batch-first :class:`OptimumResult`."""
    return OptimumResult(
        densities=np.stack([e["densities"] for e in entries]),
        compliance=np.array([e["compliance"] for e in entries]),
        volume_fraction=np.array([e["densities"].mean() for e in entries]),
        iterations=np.array([e["iterations"] for e in entries]),
        converged=np.array([e["converged"] for e in entries]),
    )
