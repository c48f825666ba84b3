"""A trained density network as a model backend (``--model=checkpoint:DIR``).

The network written by ``python -m sphyr_jax train`` (``model.eqx`` +
``model.json``, :func:`~sphyr_jax.training.model.save_checkpoint`), or a
built-in one (``checkpoint:physics``, shipped in the package), answers a
:class:`~sphyr_jax.evaluation.backends.Query` from its masked grid, subject
format and load direction, not from the prompt's text: the features are the
ones it was trained on (:func:`~sphyr_jax.training.problems.grid_features`),
and the completion keeps every known token and fills the ``V`` cells in the
subject's format (:func:`~sphyr_jax.training.evaluation.complete_grid`).
Unlike a language model shown the published prompt, it is told the load
direction (rotated runs turn it with the grid).

This module sits in the training layer because it needs the network; the
evaluation layer names it in its backend registry
(:data:`sphyr_jax.evaluation.backends.BACKEND_KINDS`) and imports it only when
a checkpoint is asked for, so imports still only go down.

float64 must be on (``sphyr_jax.enable_x64()``) before a checkpoint is loaded.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading

from sphyr_jax.errors import UserInputError
from sphyr_jax.evaluation.backends import Backend, Query
from sphyr_jax.problem.grids import grid_to_text
from sphyr_jax.training.evaluation import complete_grid
from sphyr_jax.training.model import (
    CONFIG_FILE,
    PRETRAINED,
    WEIGHTS_FILE,
    load_checkpoint,
    pretrained_dir,
)


class CheckpointBackend(Backend):
    """Completions by a trained :class:`~sphyr_jax.training.model.DensityNet`.

    Args:
        directory: the checkpoint folder, or the name of a built-in checkpoint
            (:data:`~sphyr_jax.training.model.PRETRAINED`, e.g. ``physics``)
            when no folder of that name exists.
        name: model name for the records (default ``checkpoint:<directory>``).
    """

    def __init__(self, directory, name: str | None = None):
        if str(directory) in PRETRAINED and not pathlib.Path(directory).is_dir():
            directory = pretrained_dir(str(directory))
        directory = pathlib.Path(directory)
        missing = [f for f in (WEIGHTS_FILE, CONFIG_FILE) if not (directory / f).is_file()]
        if missing:
            raise UserInputError(f"{directory}: not a checkpoint (missing {', '.join(missing)})")
        self.directory = directory
        self.name = name or f"checkpoint:{directory}"
        self.model = load_checkpoint(directory)
        self._lock = threading.Lock()

    def fill(self, query: Query) -> list:
        """The completed grid (token rows): one forward pass."""
        with self._lock:  # one forward pass at a time; each compiles once per grid shape
            return complete_grid(self.model, query.grid(), hard=query.hard,
                                 gravity_dir=query.gravity_dir)

    async def complete(self, query: Query) -> str:
        return grid_to_text(await asyncio.to_thread(self.fill, query))


def checkpoint_backend(directory: str, **_) -> CheckpointBackend:
    """``checkpoint:DIR`` (the factory named in the evaluation layer's registry)."""
    return CheckpointBackend(directory, name=f"checkpoint:{directory}")
