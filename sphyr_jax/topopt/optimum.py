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
    """Content hash of everything an optimum depends on (one sample), the
    yardstick included (``options.key()`` names it; default: ``reference``)."""
    options = yardstick_options("reference" if options is None else options)
    h = hashlib.sha256()
    h.update(json.dumps(options.key(), sort_keys=True).encode())
    h.update(repr(load_case.shape).encode())
    for name in ("load_mask", "support_mask", "design_mask"):
        h.update(np.asarray(getattr(load_case, name), bool).tobytes())
    h.update(np.round(np.asarray(load_case.pinned, np.float64), 9).tobytes())
    h.update(np.round(np.asarray(load_case.gravity, np.float64), 12).tobytes())
    h.update(np.round(np.asarray(load_case.volume_fraction, np.float64), 12).tobytes())
    if seed is not None:
        h.update(np.round(np.asarray(seed, np.float64), 9).tobytes())
    return h.hexdigest()


class OptimumCache:
    """Optima keyed by :func:`optimum_key`, in memory and optionally on disk.

    One cache serves one yardstick: ``yardstick`` (``"reference"``, the default,
    or ``"strong"``) or explicit ``options`` of either (they win); the keys
    include the yardstick, so both can share a directory.  With a directory
    every optimum is also stored as ``<key>.json`` (written atomically), so
    re-runs and other processes reuse it.  An unreadable cache file is reported
    in ``corrupt`` and left exactly as found (never deleted or overwritten);
    its optimum is recomputed and kept in memory.
    """

    def __init__(self, directory: str | os.PathLike | None = None, options=None,
                 max_batch: int = 64, yardstick: str = "reference",
                 num_devices: int | None = None):
        self.options = yardstick_options(yardstick if options is None else options,
                                         num_devices=num_devices)
        self.yardstick = yardstick_name(self.options)
        self.max_batch = max(1, int(max_batch))  # samples optimised per batch (memory)
        self.directory = pathlib.Path(directory) if directory else None
        self._memory: dict[str, dict] = {}
        self.hits = 0
        self.misses = 0
        self.computed = 0
        self.corrupt: list[str] = []
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def _load(self, key: str) -> dict | None:
        if key in self._memory:
            return self._memory[key]
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
        self._memory[key] = entry
        return entry

    def put(self, case: LoadCase, seed, result: OptimumResult) -> None:
        """Store the optimum ``result`` (one sample) of ``case`` and ``seed``."""
        self._store(optimum_key(case, seed, options=grid_options(self.options, case.ndim)),
                    _entry(result))

    def _store(self, key: str, entry: dict) -> dict:
        self._memory[key] = entry
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

    def get_many(self, cases: Sequence[LoadCase], seeds=None, progress=None) -> OptimumResult:
        """Optima of many samples; computes the missing ones in one batch."""
        keys = [optimum_key(c, None if seeds is None else seeds[i],
                            options=grid_options(self.options, c.ndim))
                for i, c in enumerate(cases)]
        entries: dict[str, dict] = {}
        missing: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in entries or key in missing:
                self.hits += 1
                continue
            found = self._load(key)
            if found is None:
                missing[key] = i
                self.misses += 1
            else:
                entries[key] = found
                self.hits += 1
        pending = list(missing.items())
        # Even batches of at most max_batch samples (bounds memory: ~3 GB peak
        # at 50 full-mask samples on CPU).
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
        got = [entries[k] for k in keys]
        return OptimumResult(
            densities=np.stack([e["densities"] for e in got]),
            compliance=np.array([e["compliance"] for e in got]),
            volume_fraction=np.array([e["densities"].mean() for e in got]),
            iterations=np.array([e["iterations"] for e in got]),
            converged=np.array([e["converged"] for e in got]),
        )

    def get(self, case: LoadCase, seed=None) -> OptimumResult:
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


def cache_for(cache: OptimumCache | None, yardstick=None,
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


def _entry(result: OptimumResult) -> dict:
    """A cache entry from the optimum of one sample."""
    return {
        "densities": np.asarray(result.densities, np.float64),
        "compliance": float(result.compliance),
        "iterations": int(result.iterations),
        "converged": bool(result.converged),
    }
